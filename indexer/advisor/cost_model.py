"""The advisor's cost model: seconds per update, probe and scan, and disk bytes, per layout.

The model has two halves, kept apart so that each can be checked on its own:

- **counts** (``layout_sim``): what the engine does for a workload under a layout,
  in expected numbers of things: sub-indices touched, files written, bytes and records a Rebuild
  merge reads, bytes and blocks written, runs walked by deletions; runs, sections, blocks and
  bytes a probe visits; tasks, blocks and bytes a scan reads. They follow from the layout
  (``storage/layout.py``), the mode and the workload's statistics alone.
- **machine constants** (``Calibration``): seconds per unit of each count, measured on this
  machine by ``ebb advise --calibrate`` (``calibrate``) with micro-benchmarks of ebb's
  own storage code, never fitted to the benchmarks the model is validated against.

A time is the sum over counts of count x constant (docs/advisor.md lists each term). Which updates
the prediction describes is a ``Schedule``: the steady state (the long-run average, what an
archive costs once its first S has passed), or the first N updates after the initial bulk load
(what ``ebb bench --updates N`` measures, with its medians). ``rank`` orders the candidate
layouts by the total cost of a ``Mix`` of probes and scans per update.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from ...storage.disk_format import BLOCK_ENTRY_BYTES, INT_KEY, PAGE_BYTES, PAGE_SUM
from ...storage.errors import UsageError
from ...storage.layout import Layout
from ...storage.tuning import DEFAULT_BLOCK_BYTES
from .layout_sim import PROBE_FEATURES, SCAN_FEATURES, UPDATE_FEATURES, Flow, Trace, simulate

DESCRIPTOR_BLOCK_BYTES = BLOCK_ENTRY_BYTES + 2 * INT_KEY.itemsize  # a BLOCK entry and its first and last int key
PAGE_SUM_SHARE = PAGE_SUM.itemsize / PAGE_BYTES  # a page sum per page of every block
RUN_METADATA_BYTES = 256  # a live run's entry in the state and its descriptor's head (approximate)
RANDOM_SEED = 0x5EED  # random partitioning is predicted with this hash seed
WAVE_NS = (4, 9, 16, 25)
SHAPES = ((2, 2), (3, 3), (4, 4), (5, 5), (2, 8), (8, 2))
PARTITIONINGS = {"round-robin": "", "chronological": "-chr", "random": "-rand"}


@dataclass(frozen=True)
class Calibration:
    """Seconds per unit of each count (``layout_sim.UPDATE_FEATURES``, ``PROBE_FEATURES``,
    ``SCAN_FEATURES``; "fixed" is seconds per operation), and where they were measured."""

    update: dict[str, float]
    probe: dict[str, float]
    scan: dict[str, float]
    measured: dict[str, object] = field(default_factory=dict)  # machine, commit, time, load, fit quality

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict, what: str) -> "Calibration":
        """A calibration from its JSON form; UsageError naming ``what`` if a constant is missing
        or not a non-negative number."""
        if not isinstance(d, dict):
            raise UsageError(f"{what}: not a calibration (expected a JSON object)")
        parts = {}
        for part, names in (("update", UPDATE_FEATURES), ("probe", PROBE_FEATURES), ("scan", SCAN_FEATURES)):
            got = d.get(part)
            if not isinstance(got, dict):
                raise UsageError(f"{what}: no {part!r} constants; run `ebb advise --calibrate` again")
            for name in names:
                v = got.get(name)
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                    raise UsageError(f"{what}: {part}.{name} must be a non-negative number, got {v!r}")
            parts[part] = {name: float(got[name]) for name in names}
        measured = d.get("measured", {})
        return Calibration(parts["update"], parts["probe"], parts["scan"], measured if isinstance(measured, dict) else {})


@dataclass(frozen=True)
class WorkloadProfile:
    """The statistics of a workload the model needs (docs/advisor.md, "Inputs")."""

    delta: int  # chronons between updates
    p: int  # S / Delta
    rate: float  # records handed to each update, on average
    rate_cv: float  # their coefficient of variation from update to update
    exp_offsets: tuple[float, ...]  # h[a], a = 0..p: fraction expiring a slots after the update (a = 0: dropped)
    keys: int  # distinct search keys
    record_bytes: float  # stored bytes per record (encoded row and ebb's hidden insertion slot)
    visible_bytes: float  # bytes per record as a read returns it
    block_overhead_bytes: float  # bytes an encoded block adds to its rows (IPC message header, padding)
    block_bytes: int = DEFAULT_BLOCK_BYTES  # the archive's block size setting
    source: str = ""  # where the statistics come from
    notes: tuple[str, ...] = ()  # assumptions made deriving them

    def __post_init__(self) -> None:
        h = np.asarray(self.exp_offsets, dtype=float)
        if self.p < 1 or h.shape != (self.p + 1,):
            raise UsageError(f"a profile needs p >= 1 and p + 1 expiration fractions, got p={self.p} and {h.size}")
        if (h < 0).any() or not 0.99 < h.sum() < 1.01 or h[1:].sum() <= 0:
            raise UsageError("the expiration fractions must be non-negative, sum to 1 and keep some records")
        if self.rate <= 0 or self.keys < 1 or self.record_bytes <= 0 or self.delta < 1:
            raise UsageError(f"a profile needs a positive rate, keys, record size and Delta "
                             f"(rate={self.rate}, keys={self.keys}, record_bytes={self.record_bytes}, Delta={self.delta})")

    @property
    def live_records(self) -> float:
        """Records stored in the steady state: each update's records live a slots for a of them."""
        h = np.asarray(self.exp_offsets)
        return float(self.rate * (np.arange(self.p + 1) * h).sum())

    def flow(self) -> Flow:
        return Flow(self.rate, np.asarray(self.exp_offsets, dtype=float), self.keys, self.record_bytes, self.visible_bytes,
                    self.block_overhead_bytes)


