"""The schedule of one benchmark run, shared by every configuration: which workload, how many
updates, after which updates a scan runs and which slots are measured with a cold cache.

Cold slots are drawn at random (seeded by the workload) so they do not alias with round-robin
rows; they are the same for every configuration, so every store is measured cold on the same
updates. Saved as ``plan.json`` next to the results.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .workloads import WORKLOADS, Workload


@dataclass
class Plan:
    workload: str
    configs: list[str]
    out: Path
    updates: int
    scan_slots: list[int] = field(default_factory=list)
    cold_slots: list[int] = field(default_factory=list)

    @staticmethod
    def create(workload: str, configs: list[str], out: Path, updates: int | None, scan_every: int, cold_every: int) -> "Plan":
        w = WORKLOADS[workload]
        u = w.updates if updates is None else updates
        if u < 1:
            raise ValueError("--updates must be at least 1")
        if scan_every < 1:
            raise ValueError("--scan-every must be at least 1")
        scans = [j for j in range(1, u + 1) if j % scan_every == 0] or [u]
        cold: list[int] = []
        if cold_every > 0:
            rng = np.random.default_rng([w.seed, 0xC01D])
            k = max(1, len(scans) // cold_every)
            cold = sorted(int(x) for x in rng.choice(scans, size=k, replace=False))
        return Plan(workload, configs, out, u, scans, cold)

    @property
    def workload_obj(self) -> Workload:
        return WORKLOADS[self.workload].with_updates(self.updates)

    def disable_cold(self) -> None:
        self.cold_slots = []

    def ops_per_config(self) -> int:
        cold_scans = len(set(self.cold_slots) & set(self.scan_slots))
        return 1 + 2 * self.updates + len(self.scan_slots) + len(self.cold_slots) + cold_scans

    def job(self, config: str, store_dir: str, ops_csv: str) -> dict:
        return {"workload": self.workload, "updates": self.updates, "config": config, "store_dir": store_dir,
                "ops_csv": ops_csv, "scan_slots": self.scan_slots, "cold_update_slots": self.cold_slots,
                "cold_read_slots": self.cold_slots}

    def save(self) -> None:
        d = asdict(self)
        d["out"] = str(self.out)
        (self.out / "plan.json").write_text(json.dumps(d, indent=2))

    @staticmethod
    def load(out: Path) -> "Plan":
        d = json.loads((Path(out) / "plan.json").read_text())
        d["out"] = Path(d["out"])
        return Plan(**d)
