"""Power loss and exceptions after the commit (LevelDB's fault_injection_test, for ebb).

``test_power_loss_at_every_point``: an update is crashed in-process at every crash point, then
every write that was not fsync'd is thrown away (``faults.FaultInjectionFS``: files shrink to
their synced length, files whose directory entry was never synced disappear), as a power cut
would. Reopened, the archive must be exactly before the update (points ahead of the commit) or
after it (points behind it), verify clean after recovery, and take the next update.

``test_exception_after_commit_keeps_the_update``: an exception (Ctrl-C) raised after the
commit must not remove anything the committed state references.

``test_create_is_restartable``: ``Archive.create`` crashed half way can simply be run again.

``test_a_full_disk_fails_the_update_whole``: ENOSPC at a random byte of an update's writes.
"""

from __future__ import annotations

import errno
import os

import numpy as np
import pyarrow as pa
import pytest

from ebb.storage import faults, files
from ebb.storage.archive import Archive
from ebb.storage.errors import ArchiveError
from ebb.storage.faults import FaultInjectionFS, SimulatedCrash
from ebb.storage.verify import verify

from support import SCHEMA, Oracle, archive_answers, config, random_rows, table_of

TAU, DELTA, S = 16, 2, 16
PROBES, RANGES = (0, 3, 7, 11), ((0, 5), (6, 40))
AFTER_COMMIT = {"update.after_commit", "gc.file_removed"}
POINTS = [("update.validated", 1), ("run.block_written", 1), ("run.block_written", 4), ("update.runs_written", 1),
          ("update.before_commit", 1), ("update.after_commit", 1), ("gc.file_removed", 1), ("gc.file_removed", 2)]


@pytest.fixture
def fault_fs(monkeypatch):
    fs = FaultInjectionFS()
    monkeypatch.setattr(files, "FS", fs)
    yield fs
    faults.arm(None)


def _build(path, mode, rng):
    """An archive after a bulk load and three updates; returns it open, and its oracle."""
    arc = Archive.create(path, config(mode=mode, block_bytes=512))
    oracle = Oracle()
    rows = random_rows(rng, 600, TAU - S + 1, TAU, S, 12, "bulk")
    arc.load(table_of(rows, SCHEMA), TAU)
    oracle.load(rows, TAU)
    for t in (18, 20, 22):
        rows = random_rows(rng, 150, t - DELTA + 1, t, S, 12, f"u{t}")
        arc.load(table_of(rows, SCHEMA), t)
        oracle.load(rows, t)
    return arc, oracle


def _answers(oracle, t):
    return {"scan": oracle.scan(t), "probes": {k: oracle.probe(k, t) for k in PROBES},
            "ranges": {r: oracle.probe_range(*r, t) for r in RANGES}}


@pytest.mark.parametrize("mode", ["rebuild", "norebuild"])
@pytest.mark.parametrize("point,k", POINTS, ids=[f"{p}:{k}" for p, k in POINTS])
def test_power_loss_at_every_point(tmp_path, fault_fs, mode, point, k):
    rng = np.random.default_rng(hash((mode, point, k)) % 2**32)
    path = str(tmp_path / "arc")
    arc, oracle = _build(path, mode, rng)
    rows = random_rows(rng, 150, 23, 24, S, 12, "crashed")
    after = Oracle()
    after.records = list(oracle.records)
    after.load(rows, 24)

    faults.arm(point, k)
    with pytest.raises(SimulatedCrash):
        arc.load(table_of(rows, SCHEMA), 24)
    faults.arm(None)
    arc.close()  # the process is gone: its environment, maps and descriptors with it
    fault_fs.drop_unsynced()

    with Archive(path) as arc:
        state = arc.state()
        expect_after = point in AFTER_COMMIT
        assert state.update_seq == (5 if expect_after else 4), f"crash at {point}:{k} left update_seq {state.update_seq}"
        expected = after if expect_after else oracle
        t = 24 if expect_after else 22
        assert archive_answers(arc, t, PROBES, RANGES) == _answers(expected, t)
        arc.recover()
        problems, notes = verify(arc)
        assert problems == [] and notes == [], (problems, notes)
        if not expect_after:  # the retry and the next update give the oracle's answers
            arc.load(table_of(rows, SCHEMA), 24)
        nxt = random_rows(rng, 150, 25, 26, S, 12, "next")
        arc.load(table_of(nxt, SCHEMA), 26)
        after.load(nxt, 26)
        assert archive_answers(arc, 26, PROBES, RANGES) == _answers(after, 26)
        assert verify(arc)[0] == []


