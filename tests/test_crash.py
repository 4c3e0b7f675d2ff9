"""Crash safety and concurrency of updates (docs/spec.md section 2, item 5: an update is atomic).

1. ``test_crash_point``: ``ebb load`` killed (SIGKILL, via EBB_CRASH_AT) at every named crash
   point of storage/faults.py, the k-th time for k up to 5 (runs are written in 1 KiB blocks,
   so a crash can leave a run half written), in both maintenance modes, for the next update, an update after a
   missed slot, the initial bulk load, and a crash during the retry of a crashed update. The
   archive must pass ``ebb verify`` and answer scans, probes and range probes exactly as before
   the update (points ahead of the commit) or after it (points behind it); recovery must leave
   no leftovers, and the retried and the next update must give the oracle's answers.
   ``test_recover_after_crashed_first_norebuild_load`` checks recovery after a crashed first
   NoRebuild load on its own.
2. ``test_random_kill``: ``ebb load`` of a 200k-row batch killed after random delays.
3. ``test_concurrent_reader_*``: a reader process scanning (some scans slow, holding their
   snapshot across commits) while 20-30 updates commit, in-process or by ``ebb load``
   processes some of which are killed mid-update, sees only committed states.
   ``test_open_snapshot_survives_updates``: the same, deterministically, in one process.
4. ``test_second_writer_*``: a second writer is refused with exit code 4 (ArchiveBusy).
"""

from __future__ import annotations

import copy
import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
import zlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from ebb.query.reader import ArchiveReader
from ebb.storage import faults
from ebb.storage.archive import Archive, ArchiveBusy
from ebb.storage.errors import EXIT_BUSY, LockHeld
from ebb.storage.files import DATA_DIR, exclusive_lock
from ebb.storage.read_plan import Scan
from ebb.storage.verify import verify

from support import SCHEMA, Oracle, archive_answers, config, ebb, random_rows, rows_multiset, table_of

# the test process itself must never crash on purpose (only its ``ebb`` subprocesses)
assert not os.environ.get("EBB_CRASH_AT"), "unset EBB_CRASH_AT before running the tests"

TAU, DELTA, S = 16, 2, 16  # doubly round-robin 2 x 2 (support.config's defaults)
KEYS = 40
PROBE_KEYS = (0, 7, 21, 33, 39, 500)  # 500 never occurs
RANGES = ((0, 10), (15, 30), (35, 1000), (-5, -1))
NO_CRASH = {"EBB_CRASH_AT": ""}

BEFORE_COMMIT = {"update.validated", "run.block_written", "update.runs_written", "update.before_commit"}
AFTER_COMMIT = {"update.after_commit", "gc.file_removed"}
PARTITIONED_ONLY = {"partitioned.results_in"}  # reached only by executor loading: tests/test_executor_load.py
MIGRATE_ONLY = {p for p in faults.POINTS if p.startswith("migrate.")}  # tests/test_migration.py
PUBLISH_ONLY = {"publish.copied"}  # reached only with a data directory of its own: tests/test_published.py
assert BEFORE_COMMIT | AFTER_COMMIT == set(faults.POINTS) - PARTITIONED_ONLY - MIGRATE_ONLY - PUBLISH_ONLY


# -- helpers ---------------------------------------------------------------------------------------
def _time_of(slot):
    return TAU if slot is None else TAU + slot * DELTA


def _state(path):
    """(time of the last update, committed updates) of the archive at ``path``."""
    with Archive(path) as arc:
        st = arc.state()
    return _time_of(st.last_slot), st.update_seq


def _batch_rows(rng, at, n, tag):
    """A periodic batch for the update at ``at``: ts in [at-3, at] (some late), lifetimes 1..S."""
    return random_rows(rng, n, at - 3, at, S, KEYS, tag)


def _bulk_rows(rng, n, tag="bulk-"):
    return random_rows(rng, n, 1, TAU, S, KEYS, tag)


def _write(rows, path):
    return _write_table(table_of(rows, SCHEMA), path)


def _write_table(table, path):
    pq.write_table(table, str(path))
    return str(path)


def _oracle_answers(oracle, t):
    return {
        "scan": oracle.scan(t),
        "probes": {k: oracle.probe(k, t) for k in PROBE_KEYS},
        "ranges": {rg: oracle.probe_range(rg[0], rg[1], t) for rg in RANGES},
    }


