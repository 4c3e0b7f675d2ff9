"""Runs one configuration (an ebb layout or a peer) through a workload's whole schedule, in a
process of its own, and appends one CSV row per measured operation.

Started by ``tools.bench_cmd`` as ``python -m ebb.tools.run_config JOB.json``; a separate process
per configuration keeps memory, open maps and library state of one store from leaking into the
next. Progress goes to stdout as one ``op <name> <slot>`` line per operation (the parent
turns them into a progress bar). The schedule (thesis 4.4.1): bulk load at tau; then for each
update j: the update, one probe of a random key, one full scan; with caches dropped first for
the updates and reads the job marks cold. The bulk load runs in a child process of its own
(``--bulk``), and this process opens the store it left: a real store reaches its size over many
small updates, and memory an allocator keeps after one multi-gigabyte batch (mimalloc, Arrow's
default pool, kept 12 MB after thesis-large's 5 GB) would otherwise be charged to every update.
In a slot with cold reads the order is: update, cold probe, cold scan, then the warm probe and
scan (the cold scan has brought the whole store back into the page cache, so "warm" means what
it says even after a cold update). After each update,
untimed, the row also gets the largest and mean sub-index size (ebb only). Before each cache
drop the store is closed and the run stops with an error if any file under its directory is
still open or mapped, since such pages would survive the drop and make "cold" partly warm.

Timing (tools/measure.py): updates, scans and cold probes run inside ``measure`` (its overhead,
about 0.1 ms, is small against them); a warm probe is timed alone by ``time.perf_counter`` and
repeated through ``measure`` for its I/O and memory (``measure_short``). After the last update,
``LATENCY_PROBES`` probes of random keys (``Workload.random_keys``, the same for every store; at
least ``LATENCY_MIN_PROBES`` of them if they take over ``LATENCY_BUDGET_S`` in all), each timed
alone, in stretches of ``LATENCY_STRETCH`` half a second apart (so that the machine's slow
episodes do not land on one store's probes whole; each pause is followed by one untimed probe), give one ``probe_latency`` row (not in the progress count): ``probes`` is how many,
``wall_s`` their mean time, ``p50_s`` and ``p99_s`` their median and 99th percentile,
``rows``/``seq_sum`` the totals of their answers, and the I/O and memory columns those of the
first ``LATENCY_MEASURED_PROBES`` of them run again through ``measure``. ebb's store
reads through an ``ArchiveReader`` of its own (tools/ebb_store.py), so no probe benefits from
what the writer's update prepared in-process.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace

import numpy as np

from .configs import Config, parse
from .measure import Sample, dir_size_bytes, drop_caches, measure, measure_short, open_handles
from .store import ReadResult, Store
from .workloads import WORKLOADS, Workload

HANDLE_GRACE_S = 5.0
LATENCY_PROBES = 2000  # plain-timed probes after the last update: p50 and p99
# ... but a store whose probes take longer than this in all (Parquet, which reads every file's
# footer and key column per probe: 70 ms each in the quick workload) stops after at least
LATENCY_BUDGET_S = 60.0
LATENCY_MIN_PROBES = 1000  # (issue 25: p50 and p99 over at least 1,000 probes)
LATENCY_MEASURED_PROBES = 200  # of them repeated through ``measure`` for the row's I/O and memory
LATENCY_STREAM = 0x1A7  # Workload.random_keys stream of those probes' keys
# in the quick workload (CI's smoke run): enough to check the row, not a figure (Parquet's 100 probes
# and their measured repeat took 19 of the quick run's 79 s)
QUICK_LATENCY_PROBES = 20
# ... in stretches this many probes long, this long apart: the bench machine runs 1.5-2x slower in
# episodes of 0.25-2 s at random times (docs/benchmarks.md), which one unbroken stretch of 2,000
# probes (about 0.1 s) falls wholly inside or outside; spread over 5 s, every store's probes meet
# the machine in its usual mix of states, as the library tool's stores do by taking turns
LATENCY_STRETCH = 200
LATENCY_GAP_S = 0.5

# per-operation counts a store or the runner supplies; empty where a store has none
EXTRA_COLUMNS = (
    "rows", "deleted", "data_bytes", "seq_sum", "probe_key", "subindices", "blocks_read", "blocks_written",
    "block_bytes", "store_bytes_read", "store_bytes_written", "subidx_max_rows", "subidx_mean_rows",
    "probes", "p50_s", "p99_s",  # a probe_latency row: its probe count, median and 99th percentile,
    "gap_s",  # and the pause between its stretches of LATENCY_STRETCH probes (0: one stretch)
)
COLUMNS = [
    "workload", "config", "family", "technique", "mode", "n", "G", "E", "op", "slot", "cache",
    "wall_s", "os_read_bytes", "os_write_bytes", "os_rchar", "os_wchar", "peak_anon_bytes",
    "base_anon_bytes", *EXTRA_COLUMNS, "disk_bytes",
]


@dataclass
class Job:
    """What one run_config process does (serialised to JSON by the parent)."""

    workload: str
    updates: int
    config: str
    store_dir: str
    ops_csv: str
    scan_slots: list[int] = field(default_factory=list)
    cold_update_slots: list[int] = field(default_factory=list)
    cold_read_slots: list[int] = field(default_factory=list)
    keep_store: bool = False

    def workload_obj(self) -> Workload:
        return WORKLOADS[self.workload].with_updates(self.updates)


def make_store(config: Config, path: str, workload: Workload, follow: bool = False) -> Store:
    """The store of ``config``; ``follow``: ebb's reader follows new versions (tools/ebb_store.py)."""
    if config.family == "peer":
        from .peers import make_peer

        return make_peer(config.name, path, workload)
    from .ebb_store import EbbStore

    return EbbStore(path, workload, config, follow)