def test_every_update_file_is_synced_before_the_commit(tmp_path, fault_fs):
    """After a clean update nothing is lost by a power cut: every run file the committed state
    references was fsync'd, and so was its directory entry."""
    for mode in ("rebuild", "norebuild"):
        path = str(tmp_path / mode)
        arc, oracle = _build(path, mode, np.random.default_rng(1))
        arc.close()
        assert fault_fs.drop_unsynced() == []
        with Archive(path) as arc:
            assert archive_answers(arc, 22, PROBES, RANGES) == _answers(oracle, 22)


@pytest.mark.parametrize("mode", ["rebuild", "norebuild"])
def test_exception_after_commit_keeps_the_update(tmp_path, monkeypatch, mode):
    rng = np.random.default_rng(7)
    path = str(tmp_path / "arc")
    arc, oracle = _build(path, mode, rng)
    rows = random_rows(rng, 150, 23, 24, S, 12, "x")
    oracle.load(rows, 24)

    import ebb.storage.update as update_module

    def interrupt(name):
        if name == "update.after_commit":
            raise KeyboardInterrupt

    monkeypatch.setattr(update_module, "crash_point", interrupt)
    with pytest.raises(KeyboardInterrupt):
        arc.load(table_of(rows, SCHEMA), 24)
    monkeypatch.undo()
    assert arc.state().update_seq == 5
    assert archive_answers(arc, 24, PROBES, RANGES) == _answers(oracle, 24)
    assert verify(arc)[0] == []
    # and an interrupted garbage collection after the commit loses nothing either
    import ebb.storage.recovery as recovery_module

    def interrupted_gc(env, data_dir, pinned=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(recovery_module, "collect_garbage", interrupted_gc)
    rows = random_rows(rng, 150, 25, 26, S, 12, "y")
    oracle.load(rows, 26)
    with pytest.raises(KeyboardInterrupt):
        arc.load(table_of(rows, SCHEMA), 26)
    monkeypatch.undo()
    assert archive_answers(arc, 26, PROBES, RANGES) == _answers(oracle, 26)
    arc.recover()
    assert verify(arc) == ([], [])
    arc.close()


def test_create_is_restartable(tmp_path, monkeypatch):
    path = str(tmp_path / "arc")

    def fail(*a, **k):
        raise OSError("disk full (simulated)")

    monkeypatch.setattr("ebb.storage.archive.write_durably", fail)  # dies just before the marker
    with pytest.raises(OSError):
        Archive.create(path, config())
    monkeypatch.undo()
    assert not os.path.exists(os.path.join(path, "EBB"))
    with pytest.raises(ArchiveError, match="not an ebb archive"):
        Archive(path)
    with Archive.create(path, config()) as arc:  # run again: starts over
        arc.load(pa.Table.from_pylist([{"key": 1, "ts": 16, "exp": 20, "payload": "p"}], schema=SCHEMA), 16)
        assert arc.stats()["records"] == 1
    with pytest.raises(ArchiveError, match="already an ebb archive"):
        Archive.create(path, config())


@pytest.mark.parametrize("mode", ["rebuild", "norebuild"])
def test_a_full_disk_fails_the_update_whole(tmp_path, monkeypatch, mode):
    """The data device fills up (ENOSPC) at a random byte of an update's writes: the update fails
    with that error, the archive answers as before it, the next open's recovery removes the
    partial files, and once there is space again the same update and the next one apply."""
    rng = np.random.default_rng(11 if mode == "rebuild" else 12)
    path = str(tmp_path / "arc")
    arc, oracle = _build(path, mode, rng)
    rows = random_rows(rng, 150, 23, 24, S, 12, "full")
    for space in sorted(int(x) for x in rng.integers(0, 6000, 4)):
        monkeypatch.setattr(files, "FS", FaultInjectionFS(space=space))
        with pytest.raises(OSError) as e:
            arc.load(table_of(rows, SCHEMA), 24)
        assert e.value.errno == errno.ENOSPC, e.value
        monkeypatch.setattr(files, "FS", files.FileSystem())
        assert arc.state().update_seq == 4
        assert archive_answers(arc, 22, PROBES, RANGES) == _answers(oracle, 22)
    arc.close()
    with Archive(path) as arc:
        arc.recover()
        assert verify(arc) == ([], [])
        arc.load(table_of(rows, SCHEMA), 24)
        oracle.load(rows, 24)
        assert archive_answers(arc, 24, PROBES, RANGES) == _answers(oracle, 24)
        assert verify(arc)[0] == []