@dataclass(frozen=True)
class Candidate:
    """One layout the advisor can recommend, named as ``ebb bench`` names configurations."""

    layout: str  # "doubly" | "wave"
    mode: str  # "rebuild" | "norebuild"
    partitioning: str = "round-robin"  # doubly
    split: str = "insertion"  # wave
    G: int = 1
    E: int = 1
    n: int = 1  # wave
    section_slots: int = 1  # NoRebuild, sub-indices not chosen by expiration slot

    @property
    def name(self) -> str:
        wide = f"-s{self.section_slots}" if self.section_slots > 1 else ""
        if self.layout == "wave":
            return f"{'R' if self.mode == 'rebuild' else 'D'}-{'ins' if self.split == 'insertion' else 'exp'}{self.n}{wide}"
        return f"{'Rebuild' if self.mode == 'rebuild' else 'NoRebuild'}{self.G}x{self.E}{PARTITIONINGS[self.partitioning]}{wide}"

    def layout_obj(self, p: int) -> Layout:
        if self.layout == "wave":
            return Layout(kind="wave", p=p, split=self.split, n_wave=self.n)
        return Layout(kind="doubly", p=p, G=self.G, E=self.E, partitioning=self.partitioning, seed=RANDOM_SEED)

    def settings(self) -> dict:
        """The layout settings of ``storage.config.build_config`` (and of a job's [archive])."""
        wide = {"section_slots": self.section_slots} if self.section_slots > 1 else {}
        if self.layout == "wave":
            return {"layout": "wave", "mode": self.mode, "split": self.split, "n": self.n, **wide}
        return {"layout": "doubly", "mode": self.mode, "partitioning": self.partitioning, "G": self.G, "E": self.E, **wide}


def candidates(p: int) -> list[Candidate]:
    """Every layout the advisor weighs for p = S/Delta slots: wave n in 4, 9, 16, 25 split by
    insertion or expiration, and doubly partitioned 2x2, 3x3, 4x4, 5x5, 2x8, 8x2 with round-robin,
    chronological or random partitioning, each in Rebuild and NoRebuild mode (layouts with more
    partitions than slots are left out: they cannot be built or leave sub-indices empty). Sections
    wider than a slot are modelled (an archive's own layout, ``candidate_of``) but not weighed:
    docs/advisor.md, "Limits", says why."""
    out = []
    for mode in ("rebuild", "norebuild"):
        out += [Candidate("wave", mode, split=s, n=n) for s in ("insertion", "expiration") for n in WAVE_NS if n <= p]
        out += [Candidate("doubly", mode, partitioning=part, G=g, E=e) for part in PARTITIONINGS for g, e in SHAPES
                if part != "chronological" or max(g, e) <= p]
    return out


@dataclass(frozen=True)
class Schedule:
    """Which updates a prediction describes. ``updates=None``: the steady state, the mean over one
    cycle of p updates after p updates of warm-up. ``updates=N``: updates 1..N after the initial
    bulk load at tau, each followed by a probe, a scan after those in ``scan_slots`` (all if
    empty), summarised by medians as ``ebb bench`` does."""

    updates: int | None = None
    scan_slots: tuple[int, ...] = ()

    def describe(self) -> str:
        if self.updates is None:
            return "steady state (mean over a cycle of p updates)"
        return f"updates 1..{self.updates} after the bulk load (medians, as `ebb bench --updates {self.updates}`)"


@dataclass(frozen=True)
class Mix:
    """Reads expected per update."""

    probes: float = 10.0
    scans: float = 1.0


