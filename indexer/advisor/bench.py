"""The layout advisor beside ``ebb bench``: a benchmark workload's statistics from its
definition (``tools/workloads.py``), the schedule a run followed, and how a ranking compares with
a run's recorded summary (``docs/benchmarks/summary-WORKLOAD.csv``): the Spearman rank
correlation of predicted and measured update and probe times over the doubly partitioned layouts,
and how far the measured total cost of the layout the advisor recommends (among those measured)
lies from the best measured total. docs/advisor.md reports the validation run.

The workloads and their schedules are ``ebb bench``'s (``tools.workloads``, ``tools.bench_cmd``),
imported where they are used: importing this module imports nothing of ebb.tools.
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ...storage.disk_format import INS_SLOT_BYTES
from ...storage.errors import UsageError
from .cost_model import Candidate, Mix, Prediction, Schedule, WorkloadProfile, candidates
from .workload_profile import block_overhead, uniform_lifetime_offsets

if TYPE_CHECKING:
    from ...tools.workloads import Workload


def workload_profile(w: Workload) -> WorkloadProfile:
    """The statistics of a benchmark workload: uniform keys, lifetimes uniform in [1, S],
    ``per_slot`` records per update varying as its rate factors do, records of ``record_bytes``
    (four int64 columns and the payload's binary columns)."""
    import pyarrow as pa

    from ...tools.workloads import FIXED_COLUMNS_BYTES

    factors = w.rate_factors()[w.p:]
    row = FIXED_COLUMNS_BYTES + w.payload_bytes + 4 * w.payload_columns  # a binary value carries a 4-byte offset
    types = (pa.int64(),) * 4 + (pa.binary(),) * w.payload_columns
    return WorkloadProfile(
        delta=w.delta, p=w.p, rate=float(w.per_slot), rate_cv=float(factors.std() / factors.mean()),
        exp_offsets=tuple(uniform_lifetime_offsets(w.delta, w.p).tolist()), keys=w.keys, record_bytes=row + INS_SLOT_BYTES,
        visible_bytes=float(row), block_overhead_bytes=block_overhead(types),
        source=f"workload {w.name} (tools/workloads.py): {w.description}")


def bench_schedule(name: str, updates: int | None = None) -> Schedule:
    """What ``ebb bench NAME [--updates N]`` runs: its updates, a scan after every K-th."""
    from ...tools.bench_cmd import SCHEDULES

    default, scan_every, _ = SCHEDULES[name]
    u = updates or default
    return Schedule(updates=u, scan_slots=tuple(range(scan_every, u + 1, scan_every)))


def recorded_schedule(summary: str) -> Schedule | None:
    """The schedule of the run a summary came from (its plan-WORKLOAD.json beside it), if known."""
    plan = os.path.join(os.path.dirname(summary), os.path.basename(summary).replace("summary-", "plan-").replace(".csv", ".json"))
    if not os.path.exists(plan):
        return None
    with open(plan) as f:
        d = json.load(f)
    return Schedule(updates=int(d["updates"]), scan_slots=tuple(int(s) for s in d["scan_slots"]))


def measured_layouts(summary: str) -> dict[str, dict[str, float]]:
    """ebb's layouts in a summary: name -> update_s, probe_s, scan_s (warm medians)."""
    with open(summary, newline="") as f:
        return {r["config"]: {k: float(r[k]) for k in ("update_s", "probe_s", "scan_s")}
                for r in csv.DictReader(f) if r["family"] in ("doubly", "wave")}


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rank correlation: Pearson's of the ranks (ties get their mean rank)."""
    def ranks(v: np.ndarray) -> np.ndarray:
        order = np.argsort(v, kind="stable")
        r = np.empty(v.size)
        r[order] = np.arange(v.size, dtype=float)
        _, inv, counts = np.unique(v, return_inverse=True, return_counts=True)
        return (np.bincount(inv, r) / counts)[inv]
    return float(np.corrcoef(ranks(np.asarray(x, float)), ranks(np.asarray(y, float)))[0, 1])


@dataclass(frozen=True)
class Comparison:
    """A ranking beside a recorded run."""

    doubly: tuple[str, ...]  # the doubly partitioned layouts compared
    spearman_update: float
    spearman_probe: float
    recommended: str  # the advisor's pick among the measured layouts
    recommended_total_s: float  # its measured total for the mix
    best: str  # the measured layout with the lowest measured total
    best_total_s: float

    @property
    def excess(self) -> float:
        """How much more the recommended layout's measured total is than the best's (0.05 = 5%)."""
        return self.recommended_total_s / self.best_total_s - 1.0

    def to_dict(self) -> dict:
        return {"doubly_layouts": list(self.doubly), "spearman_update": self.spearman_update,
                "spearman_probe": self.spearman_probe, "recommended": self.recommended,
                "recommended_measured_total_s": self.recommended_total_s, "best_measured": self.best,
                "best_measured_total_s": self.best_total_s, "excess": self.excess}


def measured_candidates(summary: str, p: int) -> list[Candidate]:
    """The candidates a summary has measurements of."""
    names = measured_layouts(summary)
    return [c for c in candidates(p) if c.name in names]


def compare(predictions: list[Prediction], summary: str, mix: Mix) -> Comparison:
    """``predictions`` (of the layouts the summary measured, any order) beside the summary."""
    meas = measured_layouts(summary)
    pred = {pr.candidate.name: pr for pr in predictions if pr.candidate.name in meas}
    doubly = tuple(n for n, pr in pred.items() if pr.candidate.layout == "doubly")
    if len(doubly) < 3:
        raise UsageError(f"{summary}: fewer than three doubly partitioned layouts to compare with")
    rho_u = spearman(np.array([pred[n].update_s for n in doubly]), np.array([meas[n]["update_s"] for n in doubly]))
    rho_p = spearman(np.array([pred[n].probe_s for n in doubly]), np.array([meas[n]["probe_s"] for n in doubly]))
    total = {n: m["update_s"] + mix.probes * m["probe_s"] + mix.scans * m["scan_s"] for n, m in meas.items() if n in pred}
    rec = min(pred, key=lambda n: pred[n].total(mix))
    best = min(total, key=total.get)
    return Comparison(doubly, rho_u, rho_p, rec, total[rec], best, total[best])
