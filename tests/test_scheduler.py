"""The scheduler's wall clock and what a run leaves behind: tick T is due only once the clock reads
T + grace, following or catching up, so a file landing within the grace is in its tick and one
landing after it holds late events; the job file's grace, retain and update_log; and a run that
creates no archive (refused, failed, nothing due) leaves nothing on disk, so ``ebb init`` of the
path still works. Time is a fake clock passed to the scheduler: nothing sleeps."""

from __future__ import annotations

import datetime as dt
import os
from typing import Callable

import pyarrow as pa
import pytest

from ebb.indexer.jobspec import JobError, load_job
from ebb.indexer.patterns import classify
from ebb.indexer.scheduler import Scheduler, TooManyTicks, archive_config
from ebb.indexer.synthetic import land
from ebb.query.reader import ArchiveReader
from ebb.storage.archive import Archive

from support import ebb

ORIGIN = "2026-01-01T00:00:00Z"
ORIGIN_NS = int(dt.datetime.fromisoformat(ORIGIN.replace("Z", "+00:00")).timestamp()) * 10**9
DELTA, TAU, GRACE = 5, 40, 3

JOB = """
[job]
time_unit = "s"
origin = "{origin}"
{job}
[[source]]
name = "clicks"
path = "landing/clicks"
time_column = "t"
key = "user"
[query]
kind = "window"
source = "clicks"
range = 20
[archive]
path = "archive"
layout = "doubly"
interval = 5
start = 40
{archive}
"""


def write_job(d, job="", archive=""):
    os.makedirs(d, exist_ok=True)
    p = d / "job.toml"
    p.write_text(JOB.format(origin=ORIGIN, job=job, archive=archive))
    return p


def at(seconds: float) -> int:
    """The wall clock (ns since the epoch) ``seconds`` after the origin."""
    return ORIGIN_NS + round(seconds * 1e9)


class FakeTime:
    """A wall clock that moves only when the scheduler sleeps, landing each scheduled file when
    the clock passes its landing time, and stopping the run once past ``end``."""

    class Stop(Exception):
        pass

    def __init__(self, start: float, end: float, landings: list[tuple[float, Callable[[], object]]]):
        self.now, self.end = at(start), at(end)
        self.landings = sorted(landings, key=lambda x: x[0])

    def clock(self) -> int:
        return self.now

    def sleep(self, seconds: float) -> None:
        target = self.now + round(seconds * 1e9)
        while self.landings and at(self.landings[0][0]) <= target:
            when, do = self.landings.pop(0)
            self.now = max(self.now, at(when))
            do()
        if target > self.end:
            raise FakeTime.Stop
        self.now = target


def clicks(users, ts) -> pa.Table:
    return pa.table({"user": pa.array(users, pa.int64()), "t": pa.array(ts, pa.int64()),
                     "amount": pa.array([1] * len(ts), pa.int64())})


def scenario(job):
    """Tick 1 (T=45) is due at 48 s. A file of its events lands 1 ms before that; another, with one
    event of tick 1 (t=45) and one of tick 2 (t=46), lands 1 ms after tick 1 has run."""
    src = job.sources["clicks"].path
    return [
        (TAU + GRACE - 1.0, lambda: land(clicks([1, 2, 3], [31, 35, 40]), src, "bulk.parquet")),
        (TAU + DELTA + GRACE - 0.001, lambda: land(clicks([7, 7], [44, 45]), src, "in-grace.parquet")),
        (TAU + DELTA + GRACE + 0.001, lambda: land(clicks([8, 8], [45, 46]), src, "after-grace.parquet")),
    ]


def outcome(sch) -> tuple:
    """(late events and inserted rows per tick, rows valid at the last tick) of the archive."""
    log = [(u["slot"], u["late_rows"], u["inserted"]) for u in sch.archive.updates()]
    rows = ArchiveReader(sch.archive).scan_table(as_of=TAU + 2 * DELTA)
    return log, rows


def check_boundary(log, rows):
    assert log == [(0, 0, 3), (1, 0, 2), (2, 1, 1)]
    got = sorted((r["user"], r["ts"]) for r in rows.to_pylist())
    # in-grace: both events in tick 1; after-grace: t=45 late (dropped), t=46 on time in tick 2
    assert got == [(1, 31), (2, 35), (3, 40), (7, 44), (7, 45), (8, 46)]


