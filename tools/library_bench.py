"""Library-level comparison of ebb with the stores a user would otherwise pick (issue 25): every
store side by side in one run, every figure from plain timed calls of the store's public API
(``time.perf_counter()`` around the call alone: no garbage collection before it, no sampler
thread beside it, unlike ``ebb bench``'s per-operation harness).

Workload ``library`` (tools/workloads.py): many-keys' records, 1,000,000 uniform int64 keys and
200-byte records, at about 180 MB live (900,000 records), a bulk load then 8 updates.
``--scale`` shrinks the records per update and the keys alike, for a quick check.

Stores (``--stores``, any names tools/configs.parse accepts; default Rebuild2x2, NoRebuild4x4,
sqlite, rocksdb, lmdb), plus with ``--string-keys`` (the default) a string-key variant of each
ebb layout (``LAYOUT-str``): the same records with the key ``sensor-0000000``..``sensor-0999999``
(converted with Arrow's kernels before the timed load), probed with the same key numbers as
strings. The steps run in processes of their own:

1. build: creates the store, bulk-loads it, then runs the 8 updates, each timed by
   ``perf_counter`` around ``Store.load`` alone (the batch is generated before): the median.
2. read, in a new process that opens the store fresh (ebb: an ``ArchiveReader`` of its own
   opened from the path, which never saw the writer): 200 warm-up probes; the 10,000 unique
   random keys of the batch (step 3) one ``probe`` at a time (the check that the batch answers
   alike, and its time); a full scan (the fastest of 3).
3. ``--passes`` passes of the warm probes once every store is built and read, each pass one new
   process that opens every store fresh: each store's 200 warm-up probes, then 2,000 probes of
   random keys a store, each timed alone, every answer consumed (rows counted, ``seq`` summed),
   in stretches of PROBE_STRETCH probes, the stores taking turns stretch by stretch (each
   stretch starting one store further on, and each store's stretch with STRETCH_WARMUP
   untimed probes). The machine's speed drifts (on the bench machine a
   store's p50 moved by up to 2x between runs with its code unchanged, and by as much between
   passes a store at a time, seconds apart), and a store measured while it was slow carried
   that into every ratio; stretches of a few milliseconds meet the drift alike. Probe p50, p99
   and mean are over every pass's probes, and each pass's p50 is kept to show the spread. Then
   BATCH_ROUNDS rounds of one ``Store.probe_many`` of the 10,000 batch keys a store, the stores
   taking turns: the batch per key is the fastest over every pass's rounds. (It was timed in
   step 2, store after store, the fastest of 3 runs whose first paid for mapping the pages in:
   the faster of two runs of 30 ms, met by the drift alone.)
4. last (they drop the page cache every warm read above relied on), in one process, ``--cold``
   rounds (default 20) of every store: close them all, check nothing under any is still open or
   mapped, drop the page cache once (root only; skipped with a note otherwise), reopen them all
   (untimed, as a serving process opens once: ebb reads its runs' block directories there,
   RocksDB its index and filter blocks), then time one probe of a fresh random key in each
   store, each 0.3 s after the last reopen or probe (reads they started in the background are
   done by then, and the process has been idle, as a serving process is between requests: a
   cold probe pays for the CPU's caches too, docs/io.md), the stores taking turns to go first
   -> each store's p50. Measured store after
   store, a slow stretch of the disk landed on one store (RocksDB's cold p50 ranged from 0.38
   to 0.98 ms between such runs on the bench machine); in rounds, every store meets it alike.

Keys are drawn by ``Workload.random_keys`` with fixed streams, so every store probes the same keys;
every answer is checked against a brute-force oracle computed from the generated records, and
the stores against each other. Output: a markdown table on stdout and in ``--out``/library.md,
everything in ``--out``/library.json (per store: update median, warm probe p50/p99/mean, cold
p50, batch per key and its speedup over the same store's single-probe mean, scan; and the ratios
the issue's acceptance asks for), with the machine (tools/machine.py) and the commit. Progress
goes to stderr. With ``--out`` docs/benchmarks/library, docs/benchmarks.md is rewritten to
include the run. The stores live under ``--dir`` (default a new directory under /tmp) and are
removed at the end unless ``--keep``.

Run: ``python -m ebb.tools.library_bench`` (``--help`` for the options).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

WORKLOAD = "library"
DEFAULT_STORES = "Rebuild2x2,NoRebuild4x4,sqlite,rocksdb,lmdb"
WARMUP_PROBES, PROBES, BATCH_KEYS, SCAN_RUNS, COLD_PROBES = 200, 2000, 10_000, 3, 20
# timed batches of each store a pass, taking turns: the pass's first meets pages its process has
# not mapped in yet (each pass is a new process), the second does not
BATCH_ROUNDS = 2
# before each cold probe: the reads that the reopens, and the store probed before, started in the
# background (read-ahead) are done; LMDB's cold probe left 36 ms of them to the store after it
COLD_SETTLE_S = 0.3
PROBE_PASSES = 5  # passes of the warm probes, the stores taking turns (module docstring, step 3)
PROBE_STRETCH = 200  # a store's timed probes in a row before the next store's turn, within a pass
# untimed probes that start each stretch: the first probe after another store's turn meets the
# CPU's caches full of that store's code and data, and with a stretch every 100 probes such
# first probes are the 1% of a store's probes its p99 is made of
STRETCH_WARMUP = 5
# Workload.random_keys streams: independent draws, the same for every store
WARMUP_STREAM, PROBE_STREAM, BATCH_STREAM, COLD_STREAM = 0x25A, 0x25B, 0x25C, 0x25D
STRING_SUFFIX = "-str"


@dataclass
class Job:
    """What one child process does (JSON between the parent and the child)."""

    label: str  # the store as reported: a configuration name, or LAYOUT-str
    config: str  # tools/configs name
    string_keys: bool
    scale: float
    path: str
    result: str  # where the child writes its JSON
    warmup: int = WARMUP_PROBES
    probes: int = PROBES
    batch: int = BATCH_KEYS
    cold: int = COLD_PROBES

    def workload(self):
        from .workloads import WORKLOADS

        return WORKLOADS[WORKLOAD].scaled(self.scale)


def _log(msg: str) -> None:
    print(f"library_bench: {msg}", file=sys.stderr, flush=True)


# -- the stores and their keys ---------------------------------------------------------------------
def entries(stores: list[str], string_keys: bool) -> list[tuple[str, str, bool]]:
    """(label, configuration, string keys) of every store to run: each of ``stores``, and after
    them a string-key variant of each ebb layout."""
    from .configs import parse

    out = [(name, name, False) for name in stores]
    if string_keys:
        out += [(name + STRING_SUFFIX, name, True) for name in stores if parse(name).family != "peer"]
    return out


def _store(job: Job):
    from .configs import parse
    from .run_config import make_store

    config = parse(job.config)
    if job.string_keys and config.family == "peer":
        raise ValueError(f"{job.config}: string keys are run for ebb layouts only")
    return make_store(config, job.path, job.workload())


class Keys:
    """A store's probe arguments for key numbers: the int64 keys themselves, or (string-key
    stores) their strings, converted before any timing."""

    def __init__(self, job: Job):
        from .workloads import key_digits

        self.strings = job.string_keys
        self.digits = key_digits(job.workload().keys)

    def single(self, keys):
        """Arguments of ``Store.probe``, one per key."""
        from .workloads import string_keys

        return string_keys(keys, self.digits).to_pylist() if self.strings else keys.tolist()

    def batch(self, keys):
        """The argument of ``Store.probe_many``."""
        from .workloads import string_keys

        return string_keys(keys, self.digits) if self.strings else keys

    def table(self, table):
        from .workloads import with_string_keys

        return with_string_keys(table, self.digits) if self.strings else table


# -- the child processes ---------------------------------------------------------------------------
def build(job: Job) -> dict:
    """Creates the store, bulk-loads it and runs the updates, each timed alone."""
    import numpy as np

    from .measure import dir_size_bytes

    w = job.workload()
    keys = Keys(job)
    if os.path.exists(job.path):
        shutil.rmtree(job.path)
    os.makedirs(job.path)
    store = _store(job)
    store.create()
    try:
        bulk = keys.table(w.bulk())
        t0 = time.perf_counter()
        store.load(bulk, 0)
        bulk_s = time.perf_counter() - t0
        _log(f"{job.label}: bulk load of {bulk.num_rows:,} records {bulk_s:.2f} s")
        del bulk
        update_s = []
        for j in range(1, w.updates + 1):
            batch = keys.table(w.batch(j))
            t0 = time.perf_counter()
            store.load(batch, w.time_of(j))
            update_s.append(time.perf_counter() - t0)
            _log(f"{job.label}: update {j}/{w.updates} of {batch.num_rows:,} records {update_s[-1]:.3f} s")
    finally:
        store.close()
    return {"bulk_s": bulk_s, "update_s": update_s, "update_median_s": float(np.median(update_s)),
            "disk_bytes": dir_size_bytes(job.path)}


def _pct(times, q: float) -> float:
    import numpy as np

    return float(np.percentile(times, q)) if len(times) else float("nan")


def warm_up(store, job: Job) -> None:
    """The untimed warm-up probes of ``store``."""
    w, keys = job.workload(), Keys(job)
    at = w.time_of(w.updates)
    for k in keys.single(w.random_keys(job.warmup, WARMUP_STREAM)):
        store.probe(k, at)


def probe_pass(jobs: list[Job]) -> dict[str, dict]:
    """One pass of the warm probes of every store of ``jobs`` (step 3), in this process, which
    opens them all fresh: each store's times (``probe_s``) and answers, by label."""
    import gc

    from .run_config import time_probes

    w = jobs[0].workload()
    at, keys = w.time_of(w.updates), w.random_keys(jobs[0].probes, PROBE_STREAM)
    rewarm = w.random_keys(STRETCH_WARMUP, WARMUP_STREAM)
    bkeys = w.random_keys(jobs[0].batch, BATCH_STREAM, unique=True)
    out = {job.label: {"probe_s": [], "rows": 0, "seq_sum": 0, "batch_s": [], "batch_answers": []} for job in jobs}
    stores = []
    try:
        for job in jobs:
            store = _store(job)
            store.open()
            stores.append((job, store, Keys(job).single(keys), Keys(job).single(rewarm)))
            warm_up(store, job)
        batches = {job.label: Keys(job).batch(bkeys) for job in jobs}
        gc.collect()  # not the opens' or the warm-ups' garbage in the timed probes
        for n, a in enumerate(range(0, len(keys), PROBE_STRETCH)):
            for job, store, args, again in stores[n % len(stores):] + stores[:n % len(stores)]:
                for k in again:
                    store.probe(k, at)
                times, rows, seq = time_probes(store, args[a:a + PROBE_STRETCH], at)
                r = out[job.label]
                r["probe_s"] += times.tolist()
                r["rows"], r["seq_sum"] = r["rows"] + rows, r["seq_sum"] + seq
        for n in range(BATCH_ROUNDS):
            for job, store, _, _ in stores[n % len(stores):] + stores[:n % len(stores)]:
                t0 = time.perf_counter()
                res = store.probe_many(batches[job.label], at)
                out[job.label]["batch_s"].append(time.perf_counter() - t0)
                out[job.label]["batch_answers"].append([res.rows, res.seq_sum])
    finally:
        for _, store, _, _ in stores:
            store.close()
    for label, r in out.items():
        _log(f"{label}: {len(r['probe_s'])} probes: p50 {_pct(r['probe_s'], 50) * 1e6:.1f} us, "
             f"p99 {_pct(r['probe_s'], 99) * 1e6:.1f} us")
    return out


