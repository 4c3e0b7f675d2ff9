"""The scheduler: tick-by-tick results equal one-shot results, late events are counted and
dropped, missed ticks are caught up in order, a second run loads nothing twice, one runner per
archive; and ``ebb explain`` classifies queries and rejects what cannot be archived."""

from __future__ import annotations

import fcntl
import json
import os

import numpy as np
import pyarrow as pa
import pytest

from ebb.indexer import scheduler as sched_mod
from ebb.indexer.jobspec import load_job
from ebb.indexer.landing import LandedFile, list_files
from ebb.indexer.patterns import classify
from ebb.indexer.scheduler import LateEventsRejected, Scheduler
from ebb.indexer.synthetic import land
from ebb.indexer.tick import compute
from ebb.query.reader import ArchiveReader
from ebb.storage.archive import Archive
from ebb.storage.manifest import ArchiveConfig

from jobs import AGGREGATE, DISTINCT, JOIN, job_toml
from support import ebb, rows_multiset

DELTA, TAU = 5, 40

# the join with a sliding window on views and a condition: more of the join's cases per tick
SLIDING_JOIN = JOIN.replace("range = 8}", "range = 7, slide = 3}") + '\ncondition = "l.amount >= r.amount"'


def events(rng, lo, hi, rate):
    """Events with lo < t <= hi; ``rate`` events per chronon on average (0: an empty interval)."""
    n = int(rng.poisson(rate * (hi - lo)))
    t = rng.integers(lo + 1, hi + 1, n)
    return pa.table({"user": rng.integers(0, 5, n), "t": t, "amount": rng.integers(0, 4, n)})


def write_job(tmp_path, text):
    p = tmp_path / "job.toml"
    p.write_text(text)
    return load_job(str(p))


def land_interval(job, rng, lo, hi, rate, tag):
    for name in job.sources:
        land(events(rng, lo, hi, rate), job.sources[name].path, f"{name}-{hi:06d}{tag}.parquet")


def all_files(job):
    return {n: {rel: LandedFile(sz, mt, -(10**15), 10**15, None) for rel, (sz, mt) in list_files(s.path).items()}
            for n, s in job.sources.items()}


@pytest.mark.parametrize("query,sources,ticks,mode", [(SLIDING_JOIN, ("clicks", "views"), 6, "rebuild"),
                                                      (AGGREGATE, ("clicks",), 6, "norebuild"),
                                                      (DISTINCT, ("clicks",), 6, "rebuild")],
                         ids=["join", "aggregate", "distinct"])