def _diff(got, want):
    """Short description of how two answer sets differ ('' if equal)."""
    out = []
    for kind in ("scan", "probes", "ranges"):
        g, w = got[kind], want[kind]
        if kind == "scan":
            g, w = {"all": g}, {"all": w}
        for q in w:
            if g[q] != w[q]:
                missing, extra = w[q] - g[q], g[q] - w[q]
                out.append(f"{kind} {q}: {sum(missing.values())} missing (e.g. {list(missing)[:2]}), "
                           f"{sum(extra.values())} extra (e.g. {list(extra)[:2]})")
    return "; ".join(out)


def _assert_matches(path, oracle, t, what=""):
    d = _diff(archive_answers(path, t, PROBE_KEYS, RANGES), _oracle_answers(oracle, t))
    assert not d, f"{what} at t={t}: {d}"


def _cli_verify(path):
    r = ebb("verify", path, env=NO_CRASH)
    assert r.returncode == 0 and "PROBLEM" not in r.stdout, \
        f"ebb verify exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    for line in r.stdout.splitlines():
        assert line.startswith(("note:", "verify: ok (")), line
    return r


def _assert_clean(path, mode):
    """Verify passes in-process with no leftovers."""
    with Archive(path) as arc:
        problems, notes = verify(arc)
    assert problems == [], problems
    assert notes == [], f"leftovers not cleaned up: {notes}"


def _crash_load(path, parquet, at, point, k):
    r = ebb("load", path, parquet, "--at", at, env={"EBB_CRASH_AT": f"{point}:{k}"})
    assert r.returncode == -signal.SIGKILL, (
        f"crash point {point}:{k} was not reached (exit {r.returncode}); the update ran to completion"
        f" or failed\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}")
    progress = [ln for ln in r.stderr.splitlines() if ln.startswith("  I")]
    if point == "update.validated":
        assert progress == [], r.stderr  # killed before any sub-index was touched
    return r


# -- 1. named crash points -------------------------------------------------------------------------
R, N = "rebuild", "norebuild"
CASES = [
    # rebuild, the next update (touches G + E - 1 = 3 sub-indices)
    (R, "next", "update.validated", 1, None),
    *[(R, "next", "run.block_written", k, None) for k in (1, 2, 5)],
    (R, "next", "update.runs_written", 1, None),
    (R, "next", "update.before_commit", 1, None),
    (R, "next", "update.after_commit", 1, None),
    *[(R, "next", "gc.file_removed", k, None) for k in (1, 2, 3)],
    # rebuild, an update after a missed slot (deletes from both columns: touches all 4)
    (R, "gap", "run.block_written", 4, None),
    (R, "gap", "update.runs_written", 1, None),
    (R, "gap", "gc.file_removed", 4, None),
    # rebuild, the initial bulk load
    (R, "bulk", "run.block_written", 3, None),
    (R, "bulk", "update.runs_written", 1, None),
    (R, "bulk", "update.after_commit", 1, None),
    # rebuild, crash, then crash again during the retry, then retry cleanly
    (R, "next", "run.block_written", 2, ("update.before_commit", 1)),
    # norebuild, the next update
    (N, "next", "update.validated", 1, None),
    *[(N, "next", "run.block_written", k, None) for k in (1, 2)],
    (N, "next", "update.runs_written", 1, None),
    (N, "next", "update.before_commit", 1, None),
    (N, "next", "update.after_commit", 1, None),
    *[(N, "next", "gc.file_removed", k, None) for k in (1, 2)],
    # norebuild, after a missed slot
    (N, "gap", "run.block_written", 2, None),
    (N, "gap", "update.runs_written", 1, None),
    # norebuild, the initial bulk load
    (N, "bulk", "run.block_written", 2, None),
    (N, "bulk", "update.before_commit", 1, None),
    (N, "bulk", "update.after_commit", 1, None),
    # norebuild, crash twice
    (N, "next", "run.block_written", 1, ("run.block_written", 1)),
]


def _case_id(c):
    mode, scenario, point, k, second = c
    s = f"{mode}-{scenario}-{point}:{k}"
    return s + (f"-then-{second[0]}:{second[1]}" if second else "")