def read(job: Job) -> dict:
    """Opens the built store fresh and measures its warm reads (module docstring, step 2)."""
    from .run_config import time_probes

    w = job.workload()
    at = w.time_of(w.updates)
    keys = Keys(job)
    store = _store(job)
    t0 = time.perf_counter()
    store.open()
    out: dict = {"open_s": time.perf_counter() - t0}
    try:
        warm_up(store, job)

        bkeys = w.random_keys(job.batch, BATCH_STREAM, unique=True)
        t0 = time.perf_counter()
        loop_times, loop_rows, loop_seq = time_probes(store, keys.single(bkeys), at)
        loop_s = time.perf_counter() - t0
        out.update(loop_s=loop_s, loop_per_key_s=loop_s / len(bkeys), loop_rows=loop_rows, loop_seq_sum=loop_seq)
        _log(f"{job.label}: the {len(bkeys):,} batch keys one at a time {out['loop_per_key_s'] * 1e6:.2f} us a key")

        scans = []
        for _ in range(SCAN_RUNS):
            t0 = time.perf_counter()
            res = store.scan(at)
            scans.append(time.perf_counter() - t0)
        out.update(scan_s=min(scans), scan_runs_s=scans, scan_rows=res.rows, scan_seq_sum=res.seq_sum)
        _log(f"{job.label}: scan of {res.rows:,} records {min(scans):.3f} s")

    finally:
        store.close()
    return out