def test_grace_boundary_following(spark, tmp_path):
    job = load_job(str(write_job(tmp_path, job=f"grace = {GRACE}")))
    t = FakeTime(TAU + GRACE, TAU + 2 * DELTA + GRACE + 1, scenario(job))
    t.landings.pop(0)[1]()  # the bulk file is there when the run starts
    with Scheduler(job, say=lambda m: None, clock=t.clock, sleep=t.sleep) as sch:
        with pytest.raises(FakeTime.Stop):
            sch.run(follow=True)
        check_boundary(*outcome(sch))
        assert t.now == at(TAU + 2 * DELTA + GRACE)  # the last tick ran when the clock read its T + grace


def test_catch_up_by_hand_agrees_with_following(spark, tmp_path):
    """`ebb run` without --follow, run at the same instants, runs the same ticks on the same files:
    a tick is due by the wall clock only at T + grace."""
    job = load_job(str(write_job(tmp_path, job=f"grace = {GRACE}")))
    said: list[str] = []
    now = [0]
    landings = dict(scenario(job))
    due = [TAU + GRACE, TAU + DELTA + GRACE, TAU + 2 * DELTA + GRACE]
    with Scheduler(job, say=said.append, clock=lambda: now[0]) as sch:
        for when in sorted([*landings, *due]):
            now[0] = at(when)
            if when in landings:
                landings[when]()
            assert sch.run() == (when in due), when  # one tick at each T + grace, none in between
            if when == TAU + DELTA + GRACE - 0.001:  # T=45 has passed, but tick 1 is not due
                assert said[-1].endswith(f"is at T=45 (2026-01-01 00:00:45 UTC) and runs {GRACE} s later (job.grace)")
        check_boundary(*outcome(sch))


def test_due_by_the_wall_clock(tmp_path):
    """now_slot and due_ns agree at the boundary, with the default grace (one Delta) and grace 0."""
    now = [0]
    for extra, g in (("", DELTA), ("grace = 0", 0), (f"grace = {GRACE}", GRACE)):
        sch = Scheduler(load_job(str(write_job(tmp_path / f"g{g}", job=extra))), clock=lambda: now[0])
        assert sch.grace == g
        for j in (0, 1, 7):
            now[0] = sch.due_ns(j)
            assert now[0] == at(TAU + j * DELTA + g) and sch.now_slot() == j
            now[0] -= 1
            assert sch.now_slot() == j - 1


def test_job_fields_grace_retain_update_log(tmp_path):
    job = load_job(str(write_job(tmp_path, job="grace = 12", archive="retain = 3600\nupdate_log = 50")))
    assert job.grace == 12
    cfg = archive_config(job, classify(job))
    assert (cfg.retain, cfg.update_log) == (3600, 50)
    default = archive_config(load_job(str(write_job(tmp_path / "d"))), classify(job))
    assert default.retain == 0 and default.update_log == 1000 and default.section_slots == 1
    wide = load_job(str(write_job(tmp_path / "w", archive='mode = "norebuild"\nE = 1\nsection_slots = 2')))
    assert archive_config(wide, classify(wide)).section_slots == 2
    for job_, archive, words in (
        ("grace = -1", "", "job.grace: must be a number of chronons from 0 up, got -1"),
        ("grace = true", "", "job.grace: expected int"),
        ("grase = 3", "", "unknown key 'grase' in [job]; did you mean 'grace'?"),
        ("", "retain = -5", "archive.retain: must be a number of chronons from 0 up, got -5"),
        ("", "update_log = 0", "archive.update_log: must be a positive number of update records, got 0"),
        ("", "retian = 5", "did you mean 'retain'?"),
        ("", "section_slots = 0", "archive.section_slots: must be a positive number of slots, got 0"),
    ):
        with pytest.raises(JobError, match=words.replace("?", r"\?").replace("[", r"\[").replace("]", r"\]")):
            load_job(str(write_job(tmp_path / "bad", job=job_, archive=archive)))
    text = write_job(tmp_path / "c").read_text().replace('time_unit = "s"', 'time_unit = "chronon"\ngrace = 2')
    (tmp_path / "c" / "job.toml").write_text(text)
    with pytest.raises(JobError, match="time_unit is 'chronon', so there is no wall clock"):
        load_job(str(tmp_path / "c" / "job.toml"))