class Recorder:
    """Appends rows to the operations CSV and reports progress."""

    def __init__(self, job: Job, config: Config, workload: Workload):
        self.job, self.config, self.workload = job, config, workload
        new = not os.path.exists(job.ops_csv) or os.path.getsize(job.ops_csv) == 0
        self.f = open(job.ops_csv, "a", newline="")
        self.w = csv.DictWriter(self.f, fieldnames=COLUMNS)
        if new:
            self.w.writeheader()

    def row(self, op: str, slot: int, cache: str, s: Sample, extra: dict, disk: int | None = None,
            progress: bool = True) -> None:
        """Appends one row; ``progress``: also an ``op`` line for the parent's progress bar (whose
        total counts the plan's operations, ``Plan.ops_per_config``)."""
        c = self.config
        r = {"workload": self.workload.name, "config": c.name, "family": c.family, "technique": c.technique,
             "mode": c.mode, "n": c.n, "G": c.G, "E": c.E, "op": op, "slot": slot, "cache": cache}
        r.update(s.as_row())
        r.update({k: extra.get(k, "") for k in EXTRA_COLUMNS})
        r["disk_bytes"] = "" if disk is None else disk
        self.w.writerow(r)
        self.f.flush()
        if progress:
            print(f"op {op} {slot} {cache}", flush=True)

    def close(self) -> None:
        self.f.close()


def _read_extra(res: ReadResult, w: Workload, key: int | None = None) -> dict:
    d = {"rows": res.rows, "seq_sum": res.seq_sum, "data_bytes": res.rows * w.record_bytes}
    if key is not None:
        d["probe_key"] = key
    d.update(res.extra)
    return d


def time_probes(store: Store, keys: list, at: int, budget_s: float | None = None,
                min_probes: int = 0, stretch: int = 0, gap_s: float = 0.0) -> tuple[np.ndarray, int, int]:
    """Probes each key of ``keys`` as of ``at``, each call timed alone by ``time.perf_counter``
    (nothing else inside the timed span) and its answer consumed (rows counted, ``seq`` summed by
    the store). With ``budget_s``, stops early once at least ``min_probes`` are done and the probes
    have taken longer than that in all. With ``stretch``, pauses ``gap_s`` (untimed) after every
    ``stretch`` probes, then probes the last key again untimed (its answer not counted): code
    idle for a while runs several times slower on this machine (docs/benchmarks.md, Machine), and
    the pause is the measurement's, not the store's. Returns the times in seconds of the probes
    done, and their total rows and ``seq`` sum."""
    times = np.empty(len(keys))
    rows = seq = 0
    spent = 0.0
    clock = time.perf_counter
    for i, key in enumerate(keys):
        if budget_s is not None and i >= min_probes and spent > budget_s:
            return times[:i], rows, seq
        if stretch and i and i % stretch == 0:
            time.sleep(gap_s)
            store.probe(keys[i - 1], at)
        t0 = clock()
        res = store.probe(key, at)
        times[i] = dt = clock() - t0
        spent += dt
        rows += res.rows
        seq += res.seq_sum
    return times, rows, seq


def probe_latency(store: Store, w: Workload, at: int, n: int = LATENCY_PROBES,
                  gap_s: float = LATENCY_GAP_S) -> tuple[dict, Sample]:
    """``n`` probes of random keys as of ``at``, each timed alone (``time_probes``), in stretches of
    LATENCY_STRETCH probes ``gap_s`` apart, fewer (at least
    LATENCY_MIN_PROBES) if they take longer than LATENCY_BUDGET_S in all; then the first
    LATENCY_MEASURED_PROBES of them again through ``measure`` for their I/O and peak memory.
    Returns the extra columns of the ``probe_latency`` row (``rows`` and ``seq_sum`` are the totals
    of the timed probes) and that sample, with ``wall_s`` the mean time of one timed probe."""
    keys = w.random_keys(n, LATENCY_STREAM).tolist()
    times, rows, seq = time_probes(store, keys, at, LATENCY_BUDGET_S, min(n, LATENCY_MIN_PROBES), LATENCY_STRETCH, gap_s)
    again = keys[:min(len(times), LATENCY_MEASURED_PROBES)]
    _, s = measure(lambda: time_probes(store, again, at))
    p50, p99 = np.percentile(times, [50, 99])
    extra = {"probes": len(times), "p50_s": round(float(p50), 9), "p99_s": round(float(p99), 9), "gap_s": gap_s,
             "rows": rows, "seq_sum": seq, "data_bytes": rows * w.record_bytes}
    return extra, replace(s, wall_s=float(times.mean()))