def cold_probes(jobs: list[Job]) -> dict[str, dict]:
    """Times ``cold`` probes of fresh keys of every store of ``jobs``, in rounds (step 4): each
    round closes every store, drops the page cache once, reopens them all (untimed), then
    probes each store once, COLD_SETTLE_S after the last reopen or probe, the stores taking
    turns to go first. Each store's cold figures, by label."""
    from .measure import cold_cache_problem
    from .run_config import go_cold_together

    n = jobs[0].cold if jobs else 0
    problem = cold_cache_problem() if n > 0 else "--cold 0"
    out = {j.label: {"cold_probes": 0, "cold_p50_s": None, "cold_probe_s": [], "cold_rows": 0, "cold_seq_sum": 0,
                     "cold_note": problem} for j in jobs}
    if problem is not None:
        _log(f"no cold probes: {problem}")
        return out
    w = jobs[0].workload()
    at, keys = w.time_of(w.updates), w.random_keys(n, COLD_STREAM)
    stores = [(job, _store(job), Keys(job).single(keys)) for job in jobs]
    opened = []
    try:
        for _, store, _ in stores:
            store.open()
            opened.append(store)
        for i in range(n):
            go_cold_together([(store, job.path) for job, store, _ in stores])  # each checked to hold no file
            for job, store, args in stores[i % len(stores):] + stores[:i % len(stores)]:
                time.sleep(COLD_SETTLE_S)
                t0 = time.perf_counter()
                res = store.probe(args[i], at)
                r = out[job.label]
                r["cold_probe_s"].append(time.perf_counter() - t0)
                r["cold_rows"], r["cold_seq_sum"] = r["cold_rows"] + res.rows, r["cold_seq_sum"] + res.seq_sum
    finally:
        for store in opened:
            store.close()
    for label, r in out.items():
        r["cold_probes"], r["cold_p50_s"] = len(r["cold_probe_s"]), _pct(r["cold_probe_s"], 50)
        _log(f"{label}: {r['cold_probes']} cold probes: p50 {r['cold_p50_s'] * 1e6:.0f} us")
    return out