@dataclass(frozen=True)
class Prediction:
    """What one candidate is predicted to cost (seconds, bytes), with the counts behind it."""

    candidate: Candidate
    update_s: float
    update_sd_s: float  # from the rate's variation between updates
    probe_s: float
    scan_s: float
    disk_bytes: float
    touched: float  # sub-indices per update
    read_bytes: float  # per update (Rebuild merges)
    written_bytes: float  # per update
    probe_sections: float  # (run, section) pairs a probe plans
    probe_blocks: float
    probe_bytes: float
    stored_share: float  # the largest records stored / records valid after an update (> 1: wide sections)

    def total(self, mix: Mix) -> float:
        return self.update_s + mix.probes * self.probe_s + mix.scans * self.scan_s

    def to_dict(self, mix: Mix) -> dict:
        d = {k: v for k, v in asdict(self).items() if k != "candidate"}
        return {"layout": self.candidate.name, "settings": self.candidate.settings(), **d, "total_s": self.total(mix)}


def _times(coef: dict[str, float], counts: dict[str, np.ndarray]) -> np.ndarray:
    return sum(coef[f] * counts[f] for f in coef)


def predict(profile: WorkloadProfile, cand: Candidate, cal: Calibration, schedule: Schedule = Schedule()) -> Prediction:
    """The predicted costs of ``cand`` for ``profile`` on the machine of ``cal``."""
    p, lay = profile.p, cand.layout_obj(profile.p)
    if schedule.updates is None:  # Rebuild's blocks need p updates of history
        tr = simulate(lay, cand.mode, profile.flow(), profile.block_bytes, bulk=False, warmup=p, steps=p,
                      section_slots=cand.section_slots)
        scans, agg = slice(None), np.mean
    else:
        tr = simulate(lay, cand.mode, profile.flow(), profile.block_bytes, bulk=True, warmup=0, steps=schedule.updates,
                      section_slots=cand.section_slots)
        scans, agg = [s - 1 for s in schedule.scan_slots if 1 <= s <= schedule.updates] or slice(None), np.median
    upd = _times(cal.update, tr.update)
    sd = profile.rate_cv * _rate_sensitivity(profile, cand, cal, tr)
    return Prediction(
        candidate=cand, update_s=float(agg(upd)), update_sd_s=float(np.mean(sd)),
        probe_s=float(agg(_times(cal.probe, tr.probe))), scan_s=float(agg(_times(cal.scan, tr.scan)[scans])),
        disk_bytes=float(np.mean(tr.live_bytes * (1 + PAGE_SUM_SHARE) + tr.live_blocks * DESCRIPTOR_BLOCK_BYTES
                                 + tr.live_runs * RUN_METADATA_BYTES)),
        touched=float(np.mean(tr.update["touched"])), read_bytes=float(np.mean(tr.update["read_bytes"])),
        written_bytes=float(np.mean(tr.update["written_bytes"])), probe_sections=float(np.mean(tr.probe["sections"])),
        probe_blocks=float(np.mean(tr.probe["blocks"])), probe_bytes=float(np.mean(tr.probe["bytes"])),
        stored_share=float(np.max(tr.kept_expired)),
    )


def _rate_sensitivity(profile: WorkloadProfile, cand: Candidate, cal: Calibration, tr: Trace) -> np.ndarray:
    """d(update seconds)/d(log rate), per update, for independent relative changes of each
    slot's rate: the update's own batch (planned, written) and, in Rebuild, every earlier slot's
    records the merge reads and writes again (``Trace.rewrite_spread``)."""
    c, rb = cal.update, profile.record_bytes
    stored = 1.0 - profile.exp_offsets[0]
    batch = profile.rate * (c["input_records"] + rb * c["input_bytes"] + stored * rb * c["written_bytes"])
    old = 0.0
    if cand.mode == "rebuild":
        old = rb * (c["read_bytes"] + c["written_bytes"]) + c["read_records"]
    return np.sqrt(batch ** 2 + (old * tr.rewrite_spread) ** 2)


def rank(profile: WorkloadProfile, cal: Calibration, mix: Mix, schedule: Schedule = Schedule(),
         among: list[Candidate] | None = None) -> list[Prediction]:
    """Predictions for ``among`` (default: every candidate for the profile's p), cheapest total
    for ``mix`` first."""
    cands = candidates(profile.p) if among is None else among
    return sorted((predict(profile, c, cal, schedule) for c in cands), key=lambda pr: pr.total(mix))


def candidate_of(config: dict) -> Candidate:
    """The candidate an archive configuration (``asdict(ArchiveConfig)``) has."""
    wide = int(config.get("section_slots", 1))
    if config["layout"] == "wave":
        return Candidate("wave", config["mode"], split=config["split"], n=int(config["n_wave"]), section_slots=wide)
    return Candidate("doubly", config["mode"], partitioning=config["partitioning"], G=int(config["G"]), E=int(config["E"]),
                     section_slots=wide)