def go_cold(store: Store, store_dir: str) -> None:
    """Closes the store, checks that it holds nothing under ``store_dir`` open or mapped, drops
    the page cache and reopens it (untimed)."""
    go_cold_together([(store, store_dir)])


def go_cold_together(stores: list[tuple[Store, str]]) -> None:
    """``go_cold`` of every (store, its directory) at once: all closed and checked, the page
    cache dropped once, then all reopened (untimed)."""
    for store, _ in stores:
        store.close()
    for store, store_dir in stores:
        # pyarrow's dataset scanner closes its files on I/O threads after the last batch is
        # returned, so give handles a moment to go before calling them held.
        deadline = time.monotonic() + HANDLE_GRACE_S
        while (held := open_handles(store_dir)) and time.monotonic() < deadline:
            time.sleep(0.01)
        if held:
            raise RuntimeError(f"{store.name}: still open after close(), so a cold measurement would be partly warm: "
                               + ", ".join(held[:5]))
    drop_caches()
    for store, _ in stores:
        store.open()


def _load(store: Store, rec: Recorder, job: Job, w: Workload, op: str, j: int, cold: bool) -> None:
    """Loads slot ``j``'s batch (the bulk for j = 0), measured, and records its row."""
    batch = w.bulk() if j == 0 else w.batch(j)
    counts, s = measure(lambda b=batch: store.load(b, w.time_of(j)))
    new_bytes = batch.num_rows * w.record_bytes
    del batch
    extra = {"rows": counts.get("inserted", 0), "data_bytes": new_bytes, **counts, **store.subindex_balance()}
    rec.row(op, j, "cold" if cold else "warm", s, extra, dir_size_bytes(job.store_dir))


def bulk_load(job: Job) -> None:
    """Creates the store and loads the workload's bulk at tau (one "bulk" row)."""
    w = job.workload_obj()
    config = parse(job.config)
    if os.path.exists(job.store_dir):
        shutil.rmtree(job.store_dir)
    os.makedirs(job.store_dir)
    store = make_store(config, job.store_dir, w)
    rec = Recorder(job, config, w)
    try:
        store.create()
        _load(store, rec, job, w, "bulk", 0, False)
    finally:
        store.close()
        rec.close()


def run(job: Job, job_file: str) -> None:
    w = job.workload_obj()
    config = parse(job.config)
    try:
        subprocess.run([sys.executable, "-m", "ebb.tools.run_config", "--bulk", job_file], check=True)
    except BaseException:
        if not job.keep_store:
            shutil.rmtree(job.store_dir, ignore_errors=True)
        raise
    store = make_store(config, job.store_dir, w)
    rec = Recorder(job, config, w)
    try:
        store.open()
        for j in range(1, w.updates + 1):
            at = w.time_of(j)
            cold = j in job.cold_update_slots
            if cold:
                go_cold(store, job.store_dir)
            _load(store, rec, job, w, "update", j, cold)
            key = w.probe_key(j)
            if j in job.cold_read_slots:  # cold reads first: the cold scan leaves the cache warm again
                go_cold(store, job.store_dir)
                # in the harness: its ~0.1 ms (gc and trim before, the sampler beside) is a few
                # percent of a cold probe, which waits for milliseconds of disk reads, and the CPU
                # caches the trim evicts are cold anyway after the store was just reopened
                res, s = measure(lambda: store.probe(key, at))
                rec.row("probe", j, "cold", s, _read_extra(res, w, key))
                if j in job.scan_slots:
                    go_cold(store, job.store_dir)
                    res, s = measure(lambda: store.scan(at))
                    rec.row("scan", j, "cold", s, _read_extra(res, w))
            res, s = measure_short(lambda: store.probe(key, at))  # timed alone, memory from a repeat
            rec.row("probe", j, "warm", s, _read_extra(res, w, key))
            if j in job.scan_slots:
                res, s = measure(lambda: store.scan(at))
                rec.row("scan", j, "warm", s, _read_extra(res, w))
        quick = job.workload == "quick"
        extra, s = probe_latency(store, w, w.time_of(w.updates), QUICK_LATENCY_PROBES if quick else LATENCY_PROBES,
                                 0.0 if quick else LATENCY_GAP_S)
        rec.row("probe_latency", w.updates, "warm", s, extra, progress=False)  # not one of the plan's operations
    finally:
        store.close()
        rec.close()
        if not job.keep_store:
            shutil.rmtree(job.store_dir, ignore_errors=True)


def main(argv: list[str]) -> int:
    bulk = argv[:1] == ["--bulk"]
    job_file = argv[1] if bulk else argv[0]
    with open(job_file) as f:
        job = Job(**json.load(f))
    if bulk:
        bulk_load(job)
    else:
        run(job, job_file)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