def _child(job: Job, mode: str, root: Path) -> dict | str:
    """Runs step ``mode`` of ``job`` in a process of its own: its result, or what went wrong."""
    job.result = str(root / f"{job.label}.{mode}.json")
    return _run_child(job.label, mode, root, asdict(job), job.result)


def _stores_child(jobs: list[Job], mode: str, root: Path) -> dict | str:
    """Runs step ``mode`` ("probe": ``probe_pass``, "cold": ``cold_probes``) of every store of
    ``jobs`` in one process of its own: each store's result by label, or what went wrong."""
    result = str(root / f"stores.{mode}.json")
    return _run_child("stores", mode, root, {"jobs": [asdict(j) for j in jobs], "result": result}, result)


def _run_child(name: str, mode: str, root: Path, given: dict, result: str) -> dict | str:
    job_file = root / f"{name}.{mode}.job.json"
    job_file.write_text(json.dumps(given))
    proc = subprocess.run([sys.executable, "-m", "ebb.tools.library_bench", "--child", mode, str(job_file)])
    job_file.unlink(missing_ok=True)
    if proc.returncode != 0:
        _log(f"{name}: {mode} failed (exit {proc.returncode}); going on")
        return f"{mode} exited with {proc.returncode}"
    out = json.loads(Path(result).read_text())
    Path(result).unlink()
    return out


def pooled(passes: list[dict], batch_keys: int) -> dict:
    """A store's warm probe figures over every pass's probes, each pass's p50 and p99, and each
    pass's answers; its batch of ``batch_keys`` keys, the fastest of every pass's rounds, and
    each round's answer (every answer is checked against the oracle)."""
    import numpy as np

    times = np.concatenate([np.asarray(p["probe_s"]) for p in passes])
    batch_s = [t for p in passes for t in p["batch_s"]]
    batch_answers = [a for p in passes for a in p["batch_answers"]]
    return {"probe_passes": len(passes), "probe_p50_s": _pct(times, 50), "probe_p99_s": _pct(times, 99),
            "probe_mean_s": float(times.mean()), "probe_max_s": float(times.max()),
            "probe_pass_p50_s": [_pct(p["probe_s"], 50) for p in passes],
            "probe_pass_p99_s": [_pct(p["probe_s"], 99) for p in passes],
            "probe_pass_answers": [[p["rows"], p["seq_sum"]] for p in passes],
            "batch_keys": batch_keys, "batch_s": min(batch_s), "batch_runs_s": batch_s,
            "batch_per_key_s": min(batch_s) / batch_keys, "batch_rows": batch_answers[0][0],
            "batch_seq_sum": batch_answers[0][1], "batch_answers": batch_answers}


