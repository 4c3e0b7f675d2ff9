"""The advisor's calibration: the cost model's machine constants, measured by micro-benchmarks
(``ebb advise --calibrate``).

The advisor's cost model (``cost_model``) predicts a time as a sum of counts (bytes a
Rebuild merge reads, blocks written, sections a probe plans, ...; ``layout_sim``)
times seconds per unit. This module measures those seconds on this machine with ebb's own
storage code. It builds eight small archives (about 400 MB written in all), each designed so
that some count varies on its own:

1. and 2. Rebuild merges of 1000-byte records, one sub-index of 128 MB and one of 16 MB (the
   per-byte part of a merge apart from its fixed part), small and 16 MB batches;
3. the same with 150-byte records (the per-record part of a merge);
4. NoRebuild writes of 4-32 MB batches, one half made of already expired records (planning
   apart from writing);
5. the same with blocks an eighth the size (the per-block part of a write);
6. and 7. a 5x5 doubly partitioned index, Rebuild and NoRebuild, with little data (the
   per-sub-index and per-file part of an update: NoRebuild touches sub-indices it writes no
   file for);
8. a NoRebuild index collecting 40 runs (the per-run part of deletions and of probes).

It times every update as ``ebb bench`` does (``tools.measure.measure``, page cache warm), then
probes of random keys and full scans of each archive (a scan's consumer reads one column of every
batch, as ``ebb bench``'s does), and takes every operation's counts from the engine itself
(update records, read plans, run descriptors). The constants are the coefficients of a
non-negative least-squares fit of the times (relative errors) on the counts: one fit for
updates, one for probes, one for scans. Nothing here looks at benchmark results.

The timing and the description of the machine are ``ebb bench``'s own (``tools.measure``,
``tools.machine``), imported when a calibration runs: importing this module imports nothing of
ebb.tools.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pyarrow as pa

from ...storage.archive import Archive
from ...storage.block_format import row_sizes
from ...storage.config import build_config
from ...storage.disk_format import INS_SLOT_BYTES
from ...storage.read_plan import Probe, Scan
from .cost_model import Calibration
from .layout_sim import PROBE_FEATURES, SCAN_FEATURES, UPDATE_FEATURES

MB = 1_000_000
DELTA = 1000  # chronons per update in every micro-benchmark archive
PROBES_PER_STATE = 12
REPEATS = 3  # each probe and scan is timed this often; the median counts


@dataclass(frozen=True)
class Observation:
    """One timed operation and the counts the engine reported for it."""

    family: str  # "update" | "probe" | "scan"
    counts: dict[str, float]
    seconds: float


@dataclass(frozen=True)
class Micro:
    """One micro-benchmark archive and the updates it is put through."""

    title: str
    layout: str
    mode: str
    p: int
    record_bytes: int
    keys: int
    bulk_bytes: int
    batches: tuple[tuple[int, float], ...]  # (bytes, fraction already expired) per periodic update
    G: int = 1
    E: int = 1
    block_bytes: int | None = None


MICROS = (
    Micro("Rebuild merges, 1000-byte records", "wave", "rebuild", 16, 1000, 100, 128 * MB,
          ((200_000, 0.0),) * 4 + ((16 * MB, 0.0),) * 2),
    Micro("Rebuild merges, 1000-byte records, smaller", "wave", "rebuild", 16, 1000, 100, 16 * MB,
          ((200_000, 0.0),) * 4),
    Micro("Rebuild merges, 150-byte records", "wave", "rebuild", 16, 150, 1000, 24 * MB, ((30_000, 0.0),) * 4),
    Micro("NoRebuild writes", "wave", "norebuild", 32, 1000, 100, 1 * MB,
          ((4 * MB, 0.0), (16 * MB, 0.0), (32 * MB, 0.0), (16 * MB, 0.5), (8 * MB, 0.0))),
    Micro("NoRebuild writes, 8 KiB blocks", "wave", "norebuild", 32, 1000, 100, 1 * MB,
          ((4 * MB, 0.0), (16 * MB, 0.0), (32 * MB, 0.5)), block_bytes=64 << 10),
    Micro("Rebuild 5x5, many sub-indices", "doubly", "rebuild", 10, 500, 100, 5 * MB, ((500_000, 0.0),) * 6, G=5, E=5),
    Micro("NoRebuild 5x5, many sub-indices", "doubly", "norebuild", 10, 500, 100, 5 * MB, ((500_000, 0.0),) * 6,
          G=5, E=5),
    Micro("NoRebuild, 40 runs", "wave", "norebuild", 64, 500, 100, 2 * MB, ((150_000, 0.0),) * 40),
)


def records(rng: np.random.Generator, ts: np.ndarray, exp: np.ndarray, record_bytes: int, keys: int) -> pa.Table:
    """Records with these times, uniform keys and a random binary payload filling each record to
    ``record_bytes`` (24 bytes of integers)."""
    n, pb = ts.size, max(1, record_bytes - 24)
    offsets = pa.py_buffer((np.arange(n + 1, dtype=np.int32) * pb).tobytes())
    payload = pa.Array.from_buffers(pa.binary(), n, [None, offsets, pa.py_buffer(rng.bytes(n * pb))])
    return pa.table({"key": rng.integers(0, keys, n, dtype=np.int64), "ts": ts, "exp": exp, "payload": payload})


def consume(batches) -> int:
    """What a scan's consumer does here: reads one column of every batch (as ``ebb bench``'s
    scan sums ``seq``), so a scan's time includes handing each block's records to someone."""
    import pyarrow.compute as pc

    return sum(int(pc.sum(b.column(0)).as_py() or 0) for b in batches)


def stored_bytes(table: pa.Table) -> float:
    """Stored bytes per record as the model counts them: the encoded row and the insertion slot."""
    return float(row_sizes(table).mean()) + INS_SLOT_BYTES


class MicroArchive:
    """One micro-benchmark archive: timed updates, probes and scans with the engine's counts."""

    def __init__(self, root: str, spec: Micro, seed: int):
        self.spec = spec
        self.rng = np.random.default_rng(seed)
        self.S = spec.p * DELTA
        cfg = build_config(layout=spec.layout, mode=spec.mode, interval=DELTA, max_lifetime=self.S, start=0,
                           G=spec.G if spec.layout == "doubly" else None, E=spec.E if spec.layout == "doubly" else None,
                           n=1 if spec.layout == "wave" else None, block_bytes=spec.block_bytes)
        self.archive = Archive.create(os.path.join(root, f"micro-{seed}"), cfg)
        self.slot = 0
        self.observations: list[Observation] = []

    def close(self) -> None:
        self.archive.close()

    def bulk(self) -> None:
        """The initial load at tau = 0 (untimed): records valid at 0, expiring in slots 1..p."""
        sp, S = self.spec, self.S
        n = max(1, sp.bulk_bytes // sp.record_bytes)
        exp = self.rng.integers(1, S + 1, n, dtype=np.int64)
        ts = exp - S + self.rng.integers(0, S - exp + 1)  # valid at 0, lifetime at most S
        t = records(self.rng, ts, exp, sp.record_bytes, sp.keys)
        self.archive.load(t, 0)

    def update(self, nbytes: int, expired: float) -> None:
        """One timed periodic update of ``nbytes`` of records, the fraction ``expired`` of them
        already expired (dropped by the plan, never written)."""
        from ...tools.measure import measure  # as `ebb bench` times an update

        sp, S = self.spec, self.S
        self.slot += 1
        at = self.slot * DELTA
        n = max(1, nbytes // sp.record_bytes)
        dead = int(n * expired)
        ts = self.rng.integers(at - DELTA + 1, at, n, dtype=np.int64)
        exp = np.concatenate([ts[dead:] + self.rng.integers(1, S + 1, n - dead, dtype=np.int64),
                              np.full(dead, at, dtype=np.int64)])  # the first ``dead`` expire at once
        table = records(self.rng, np.concatenate([ts[dead:], ts[:dead]]), exp, sp.record_bytes, sp.keys)
        rb = stored_bytes(table)
        before = self.archive.state()
        rec, sample = measure(lambda: self.archive.load(table, at))
        touched = [i - 1 for i in rec["subindices_touched"]]
        c = {f: 0.0 for f in UPDATE_FEATURES}
        c.update(fixed=1.0, input_records=rec["input_rows"], input_bytes=rec["input_rows"] * rb,
                 touched=len(touched), files=sum(1 for s in rec["per_subindex"] if s["blocks_written"]),
                 read_bytes=rec["bytes_read"], read_records=rec["bytes_read"] / rb, written_bytes=rec["bytes_written"],
                 written_blocks=rec["blocks_written"], runs_touched=sum(len(before.subindices[i].runs) for i in touched))
        self.observations.append(Observation("update", c, sample.wall_s))

    def reads(self) -> None:
        """Timed probes of random keys and a timed scan of the current state."""
        from ...query.reader import ArchiveReader
        from ...tools.measure import measure  # as `ebb bench` times a probe and a scan

        reader = ArchiveReader(self.archive)
        for key in self.rng.integers(0, self.spec.keys, PROBES_PER_STATE).tolist():
            counts = self._probe_counts(key)
            times = []
            for _ in range(REPEATS):
                table, sample = measure(lambda: reader.probe(key))
                times.append(sample.wall_s)
            counts["result_bytes"] = float(table.nbytes)
            self.observations.append(Observation("probe", counts, float(np.median(times))))
        with self.archive.snapshot() as snap:
            tasks = snap.plan(Scan())
        counts = {"fixed": 1.0, "tasks": float(len(tasks)), "blocks": float(sum(len(t.blocks) for t in tasks)),
                  "bytes": float(sum(t.bytes for t in tasks))}
        times = [measure(lambda: consume(reader.scan()))[1].wall_s for _ in range(REPEATS)]
        self.observations.append(Observation("scan", counts, float(np.median(times))))

    def _probe_counts(self, key: int) -> dict[str, float]:
        """Runs and sections the plan walks, and the blocks and bytes it reads, for ``key``."""
        with self.archive.snapshot() as snap:
            tasks = snap.plan(Probe((key,)))
            runs = sections = 0
            for sub in snap.state.subindices:
                for run in sub.runs:
                    if run.max_exp <= snap.time:
                        continue
                    bounds = snap.descriptor(run.name).section_bounds
                    runs += 1
                    sections += sum(1 for s in range(len(bounds) - 1) if bounds[s + 1] > run.first_live)
        return {"fixed": 1.0, "runs": float(runs), "sections": float(sections),
                "blocks": float(sum(len(t.blocks) for t in tasks)), "bytes": float(sum(t.bytes for t in tasks)),
                "result_bytes": 0.0}


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """min |a x - b| subject to x >= 0 (Lawson and Hanson's active-set method)."""
    n = a.shape[1]
    x = np.zeros(n)
    active = np.zeros(n, dtype=bool)
    tol = 1e-12 * max(1.0, float(np.abs(a).max()))
    for _ in range(3 * n):
        w = a.T @ (b - a @ x)
        if active.all() or w[~active].max() <= tol:
            break
        active[np.flatnonzero(~active)[np.argmax(w[~active])]] = True
        while True:
            z = np.zeros(n)
            z[active] = np.linalg.lstsq(a[:, active], b, rcond=None)[0]
            if (z[active] > tol).all():
                x = z
                break
            shrink = active & (z <= tol)
            alpha = float(np.min(x[shrink] / (x[shrink] - z[shrink])))
            x = x + alpha * (z - x)
            active &= x > tol
            x[~active] = 0.0
    return x


def fit(observations: list[Observation], family: str, features: tuple[str, ...]) -> tuple[dict[str, float], dict]:
    """Seconds per unit of each count: non-negative least squares on relative errors."""
    obs = [o for o in observations if o.family == family]
    y = np.array([o.seconds for o in obs])
    x = np.array([[o.counts[f] for f in features] for o in obs])
    scale = np.where(np.abs(x).max(axis=0) > 0, np.abs(x).max(axis=0), 1.0)
    coef = nnls(x / scale / y[:, None], np.ones(y.size)) / scale
    rel = np.abs(x @ coef - y) / y
    return dict(zip(features, coef.tolist())), {"points": int(y.size), "median_rel_error": round(float(np.median(rel)), 4),
                                                 "max_rel_error": round(float(rel.max()), 4)}


def calibrate(directory: str | None, say: Callable[[str], None]) -> Calibration:
    """Runs every micro-benchmark (about a minute) in a new directory under ``directory``
    (default: the system's temporary directory) and returns the fitted constants."""
    root = tempfile.mkdtemp(prefix="ebb-calibrate-", dir=directory)
    load0, t0 = os.getloadavg(), time.perf_counter()
    observations: list[Observation] = []
    try:
        for i, spec in enumerate(MICROS, 1):
            t1 = time.perf_counter()
            m = MicroArchive(root, spec, seed=i)
            try:
                m.bulk()
                half = len(spec.batches) // 2
                for nbytes, expired in spec.batches[:half]:
                    m.update(nbytes, expired)
                m.reads()
                for nbytes, expired in spec.batches[half:]:
                    m.update(nbytes, expired)
                m.reads()
            finally:
                m.close()
            observations += m.observations
            say(f"[{i}/{len(MICROS)}] {spec.title}: {len(spec.batches)} updates, {2 * PROBES_PER_STATE} probes, "
                f"2 scans ({time.perf_counter() - t1:.1f} s)")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    update, qu = fit(observations, "update", UPDATE_FEATURES)
    probe, qp = fit(observations, "probe", PROBE_FEATURES)
    scan, qs = fit(observations, "scan", SCAN_FEATURES)
    from ...tools.machine import describe as describe_machine  # as `ebb bench` records it

    machine = describe_machine(directory or tempfile.gettempdir(), bandwidth_bytes=0)  # no disk test
    measured = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "ebb_commit": machine["ebb_commit"], "cpu": machine["cpu"],
        "cores": os.cpu_count(), "filesystem": machine["filesystem"],
        "load_average_before": [round(x, 2) for x in load0], "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "seconds": round(time.perf_counter() - t0, 1), "fit": {"update": qu, "probe": qp, "scan": qs},
    }
    return Calibration(update, probe, scan, measured)


def save(cal: Calibration, path: str) -> None:
    """Writes ``cal`` as JSON to ``path`` (its directory created if needed), atomically."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(cal.to_dict(), f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


MEANING = {
    "update.fixed": "an update's fixed work (transaction, commit, recovery and garbage checks)",
    "update.input_records": "per record handed to an update (validation, slots, sort)",
    "update.input_bytes": "per byte handed to an update (reordering the batch)",
    "update.touched": "per touched sub-index",
    "update.files": "per run file written (create, fsync, directory entry, later removal)",
    "update.read_bytes": "per byte a Rebuild merge reads (pread, checksum, decode, filter)",
    "update.read_records": "per record a Rebuild merge reads (merge sort)",
    "update.written_bytes": "per byte written to new runs (encode, checksum, write, fsync)",
    "update.written_blocks": "per block written",
    "update.runs_touched": "per live run of a touched sub-index (deletion bookkeeping)",
    "probe.fixed": "a probe's fixed work (snapshot, ordering)",
    "probe.runs": "per live run the plan visits",
    "probe.sections": "per live (run, section) the plan searches",
    "probe.blocks": "per block read",
    "probe.bytes": "per byte read",
    "probe.result_bytes": "per byte returned",
    "scan.fixed": "a scan's fixed work",
    "scan.tasks": "per read task (run or 64 MiB piece)",
    "scan.blocks": "per block read",
    "scan.bytes": "per byte read",
}


def describe(cal: Calibration) -> str:
    """The constants in readable units (a rate for per-byte costs), one per line, with the
    fit's quality; 0 where a count showed no cost of its own beyond the others'."""
    lines = []
    for part in ("update", "probe", "scan"):
        fit_q = cal.measured.get("fit", {}).get(part, {})
        lines.append(f"{part} ({fit_q.get('points', '?')} timings, median error {100 * fit_q.get('median_rel_error', 0):.0f}%):")
        for name, v in getattr(cal, part).items():
            if not v:
                value = f"{0:8d}   "  # no effect of its own beyond the other terms
            elif name.endswith("bytes"):
                value = f"{1 / v / 1e9:8.2f} GB/s"
            elif name == "fixed":
                value = f"{v * 1e3:8.3f} ms"
            else:
                value = f"{v * 1e6:8.2f} us"
            lines.append(f"  {value}  {MEANING[f'{part}.{name}']}")
    return "\n".join(lines)