@pytest.mark.parametrize("mode,scenario,point,k,second", CASES, ids=[_case_id(c) for c in CASES])
def test_crash_point(tmp_path, mode, scenario, point, k, second):
    # the same data for every crash point of a scenario, so each point interrupts the same update
    rng = np.random.default_rng(zlib.crc32(f"{mode}-{scenario}".encode()))
    path = str(tmp_path / "arc")
    # 1 KiB blocks: every run has several, so a crash can interrupt one half written
    Archive.create(path, config(mode=mode, block_bytes=1024)).close()
    oracle = Oracle()
    if scenario == "bulk":
        new_t = TAU
        rows = _bulk_rows(rng, 1500)
    else:
        with Archive(path) as arc:
            bulk = _bulk_rows(rng, 1500)
            arc.load(table_of(bulk, SCHEMA), TAU)
            oracle.load(bulk, TAU)
            for t in (18, 20, 22):
                b = _batch_rows(rng, t, 300, f"u{t}-")
                arc.load(table_of(b, SCHEMA), t)
                oracle.load(b, t)
        new_t = 26 if scenario == "gap" else 24
        rows = _batch_rows(rng, new_t, 300, f"u{new_t}-")
    prev_t, prev_seq = _state(path)
    parquet = _write(rows, tmp_path / "next.parquet")
    before = copy.deepcopy(oracle)
    after = copy.deepcopy(oracle)
    after.load(rows, new_t)

    _crash_load(path, parquet, new_t, point, k)
    if second:
        assert point in BEFORE_COMMIT
        assert _state(path) == (prev_t, prev_seq), "the first crash was before the commit"
        _crash_load(path, parquet, new_t, *second)
        point = second[0]  # the last crash decides the expected state
    report = _cli_verify(path)
    if point in ("run.block_written", "update.runs_written", "update.before_commit"):
        assert "left by an interrupted update" in report.stdout, report.stdout  # recovery has work to do

    t, seq = _state(path)
    if seq == prev_seq:
        assert t == prev_t
        state = "before"
    else:
        assert (t, seq) == (new_t, prev_seq + 1), f"state is neither before nor after the update: t={t} seq={seq}"
        state = "after"
    assert state == ("after" if point in AFTER_COMMIT else "before"), f"crash at {point} left the archive {state} the update"
    expected = after if state == "after" else before
    _assert_matches(path, expected, t, f"{state} state")
    if state == "before" and scenario != "bulk":
        # reads as of the update's time are allowed and must not see the new batch
        _assert_matches(path, before, new_t, "before state, read as of the crashed update's time")

    with Archive(path) as arc:  # recovery on its own removes every leftover
        arc.recover()
    _assert_clean(path, mode)

    # recovery: retry the crashed update (if it did not commit), then one more update
    with Archive(path) as arc:
        if state == "before":
            arc.load_parquet(parquet, new_t)
        nxt = _batch_rows(rng, new_t + DELTA, 300, f"u{new_t + DELTA}-")
        arc.load(table_of(nxt, SCHEMA), new_t + DELTA)
    after.load(nxt, new_t + DELTA)
    assert _state(path) == (new_t + DELTA, prev_seq + 2)
    _assert_matches(path, after, new_t + DELTA, "after recovery")
    _assert_clean(path, mode)


def test_crash_cases_cover_every_point():
    """The parametrisation reaches at least 12 cases per mode, >= 12 distinct (point, k) pairs,
    and every named crash point."""
    per_mode = {m: [c for c in CASES if c[0] == m] for m in (R, N)}
    assert all(len(v) >= 12 for v in per_mode.values())
    assert len({(c[2], c[3]) for c in CASES}) >= 12
    assert {c[2] for c in CASES} == set(faults.POINTS) - PARTITIONED_ONLY - MIGRATE_ONLY - PUBLISH_ONLY


def test_recover_after_crashed_first_norebuild_load(tmp_path):
    """recover() must remove what an uncommitted update left, including the run files that a
    crashed *first* load created (nothing of them is committed)."""
    path = str(tmp_path / "arc")
    Archive.create(path, config(mode=N)).close()
    rows = _bulk_rows(np.random.default_rng(3), 1500)
    _crash_load(path, _write(rows, tmp_path / "bulk.parquet"), TAU, "update.before_commit", 1)
    data = os.path.join(path, DATA_DIR)
    assert any(os.path.getsize(os.path.join(data, n)) for n in os.listdir(data)), "the crash left nothing"
    with Archive(path) as arc:
        actions = arc.recover()
        st = arc.state()
    assert st.update_seq == 0
    assert os.listdir(data) == [], f"recover() did {actions} and left files of the crashed first load"