def child(mode: str, job_file: str) -> int:
    given = json.loads(Path(job_file).read_text())
    if mode in ("probe", "cold"):  # every store at once
        result, path = {"probe": probe_pass, "cold": cold_probes}[mode]([Job(**j) for j in given["jobs"]]), given["result"]
    else:
        job = Job(**given)
        result, path = {"build": build, "read": read}[mode](job), job.result
    Path(path).write_text(json.dumps(result, indent=1))
    return 0


# -- the oracle ---------------------------------------------------------------------------------------
def oracle(w, probes: int, batch: int, cold: int) -> dict[str, tuple[int, int]]:
    """(rows, seq sum) a correct store returns for each read of ``read`` (with these numbers of
    probes, batch keys and cold probes), from the generated records alone (brute force,
    vectorised)."""
    import numpy as np

    at = w.time_of(w.updates)
    g = w.generated()
    live = (g["ts"] <= at) & (g["exp"] > at)
    key, seq = g["key"][live], g["seq"][live]
    count = np.bincount(key, minlength=w.keys).astype(np.int64)
    total = np.zeros(w.keys, dtype=np.int64)
    np.add.at(total, key, seq)

    def of(keys) -> tuple[int, int]:
        return int(count[keys].sum()), int(total[keys].sum())

    out = {"probe": of(w.random_keys(probes, PROBE_STREAM)), "scan": (int(live.sum()), int(seq.sum()))}
    out["batch"] = out["loop"] = of(w.random_keys(batch, BATCH_STREAM, unique=True))
    out["cold"] = of(w.random_keys(cold, COLD_STREAM))
    return out


def check(results: dict[str, dict], expected: dict[str, tuple[int, int]]) -> list[str]:
    """Every answer that differs from the oracle, as 'store: read: got (rows, seq), want ...'."""
    bad = []
    for label, r in results.items():
        if "error" in r:
            continue
        for read_ in ("probe", "batch", "loop", "scan", "cold"):
            if read_ == "cold" and not r.get("cold_probes"):
                continue
            got = (r[f"{read_}_rows"], r[f"{read_}_seq_sum"])
            if got != expected[read_]:
                bad.append(f"{label}: {read_}: got {got} (rows, seq sum), want {expected[read_]}")
        for n, got in enumerate(r.get("probe_pass_answers", [])[1:], 2):
            if tuple(got) != expected["probe"]:
                bad.append(f"{label}: probe pass {n}: got {tuple(got)} (rows, seq sum), want {expected['probe']}")
        for n, got in enumerate(r.get("batch_answers", [])[1:], 2):
            if tuple(got) != expected["batch"]:
                bad.append(f"{label}: batch {n}: got {tuple(got)} (rows, seq sum), want {expected['batch']}")
    return bad


# -- the comparison -------------------------------------------------------------------------------------
def _ratio(a, b) -> float | None:
    return a / b if a is not None and b else None


def ratios(results: dict[str, dict], kinds: dict[str, tuple[str, bool]]) -> dict:
    """The figures issue 25's acceptance asks for, each ebb / peer (below 1 = ebb faster)."""
    ok = {k: r for k, r in results.items() if "error" not in r}
    ebb = [k for k, (fam, s) in kinds.items() if fam != "peer" and not s and k in ok]

    def best(col: str) -> str | None:
        have = [k for k in ebb if ok[k].get(col) is not None]
        return min(have, key=lambda k: ok[k][col]) if have else None

    sq, rk = ok.get("sqlite"), ok.get("rocksdb")
    out: dict = {}
    b = best("probe_p50_s")
    if b is not None and sq:
        out["warm_p50_vs_sqlite"] = {"ebb": b, "ratio": _ratio(ok[b]["probe_p50_s"], sq["probe_p50_s"])}
        out["warm_p99_vs_sqlite"] = {"ebb": b, "ratio": _ratio(ok[b]["probe_p99_s"], sq["probe_p99_s"])}
    b = best("cold_p50_s")
    if b is not None and rk and rk.get("cold_p50_s"):
        out["cold_p50_vs_rocksdb"] = {"ebb": b, "ratio": _ratio(ok[b]["cold_p50_s"], rk["cold_p50_s"])}
    b = best("batch_per_key_s")
    if b is not None and sq:
        out["batch_per_key_vs_sqlite"] = {"ebb": b, "ratio": _ratio(ok[b]["batch_per_key_s"], sq["batch_per_key_s"])}
    strings = {}
    for k in ebb:
        s = ok.get(k + STRING_SUFFIX)
        if s:
            strings[k] = {"p50": _ratio(s["probe_p50_s"], ok[k]["probe_p50_s"]),
                          "p99": _ratio(s["probe_p99_s"], ok[k]["probe_p99_s"])}
    if strings:
        out["string_vs_int_keys"] = strings
    return out