def test_ticks_equal_one_shot(spark, tmp_path, monkeypatch, query, sources, ticks, mode):
    job = write_job(tmp_path, job_toml(query, sources, mode=mode))
    cls = classify(job)
    rng = np.random.default_rng(ticks)
    captured: list[pa.Table] = []

    def capture(*a, **k):
        table, info = compute(*a, **k)
        captured.append(table)
        return table, info

    monkeypatch.setattr(sched_mod, "compute", capture)
    s_ = cls.max_lifetime
    land_interval(job, rng, TAU - s_ - cls.lookback - DELTA, TAU, 0.8, "")
    rates = [0.8, 0.0, 3.2, 0.2, 0.0, 1.6]  # bursts (x4) and empty intervals
    with Scheduler(job, say=lambda m: None) as sch:
        sch.run(ticks=1)
        for j in range(1, ticks + 1):
            land_interval(job, rng, TAU + (j - 1) * DELTA, TAU + j * DELTA, rates[j % len(rates)], "")
            sch.run(ticks=1)
        cfg = sch.archive.config
    T_end = TAU + ticks * DELTA
    whole, _ = compute(spark, job, cls, all_files(job), TAU - cfg.max_lifetime, T_end)
    per_tick = pa.concat_tables([t for t in captured if t.num_columns], promote_options="default")
    assert rows_multiset(per_tick.select(whole.column_names)) == rows_multiset(whole)
    assert whole.num_rows > 20

    # the same results loaded tick by tick from the one-shot computation give the same archive
    other = Archive.create(str(tmp_path / "oneshot"), ArchiveConfig(**{**cfg.__dict__}))
    ts = np.asarray(whole.column("ts"))
    for j in range(ticks + 1):
        T = TAU + j * DELTA
        lo = TAU - cfg.max_lifetime if j == 0 else T - DELTA
        other.load(whole.filter(pa.array((ts > lo) & (ts <= T))), T)
    with ArchiveReader(str(tmp_path / "archive")) as a, ArchiveReader(other) as b:
        for as_of in (T_end, T_end + 3, T_end + cfg.max_lifetime // 2):
            assert rows_multiset(a.scan_table(as_of=as_of)) == rows_multiset(b.scan_table(as_of=as_of))
    other.close()


def test_late_events_counted_and_dropped(spark, tmp_path):
    job = write_job(tmp_path, job_toml(DISTINCT, mode="rebuild"))
    rng = np.random.default_rng(1)
    land_interval(job, rng, TAU - 30, TAU, 0.5, "")
    with Scheduler(job, say=lambda m: None) as sch:
        sch.run(ticks=2)  # ticks at 40 and 45
        before = ArchiveReader(sch.archive).scan_table()
        late = pa.table({"user": [9, 9, 9], "t": [41, 43, 47], "amount": [3, 3, 3]})  # 41, 43 belong to a processed tick
        land(late, job.sources["clicks"].path, "clicks-late.parquet")
        rec = sch.run_tick(2)
        assert rec["late_rows"] == 2
        got = ArchiveReader(sch.archive).scan_table(as_of=50)
        assert sorted(r["user"] for r in got.to_pylist() if r["user"] == 9) == [9]  # only t=47 counts
        assert not any(r["user"] == 9 for r in before.to_pylist())
    st = json.loads(ebb("stats", tmp_path / "archive", "--format", "json").stdout)
    assert st["late_rows"] == 2 and st["update_log"][-1]["late_rows"] == 2


def test_late_policy_fail_commits_nothing(spark, tmp_path):
    job = write_job(tmp_path, job_toml(DISTINCT, mode="rebuild").replace("[job]\n", '[job]\nlate_policy = "fail"\n'))
    rng = np.random.default_rng(2)
    land_interval(job, rng, TAU - 30, TAU, 0.5, "")
    with Scheduler(job, say=lambda m: None) as sch:
        sch.run(ticks=1)
        land(pa.table({"user": [1], "t": [39], "amount": [1]}), job.sources["clicks"].path, "clicks-late.parquet")
        with pytest.raises(LateEventsRejected, match="late_policy is 'fail'"):
            sch.run_tick(1)
        assert sch.progress().last_slot == 0 and sch.archive.state().update_seq == 1


def test_run_twice_loads_nothing_twice_and_catches_up(spark, tmp_path):
    job = write_job(tmp_path, job_toml(AGGREGATE, mode="rebuild"))
    rng = np.random.default_rng(3)
    land_interval(job, rng, TAU - 40, TAU + 6 * DELTA, 0.6, "")  # files for six ticks landed during "downtime"
    until = TAU + 6 * DELTA
    with Scheduler(job, say=lambda m: None) as sch:
        assert sch.run(until=until) == 7  # bulk tick + six missed ticks, in order
        log = sch.archive.updates()
        assert [u["slot"] for u in log] == list(range(7))
        first = rows_multiset(ArchiveReader(sch.archive).scan_table())
    with Scheduler(job, say=lambda m: None) as sch:
        assert sch.run(until=until) == 0
        assert sch.archive.state().update_seq == 7
        assert rows_multiset(ArchiveReader(sch.archive).scan_table()) == first


def test_wall_clock_catch_up(spark, tmp_path):
    """Without --ticks/--until, `ebb run` runs every tick due by the wall clock: tick j once it reads
    T_j + grace (by default one Delta)."""
    origin = 1_767_225_600  # 2026-01-01T00:00:00Z
    text = job_toml(AGGREGATE, mode="rebuild").replace('time_unit = "chronon"', 'time_unit = "s"\norigin = "2026-01-01T00:00:00Z"')
    job = write_job(tmp_path, text)
    now = (origin + TAU + 3 * DELTA + DELTA + 2) * 10**9  # 2 s after tick 3 became due
    with Scheduler(job, say=lambda m: None, clock=lambda: now) as sch:
        assert sch.now_slot() == 3
        assert sch.run() == 4 and sch.progress().last_slot == 3


def test_one_runner_per_archive(tmp_path):
    job = write_job(tmp_path, job_toml(AGGREGATE, mode="rebuild"))
    os.makedirs(job.archive.path, exist_ok=True)
    fd = os.open(os.path.join(job.archive.path, "SCHEDULER"), os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        r = ebb("run", tmp_path / "job.toml", "--ticks", 1)
        assert r.returncode == 4 and "already running" in r.stderr
    finally:
        os.close(fd)


EXPLAIN_OK = {
    "window": ('kind = "window"\nsource = "clicks"\nrange = 60\nslide = 10', "weakest", "wave", 60),
    "join": ('kind = "join"\nleft = {source = "clicks", range = 60}\nright = {source = "views", range = 30}', "weak", "doubly", 30),
    "lifetime-const": ('kind = "lifetime"\nsources = ["clicks"]', "weakest", "wave", 600),
    "lifetime-mixed": ('kind = "lifetime"\nsources = ["clicks", "views"]', "weak", "doubly", 900),
    "aggregate": ('kind = "aggregate"\nsource = "clicks"\nrange = 300\nslide = 60\ngroup_by = ["user"]\naggregates = {n = "count(*)"}', "weakest", "wave", 60),
    "distinct": ('kind = "distinct"\nsource = "clicks"\nrange = 120\nselect = ["user"]', "weak", "doubly", 120),
}
EXPLAIN_REJECT = {
    "count-based": ('kind = "window"\nsource = "clicks"\nrows = 10', "strict non-monotonic"),
    "partitioned": ('kind = "window"\nsource = "clicks"\nrows = 1\npartition_by = ["user"]', "partitioned"),
    "difference": ('kind = "difference"', "strict non-monotonic"),
    "unbounded": ('kind = "window"\nsource = "clicks"\nrange = "unbounded"', "monotonic"),
    "landmark": ('kind = "window"\nsource = "clicks"\nlandmark = true', "monotonic"),
}
SOURCES = """[job]
time_unit = "s"
[[source]]
name = "clicks"
path = "c"
time_column = "t"
key = "user"
lifetime = 600
[[source]]
name = "views"
path = "v"
time_column = "t"
key = "user"
lifetime = 900
[archive]
path = "a"
interval = 10
start = 0
"""


@pytest.mark.parametrize("case", sorted(EXPLAIN_OK))
def test_explain(tmp_path, case):
    query, pattern, layout, s = EXPLAIN_OK[case]
    (tmp_path / "j.toml").write_text(SOURCES + "[query]\n" + query + "\n")
    r = ebb("explain", tmp_path / "j.toml")
    assert r.returncode == 0, r.stderr
    assert f"pattern    {pattern} non-monotonic" in r.stdout
    assert f"S          {s} chronons" in r.stdout
    assert ("wave index" if layout == "wave" else "doubly partitioned") in r.stdout


@pytest.mark.parametrize("case", sorted(EXPLAIN_REJECT))
def test_explain_rejects_unarchivable(tmp_path, case):
    query, words = EXPLAIN_REJECT[case]
    (tmp_path / "j.toml").write_text(SOURCES + "[query]\n" + query + "\n")
    r = ebb("explain", tmp_path / "j.toml")
    assert r.returncode == 2 and words in r.stderr, r.stderr  # a job file's problem: a usage error
    r = ebb("run", tmp_path / "j.toml", "--ticks", 1)
    assert r.returncode == 2 and words in r.stderr
    assert not (tmp_path / "a" / "EBB").exists()