# -- 2. kills at random times ----------------------------------------------------------------------
BIG_KEYS = 5000


def _big_batch(rng, n, ts_lo, ts_hi, tag):
    ts = rng.integers(ts_lo, ts_hi + 1, n)
    exp = ts + rng.integers(1, S + 1, n)
    key = rng.integers(0, BIG_KEYS, n)
    return pa.table({"key": key, "ts": ts, "exp": exp, "payload": pa.array([f"{tag}{i}" for i in range(n)])}, schema=SCHEMA)


class TableOracle:
    """The support Oracle's semantics over a pyarrow table (fast enough for 10^5-10^6 rows)."""

    def __init__(self):
        self.table = SCHEMA.empty_table()

    def load(self, batch: pa.Table, at: int) -> None:
        self.table = pa.concat_tables([self.table.filter(pc.greater(self.table["exp"], at)),
                                       batch.filter(pc.greater(batch["exp"], at))]).combine_chunks()

    def valid(self, t: int) -> pa.Table:
        return self.table.filter(pc.and_(pc.less_equal(self.table["ts"], t), pc.greater(self.table["exp"], t)))


def _canon(table: pa.Table) -> pa.Table:
    t = table.select(SCHEMA.names).cast(SCHEMA).combine_chunks()
    return t.sort_by([(c, "ascending") for c in SCHEMA.names])


def _assert_big_matches(path, oracle: TableOracle, t: int, what: str):
    want = oracle.valid(t)
    with ArchiveReader(path) as r:
        got = r.scan_table(as_of=t)
        assert got.num_rows == want.num_rows, f"{what}: scan has {got.num_rows} rows, oracle {want.num_rows}"
        assert _canon(got).equals(_canon(want)), f"{what}: scan differs from the oracle"
        for key in (0, 17, 2500, BIG_KEYS - 1):
            w = want.filter(pc.equal(want["key"], key))
            assert _canon(r.probe(key, as_of=t)).equals(_canon(w)), f"{what}: probe {key} differs"
        w = want.filter(pc.and_(pc.greater_equal(want["key"], 100), pc.less_equal(want["key"], 300)))
        assert _canon(r.probe_range(100, 300, as_of=t)).equals(_canon(w)), f"{what}: probe_range differs"