def _us(x) -> str:
    if x is None:
        return "-"
    x *= 1e6
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def _x(x) -> str:
    return "-" if x is None else f"{x:.2f}x"


def _s(x) -> str:
    return "-" if x is None else f"{x:.3f}" if x < 10 else f"{x:.1f}"


def markdown(report: dict) -> str:
    w, m = report["workload"], report["machine"]
    rows = []
    for label, r in report["stores"].items():
        if "error" in r:
            rows.append(f"| {label} | {r['keys']} | failed: {r['error']} |" + " |" * 9)
            continue
        each = r.get("probe_pass_p50_s") or [r["probe_p50_s"]]
        rows.append(f"| {label} | {r['keys']} | {_s(r['update_median_s'])} | {_us(r['probe_p50_s'])} | "
                    f"{_us(min(each))}-{_us(max(each))} | "
                    f"{_us(r['probe_p99_s'])} | {_us(r['probe_mean_s'])} | {_us(r.get('cold_p50_s'))} | "
                    f"{_us(r['batch_per_key_s'])} | {_x(r['batch_speedup'])} | {_s(r['scan_s'])} | "
                    f"{r['disk_bytes'] / 1e6:.0f} |")
    rt = report["ratios"]
    lines = [
        "# ebb at the library level",
        "",
        f"Workload `{w['name']}`{' at scale ' + str(report['scale']) if report['scale'] != 1 else ''}: "
        f"{w['keys']:,} uniform keys, {w['record_bytes']}-byte records, {w['per_slot']:,} records per update, "
        f"about {w['live_records']:,} live ({w['live_bytes'] / 1e6:.0f} MB); a bulk load then {w['updates']} updates. "
        f"Commit `{report['commit']}`. Machine: {m.get('cpu')}, {m.get('cores')} cores, "
        f"{m.get('memory_bytes', 0) / 2**30:.0f} GiB, Linux {m.get('kernel')}, {m.get('filesystem')}; Python "
        f"{m.get('python')}, SQLite {m.get('sqlite')}; load average at start {m.get('load_average_at_start')}"
        + (f"; proactive reclaim: {m['page_reclaim']}" if m.get("page_reclaim") else "") + ".",
        "",
        "Every figure is of plain calls of the store's API, each timed by `time.perf_counter()` alone. Update: median "
        f"of the {w['updates']} updates. Probes: {report['probes']:,} probes of random keys a store (µs) in each of "
        f"{report['passes']} passes, each pass a new process that opens every store fresh and gives each "
        f"{report['warmup']} warm-up probes, then probes them in stretches of {PROBE_STRETCH}, the stores taking turns (each "
        f"stretch after {STRETCH_WARMUP} untimed probes); "
        "p50, p99 and mean over every pass's probes, and the lowest and highest of the passes' p50s; cold: one probe "
        f"of a fresh key in each of {report['cold']} rounds, each round closing every store, dropping the page cache "
        f"and reopening them all, each probe {COLD_SETTLE_S} s after the last reopen or probe, the stores taking turns "
        "to probe first; p50; batch: "
        f"{report['batch']:,} unique keys in one `probe_many` call, {BATCH_ROUNDS} a store at the end of each pass, the "
        f"stores taking turns (the fastest of the {report['passes'] * BATCH_ROUNDS}), per key, and its speedup "
        f"over the same store's mean single probe; scan: all live records (fastest of {SCAN_RUNS}). `-str`: the same "
        "records keyed by strings `sensor-0000000`...",
        "",
        "| store | keys | update median s | probe p50 µs | passes' p50 µs | probe p99 µs | probe mean µs | "
        "cold p50 µs | batch µs/key | batch speedup | scan s | disk MB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        "Ratios (ebb / peer: below 1 = ebb faster):",
        "",
    ]
    if "warm_p50_vs_sqlite" in rt:
        lines.append(f"- warm probe, best ebb layout ({rt['warm_p50_vs_sqlite']['ebb']}) / SQLite: p50 "
                     f"{_x(rt['warm_p50_vs_sqlite']['ratio'])}, p99 {_x(rt['warm_p99_vs_sqlite']['ratio'])}")
    if "cold_p50_vs_rocksdb" in rt:
        lines.append(f"- cold probe p50, best ebb layout ({rt['cold_p50_vs_rocksdb']['ebb']}) / RocksDB: "
                     f"{_x(rt['cold_p50_vs_rocksdb']['ratio'])}")
    if "batch_per_key_vs_sqlite" in rt:
        lines.append(f"- batch probe per key, best ebb layout ({rt['batch_per_key_vs_sqlite']['ebb']}) / SQLite's "
                     f"IN-list batch: {_x(rt['batch_per_key_vs_sqlite']['ratio'])}")
    for k, v in rt.get("string_vs_int_keys", {}).items():
        lines.append(f"- string keys / int64 keys, {k}: p50 {_x(v['p50'])}, p99 {_x(v['p99'])}")
    if report["cold_note"]:
        lines.append(f"- no cold probes: {report['cold_note']}")
    lines += ["", ("Answers: every store returned the same records as the brute-force oracle for every read."
                   if report["answers_correct"] else "Answers: **WRONG**: " + "; ".join(report["wrong_answers"])),
              "", "Batch probes: ebb's `ArchiveReader.probe_many` and SQLite's `key IN (...)` lists of 500 sorted keys "
              "are batch lookups; RocksDB's and LMDB's Python bindings have no batch prefix lookup, so theirs is the "
              "loop of single probes (`Store.probe_many`'s default), and their batch speedup only compares those keys "
              "with the random probes'."]
    return "\n".join(lines) + "\n"