def test_the_archive_gets_retain_and_update_log(tmp_path):
    job = write_job(tmp_path, archive="retain = 60\nupdate_log = 7")
    r = ebb("run", job, "--ticks", 1)
    assert r.returncode == 0, r.stderr
    with Archive(str(tmp_path / "archive"), readonly=True) as arc:
        assert (arc.config.retain, arc.config.update_log) == (60, 7)


# -- a run that creates no archive leaves nothing ------------------------------------------------

def init(path):
    return ebb("init", path, "--layout", "wave", "--mode", "rebuild", "--max-lifetime", 20, "--interval", 5, "--start", 0)


def test_refused_run_creates_nothing(tmp_path):
    # origin 2026-01-01, one tick every 5 s: far more than 1000 ticks are due
    job = write_job(tmp_path, archive='data_dir = "shared/runs"')
    r = ebb("run", job)
    assert r.returncode == 2 and "more than the catch-up bound of 1000" in r.stderr
    r = ebb("run", job, "--until", 100_000)
    assert r.returncode == 2 and "more than the catch-up bound of 1000" in r.stderr
    assert sorted(os.listdir(tmp_path)) == ["job.toml"]
    assert init(tmp_path / "archive").returncode == 0


def test_refused_run_keeps_what_was_there(tmp_path):
    """An archive directory made beforehand stays (empty), and an existing lock file stays."""
    job = write_job(tmp_path)
    os.makedirs(tmp_path / "archive")
    assert ebb("run", job).returncode == 2
    assert os.listdir(tmp_path / "archive") == []
    (tmp_path / "archive" / "SCHEDULER").write_text("")
    assert ebb("run", job).returncode == 2
    assert os.listdir(tmp_path / "archive") == ["SCHEDULER"]


def test_run_with_nothing_due_or_failing_before_the_archive_creates_nothing(tmp_path, monkeypatch):
    job = load_job(str(write_job(tmp_path, job="max_catchup = 5")))
    with Scheduler(job, say=lambda m: None, clock=lambda: at(TAU - 10)) as sch:
        assert sch.run() == 0
    with pytest.raises(TooManyTicks):
        with Scheduler(job, say=lambda m: None, clock=lambda: at(TAU + 100 * DELTA)) as sch:
            sch.run()
    assert sorted(os.listdir(tmp_path)) == ["job.toml"]

    # the archive's creation fails part way (after its metadata directory exists)
    def broken(txn, cfg):
        raise OSError("disk full")

    monkeypatch.setattr("ebb.storage.archive.write_config", broken)
    with pytest.raises(OSError, match="disk full"):
        with Scheduler(job, say=lambda m: None) as sch:
            sch.run(ticks=1)
    assert sorted(os.listdir(tmp_path)) == ["job.toml"]


def test_failed_creation_removes_the_data_dir_it_made(tmp_path):
    job = write_job(tmp_path, archive='data_dir = "shared/runs"')
    os.makedirs(tmp_path / "archive")
    (tmp_path / "archive" / "notes.txt").write_text("mine")
    r = ebb("run", job, "--ticks", 1)
    assert r.returncode == 1 and "already exists and is not empty" in r.stderr, r.stderr
    assert sorted(os.listdir(tmp_path)) == ["archive", "job.toml"]
    assert os.listdir(tmp_path / "archive") == ["notes.txt"]


def test_a_run_that_created_the_archive_keeps_it(tmp_path):
    job = write_job(tmp_path)
    r = ebb("run", job, "--ticks", 1)
    assert r.returncode == 0, r.stderr
    assert {"EBB", "SCHEDULER"} <= set(os.listdir(tmp_path / "archive"))
    r = ebb("run", job)  # refused (too many ticks due) on an archive that exists: it stays whole
    assert r.returncode == 2 and {"EBB", "SCHEDULER"} <= set(os.listdir(tmp_path / "archive"))