def _start_load(path, parquet, at):
    """Popen of ``ebb load``; a thread notes when the first progress line (the update has passed
    validation and started on the sub-indices) appears on stderr."""
    env = dict(os.environ, **NO_CRASH)
    proc = subprocess.Popen([sys.executable, "-m", "ebb.tools.cli", "load", path, parquet, "--at", str(at)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    started = threading.Event()
    lines: list[str] = []

    def watch():
        for line in proc.stderr:
            lines.append(line)
            if line.startswith("  I"):
                started.set()

    th = threading.Thread(target=watch, daemon=True)
    th.start()
    return proc, started, lines, th


@pytest.mark.parametrize("mode", [R, N])
def test_random_kill(tmp_path, mode):
    rng = np.random.default_rng(20240 + (mode == N))
    path = str(tmp_path / "arc")
    oracle = TableOracle()
    with Archive.create(path, config(mode=mode)) as arc:
        bulk = _big_batch(rng, 100_000, 1, TAU, "bulk-")
        arc.load(bulk, TAU)
    oracle.load(bulk, TAU)
    t_prev, seq = TAU, 1
    pending = None
    # (anchor, delay): from process start, or from the first progress line of the update
    plan = [("start", rng.uniform(0.2, 1.5)), ("update", rng.uniform(0.0, 0.05)),
            ("update", rng.uniform(0.05, 0.2)), ("update", rng.uniform(0.1, 0.3))]
    outcomes = []
    for trial, (anchor, delay) in enumerate(plan):
        if pending is None:
            at = t_prev + DELTA
            batch = _big_batch(rng, 200_000, at - 3, at, f"t{trial}-")
            pending = (at, batch, _write_table(batch, tmp_path / f"b{trial}.parquet"))
        at, batch, parquet = pending
        proc, started, lines, th = _start_load(path, parquet, at)
        try:
            if anchor == "update":
                assert started.wait(60), "the update never started"
            time.sleep(delay)
            in_update = started.is_set()
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
            rc = proc.wait(60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        th.join(5)
        assert rc in (0, -signal.SIGKILL), f"ebb load exit {rc}: {''.join(lines)}"

        t, s = _state(path)
        if s == seq:
            assert t == t_prev
            state = "before"
        else:
            assert (t, s) == (at, seq + 1), f"neither before nor after: t={t} seq={s}"
            state = "after"
            oracle.load(batch, at)
            t_prev, seq, pending = at, s, None
        if rc == 0:
            assert state == "after", "a completed load must be visible"
        outcomes.append((anchor, round(delay, 3), rc, in_update, state))
        _assert_big_matches(path, oracle, t, f"trial {trial} ({outcomes[-1]})")
        _cli_verify(path)

    print(f"random kills ({mode}): {outcomes}")
    assert any(rc == -signal.SIGKILL and in_update for _, _, rc, in_update, _ in outcomes), \
        f"no kill landed inside an update: {outcomes}"
    # recovery: one clean update after the kills
    with Archive(path) as arc:
        if pending is not None:
            arc.load(pending[1], pending[0])
            oracle.load(pending[1], pending[0])
            t_prev = pending[0]
        at = t_prev + DELTA
        batch = _big_batch(rng, 20_000, at - 3, at, "final-")
        arc.load(batch, at)
    oracle.load(batch, at)
    _assert_big_matches(path, oracle, at, "after the final update")
    _assert_clean(path, mode)


# -- 3. a concurrent reader ------------------------------------------------------------------------
READER = r"""
import hashlib, os, sys, time, traceback
import pyarrow as pa
from ebb.query.reader import ArchiveReader

path, out, stop = sys.argv[1:4]
with open(out, "w", buffering=1) as f:
    r = ArchiveReader(path)
    n = 0
    while not os.path.exists(stop):
        try:
            if n and n % 7 == 0:  # now and then a fresh reader (a new Archive and environment)
                r.close()
                r = ArchiveReader(path)
            if n % 2:
                t = r.scan_table()
            else:
                # a slow scan: its snapshot stays open across several commits, so the files and
                # slots it reads must not be replaced, reused or deleted under it
                batches = []
                for b in r.scan():
                    batches.append(b)
                    time.sleep(0.03)
                t = pa.Table.from_batches(batches, schema=r.result_schema())
            rows = sorted(zip(*(t.column(c).to_pylist() for c in ("key", "ts", "exp", "payload"))))
            f.write(hashlib.sha256(repr(rows).encode()).hexdigest() + "\n")
        except Exception:
            f.write("ERROR " + traceback.format_exc().replace("\n", " | ") + "\n")
        n += 1
    r.close()
"""


def _fingerprint(oracle: Oracle, t: int) -> str:
    rows = sorted((r["key"], r["ts"], r["exp"], r["payload"]) for r in oracle.valid(t))
    return hashlib.sha256(repr(rows).encode()).hexdigest()


def _read_lines(path):
    try:
        with open(path) as f:
            return [ln.rstrip("\n") for ln in f if ln.endswith("\n")]
    except FileNotFoundError:
        return []


def _wait_reads(out, n, proc, timeout=60):
    deadline = time.monotonic() + timeout
    while len(_read_lines(out)) < n:
        assert proc.poll() is None, f"reader died: {proc.stderr.read()}"
        assert time.monotonic() < deadline, "reader too slow"
        time.sleep(0.01)


def _run_with_reader(tmp_path, mode, apply_update, updates):
    rng = np.random.default_rng(77 + (mode == N))
    path = str(tmp_path / "arc")
    oracle = Oracle()
    bulk = _bulk_rows(rng, 4000)
    with Archive.create(path, config(mode=mode)) as arc:
        arc.load(table_of(bulk, SCHEMA), TAU)
    oracle.load(bulk, TAU)
    committed = {_fingerprint(oracle, TAU)}

    out, stop = str(tmp_path / "reads.txt"), str(tmp_path / "stop")
    proc = subprocess.Popen([sys.executable, "-c", READER, path, out, stop], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, **NO_CRASH))
    try:
        _wait_reads(out, 1, proc)
        t = TAU
        for u in range(updates):
            t += DELTA
            rows = _batch_rows(rng, t, 500, f"u{t}-")
            apply_update(path, rows, t, tmp_path / f"u{u}.parquet")
            oracle.load(rows, t)
            committed.add(_fingerprint(oracle, t))
        _wait_reads(out, len(_read_lines(out)) + 2, proc)  # let it see the final state
        open(stop, "w").close()
        proc.wait(60)
        assert proc.returncode == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reads = _read_lines(out)
    errors = [r for r in reads if r.startswith("ERROR")]
    assert not errors, errors[:3]
    assert len(reads) >= 5, f"only {len(reads)} reads"
    bad = [r for r in reads if r not in committed]
    assert not bad, f"{len(bad)} of {len(reads)} reads saw a state that was never committed"
    assert reads[-1] == _fingerprint(oracle, t), "the reader never saw the final state"
    assert len(set(reads)) >= 2, "the reader saw only one state: no overlap with the updates"
    print(f"reader ({mode}): {len(reads)} reads of {len(set(reads))} of the {len(committed)} committed states")
    _assert_matches(path, oracle, t, "final")
    with Archive(path) as arc:
        problems, _ = verify(arc)
    assert problems == []
    return reads


def _update_in_process(path, rows, t, _parquet):
    with Archive(path) as arc:
        arc.load(table_of(rows, SCHEMA), t)
    time.sleep(0.02)  # give the reader a chance between commits


def _crashing_update_by_cli(mode):
    """Every third update is first killed at a crash point, then (if it did not commit) retried:
    the reader must never see the dead writer's work, and recovery must not disturb it."""
    points = ["run.block_written:2", "update.before_commit:1", "update.runs_written:1", "update.after_commit:1"]
    count = [0]

    def apply(path, rows, t, parquet):
        u = count[0]
        count[0] += 1
        _write(rows, parquet)
        if u % 3 == 1:
            point = points[(u // 3) % len(points)]
            r = ebb("load", path, parquet, "--at", t, "--quiet", env={"EBB_CRASH_AT": point})
            assert r.returncode == -signal.SIGKILL, f"{point} not reached: exit {r.returncode} {r.stderr}"
            if _state(path)[0] == t:
                assert point == "update.after_commit:1"
                return
        r = ebb("load", path, parquet, "--at", t, "--quiet", env=NO_CRASH)
        assert r.returncode == 0, r.stderr

    return apply


@pytest.mark.parametrize("mode", [R, N])
def test_concurrent_reader_in_process_updates(tmp_path, mode):
    _run_with_reader(tmp_path, mode, _update_in_process, updates=30)


@pytest.mark.parametrize("mode", [R, N])
def test_concurrent_reader_cli_updates(tmp_path, mode):
    """Updates by ``ebb load`` processes, some of them killed mid-update and retried."""
    _run_with_reader(tmp_path, mode, _crashing_update_by_cli(mode), updates=12)


@pytest.mark.parametrize("mode", [R, N])
def test_open_snapshot_survives_updates(tmp_path, mode):
    """A scan whose snapshot was opened before several updates committed (and garbage
    collection and slot reuse ran) still returns exactly the state it started on."""
    rng = np.random.default_rng(99 + (mode == N))
    path = str(tmp_path / "arc")
    oracle = Oracle()
    with Archive.create(path, config(mode=mode)) as arc:
        bulk = _bulk_rows(rng, 3000)
        arc.load(table_of(bulk, SCHEMA), TAU)
        oracle.load(bulk, TAU)
        for t in (18, 20):
            b = _batch_rows(rng, t, 400, f"u{t}-")
            arc.load(table_of(b, SCHEMA), t)
            oracle.load(b, t)
        want = oracle.scan(20)
        with ArchiveReader(path) as r:
            it = r.scan()
            first = next(it)  # the snapshot is open and sub-index I1 has been read
            probe_snap = arc.snapshot()  # a second open snapshot of the same state
            for t in range(22, 40, DELTA):
                b = _batch_rows(rng, t, 400, f"u{t}-")
                arc.load(table_of(b, SCHEMA), t)
                oracle.load(b, t)
            rest = list(it)
            got = rows_multiset(pa.Table.from_batches([first, *rest]))
            assert got == want, f"{sum((want - got).values())} rows missing, {sum((got - want).values())} extra"
            # the other old snapshot's plan and run files are still those of state 20
            assert probe_snap.time == 20
            old = [b for task in probe_snap.plan(Scan(), 20) for b in probe_snap.read(task)]
            probe_snap.close()
            assert rows_multiset(pa.Table.from_batches(old)) == want
        _assert_matches(path, oracle, 38, "after the updates")
        b = _batch_rows(rng, 40, 400, "u40-")
        arc.load(table_of(b, SCHEMA), 40)  # no reader left: replaced files can go now
        oracle.load(b, 40)
    _assert_matches(path, oracle, 40, "final")
    _assert_clean(path, mode)


# -- 4. a second writer ----------------------------------------------------------------------------
def _small_archive(tmp_path, mode=R):
    rng = np.random.default_rng(5)
    path = str(tmp_path / "arc")
    oracle = Oracle()
    bulk = _bulk_rows(rng, 1000)
    with Archive.create(path, config(mode=mode)) as arc:
        arc.load(table_of(bulk, SCHEMA), TAU)
    oracle.load(bulk, TAU)
    rows = _batch_rows(rng, TAU + DELTA, 200, "next-")
    return path, oracle, rows, _write(rows, tmp_path / "next.parquet")


def test_second_writer_refused_in_process_lock(tmp_path):
    path, oracle, rows, parquet = _small_archive(tmp_path)
    with Archive(path) as arc, arc.writer_lock():
        r = ebb("load", path, parquet, "--at", TAU + DELTA, env=NO_CRASH)
        assert r.returncode == 4, f"exit {r.returncode}\n{r.stderr}"
        assert "another process is updating" in r.stderr
        # readers are not blocked by the writer lock
        _assert_matches(path, oracle, TAU, "while the lock is held")
    assert _state(path) == (TAU, 1), "a refused load changed the archive"
    r = ebb("load", path, parquet, "--at", TAU + DELTA, env=NO_CRASH)
    assert r.returncode == 0, r.stderr
    oracle.load(rows, TAU + DELTA)
    _assert_matches(path, oracle, TAU + DELTA, "after the lock was released")


HOLDER = r"""
import os, sys, time
from ebb.storage.archive import Archive
path, ready, stop = sys.argv[1:4]
with Archive(path) as arc, arc.writer_lock():
    open(ready, "w").close()
    deadline = time.monotonic() + 60
    while not os.path.exists(stop) and time.monotonic() < deadline:
        time.sleep(0.01)
"""


def test_a_held_lock_file_is_lock_held_an_archive_busy(tmp_path):
    """``exclusive_lock`` on a file another open file holds: LockHeld (naming the file) once the
    wait is over, an ArchiveBusy (exit code 4) that ``Archive.writer_lock`` rewords."""
    lock = str(tmp_path / "LOCK")
    with exclusive_lock(lock):  # flock: a second open file of the same process conflicts too
        with pytest.raises(LockHeld) as e:
            with exclusive_lock(lock, wait_s=0.05):
                pass
    assert str(e.value) == lock and isinstance(e.value, ArchiveBusy) and e.value.exit_code == EXIT_BUSY
    with exclusive_lock(lock):  # released
        pass


def test_second_writer_refused_other_process(tmp_path):
    path, oracle, rows, parquet = _small_archive(tmp_path, N)
    ready, stop = str(tmp_path / "ready"), str(tmp_path / "stop")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, path, ready, stop], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(ready):
            assert holder.poll() is None, holder.stderr.read()
            assert time.monotonic() < deadline
            time.sleep(0.01)
        r = ebb("load", path, parquet, "--at", TAU + DELTA, env=NO_CRASH)
        assert r.returncode == 4, f"exit {r.returncode}\n{r.stderr}"
        with Archive(path) as arc:
            with pytest.raises(ArchiveBusy):
                arc.load(table_of(rows, SCHEMA), TAU + DELTA)
        assert _state(path) == (TAU, 1)
    finally:
        open(stop, "w").close()
        holder.wait(60)
    assert holder.returncode == 0
    with Archive(path) as arc:
        arc.load(table_of(rows, SCHEMA), TAU + DELTA)
    oracle.load(rows, TAU + DELTA)
    _assert_matches(path, oracle, TAU + DELTA, "after the holder exited")
    _assert_clean(path, N)
