"""The soak's end checks that judge its own premise (tools/soak.py): a producer stalled past the
grace fails the run only where ebb then dropped readings as late, since only then can the loss
check no longer tell a rightful drop from a loss."""

from ebb.tools.soak import Settings, Verdict


def _verdict(lateness: list[float], late_events: int) -> Verdict:
    v = Verdict.__new__(Verdict)  # the check reads only the ledger, the settings and the last sample
    v.s = Settings(out="/nonexistent", steady_s=105.0)
    v.ledger = [{"lateness_s": f"{x:.3f}", "held": str(int(x > 4))} for x in lateness]
    v.last = {"late_events": late_events}
    return v


def test_every_file_within_the_grace_passes():
    check = _verdict([1.2, 7.9, 2.0], late_events=0).producer_within_grace()
    assert check.ok
    assert "the latest landed 7.9 s" in check.detail and "after the grace" not in check.detail


def test_a_stalled_file_that_ebb_still_took_in_passes_and_says_so():
    check = _verdict([1.2, 23.7, 2.0], late_events=0).producer_within_grace()
    assert check.ok
    assert "1 landed after the grace" in check.detail and "0 readings counted late" in check.detail


def test_a_stalled_file_that_ebb_dropped_as_late_fails():
    check = _verdict([1.2, 23.7, 10.0], late_events=31).producer_within_grace()
    assert not check.ok
    assert "2 landed after the grace" in check.detail and "31 readings counted late" in check.detail


def test_late_readings_with_every_file_in_time_are_left_to_the_loss_check():
    assert _verdict([1.2, 3.0], late_events=5).producer_within_grace().ok