# -- the parent -----------------------------------------------------------------------------------------
def _commit() -> str:
    try:
        src = Path(__file__).resolve().parents[1]
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=src, capture_output=True, text=True, timeout=10).stdout.strip()
        return head or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def run(args: argparse.Namespace) -> int:
    from .configs import parse
    from .machine import describe
    from .workloads import WORKLOADS

    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    for s in stores:
        parse(s)  # a bad name fails before anything runs
    if not 0 < args.scale <= 1:
        raise SystemExit("library_bench: --scale must be in (0, 1]")
    if args.passes < 1:
        raise SystemExit("library_bench: --passes must be at least 1")
    todo = entries(stores, args.string_keys)
    w = WORKLOADS[WORKLOAD].scaled(args.scale)
    batch = min(args.batch, w.keys // 2)
    made_dir = args.dir is None
    root = Path(args.dir or tempfile.mkdtemp(prefix="ebb-library-bench-", dir="/tmp")).resolve()
    root.mkdir(parents=True, exist_ok=True)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    _log(f"{len(todo)} stores, workload {WORKLOAD} at scale {args.scale}: {w.per_slot:,} records per update, "
         f"{w.keys:,} keys; stores under {root}")
    machine = describe(str(root), args.bandwidth_mib << 20)
    results: dict[str, dict] = {}
    kinds: dict[str, tuple[str, bool]] = {}
    jobs: dict[str, Job] = {}
    passes: dict[str, list[dict]] = {}  # each store's warm probe passes
    t_all = time.time()
    try:
        for i, (label, config, strings) in enumerate(todo, 1):
            kinds[label] = (parse(config).family, strings)
            job = jobs[label] = Job(label, config, strings, args.scale, str(root / label), "", args.warmup,
                                    args.probes, batch, args.cold)
            r: dict = {"config": config, "keys": "string" if strings else "int64"}
            t0 = time.time()
            for mode in ("build", "read"):
                _log(f"[{i}/{len(todo)}] {label}: {mode}")
                got = _child(job, mode, root)
                if isinstance(got, str):
                    r["error"] = got
                    break
                r.update(got)
            results[label] = r
            _log(f"[{i}/{len(todo)}] {label}: done in {time.time() - t0:.0f} s")
        for n in range(1, args.passes + 1):
            live = [label for label, r in results.items() if "error" not in r]
            if not live:
                break
            _log(f"pass {n}/{args.passes} of the warm probes: {len(live)} stores")
            got = _stores_child([jobs[label] for label in live], "probe", root)
            for label in live:
                if isinstance(got, str):
                    results[label]["error"] = f"pass {n}: {got}"
                else:
                    passes.setdefault(label, []).append(got[label])
        for label, done in passes.items():
            r = results[label]
            if "error" not in r:
                r.update(pooled(done, batch), probes=args.probes, probe_rows=done[0]["rows"], probe_seq_sum=done[0]["seq_sum"])
                r["batch_speedup"] = _ratio(r["probe_mean_s"], r["batch_per_key_s"])
        live = [label for label, r in results.items() if "error" not in r]
        if live:  # last: they drop the page cache that every warm read relied on
            _log(f"cold probes: {args.cold} rounds of {len(live)} stores")
            got = _stores_child([jobs[label] for label in live], "cold", root)
            for label in live:
                results[label].update({"error": f"cold probes: {got}"} if isinstance(got, str) else got[label])
    finally:
        if not args.keep:
            for label, _, _ in todo:
                shutil.rmtree(root / label, ignore_errors=True)
            if made_dir:
                shutil.rmtree(root, ignore_errors=True)
    wrong = check(results, oracle(w, args.probes, batch, args.cold))
    notes = {r.get("cold_note") for r in results.values() if "error" not in r} - {None}
    report = {
        "workload": {"name": w.name, "keys": w.keys, "record_bytes": w.record_bytes, "per_slot": w.per_slot,
                     "updates": w.updates, "p": w.p, "live_records": int(w.per_slot * (w.p + 1) / 2),
                     "live_bytes": w.expected_live_bytes, "description": w.description},
        "scale": args.scale, "probes": args.probes, "passes": args.passes, "warmup": args.warmup, "batch": batch,
        "cold": args.cold,
        "commit": _commit(), "ebb_commit": machine.get("ebb_commit"), "machine": machine,
        "stores": results, "ratios": ratios(results, kinds),
        "answers_correct": not wrong, "wrong_answers": wrong, "cold_note": "; ".join(sorted(notes)) or None,
        "failed": [k for k, r in results.items() if "error" in r], "wall_s": time.time() - t_all,
    }
    (out / "library.json").write_text(json.dumps(report, indent=2))
    md = markdown(report)
    (out / "library.md").write_text(md)
    print(md)
    _log(f"results: {out / 'library.md'}, {out / 'library.json'} ({report['wall_s']:.0f} s in all)")
    docs = out.parent.parent
    if out.name == "library" and out.parent.name == "benchmarks" and (docs / "benchmarks.md").exists():
        from .report import rewrite  # the run is published: benchmarks.md includes it

        _log(f"docs: {rewrite(docs)}")
    return 1 if wrong or report["failed"] else 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stores", default=DEFAULT_STORES, metavar="LIST",
                   help=f"comma-separated ebb layouts and peers, as `ebb bench --configs` takes them (default {DEFAULT_STORES})")
    p.add_argument("--string-keys", action=argparse.BooleanOptionalAction, default=True,
                   help="also run each ebb layout with the same records keyed by strings sensor-0000000... (default on)")
    p.add_argument("--scale", type=float, default=1.0, metavar="F",
                   help="records per update and keys times F, e.g. 0.05 for a quick check (default 1: about 180 MB live)")
    p.add_argument("--cold", type=int, default=COLD_PROBES, metavar="N",
                   help=f"rounds of cold probes, one probe of every store a round after one page-cache drop (root only; "
                   f"default {COLD_PROBES}; 0 = none)")
    p.add_argument("--probes", type=int, default=PROBES, metavar="N", help=f"timed warm probes per store (default {PROBES})")
    p.add_argument("--passes", type=int, default=PROBE_PASSES, metavar="N",
                   help=f"passes of the timed probes, each a fresh process that opens every store, the stores taking turns "
                   f"(default {PROBE_PASSES})")
    p.add_argument("--warmup", type=int, default=WARMUP_PROBES, metavar="N",
                   help=f"untimed probes before them (default {WARMUP_PROBES})")
    p.add_argument("--batch", type=int, default=BATCH_KEYS, metavar="N",
                   help=f"unique keys in the probe_many batch (default {BATCH_KEYS}; at most half the keys)")
    p.add_argument("--dir", metavar="DIR", help="where the stores are built (default a new directory under /tmp)")
    p.add_argument("--keep", action="store_true", help="keep the stores at the end")
    p.add_argument("--out", default="bench-results/library", metavar="DIR",
                   help="where library.md and library.json go (default bench-results/library)")
    p.add_argument("--bandwidth-mib", type=int, default=256, metavar="MIB",
                   help="size of the O_DIRECT sequential disk bandwidth test recorded with the machine (default 256; 0 = skip)")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child(argv[1], argv[2])
    p = argparse.ArgumentParser(prog="python -m ebb.tools.library_bench", description=__doc__.split("\n\n")[0],
                                epilog="See the module docstring (tools/library_bench.py) for the method.")
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
