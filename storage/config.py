"""An archive's configuration: what ``ebb init`` sets (``migrate`` may change the layout), built and checked here.

``build_config`` is the one place that turns user settings into an ``ArchiveConfig``: it applies
the defaults, rounds S up to a multiple of Delta (docs/spec.md section 1) and refuses settings
that cannot make a working archive, with a message naming the setting. The CLI and the Spark
scheduler both call it.
"""

from __future__ import annotations

import datetime as dt
import json
import secrets
from dataclasses import asdict, dataclass

import numpy as np

from .disk_format import RESERVED_PREFIX
from .errors import ConfigError
from .layout import Layout
from .timemodel import MAX_TIME, TimeModel
from .tuning import DEFAULT_BLOCK_BYTES

MAX_SUBINDICES = 1024
MAX_SLOTS = 1_000_000  # the largest p = S / Delta of an archive; per-slot tables (stats, plans) are O(p)
MIN_BLOCK_BYTES, MAX_BLOCK_BYTES = 256, 64 << 20
DEFAULT_UPDATE_LOG = 1000
MAX_UPDATE_LOG = 1_000_000
# time units whose chronons can be shown as timestamps (with an ``origin``): microseconds per chronon
TIME_UNITS_US = {"us": 1, "ms": 1_000, "s": 1_000_000, "min": 60_000_000, "h": 3_600_000_000}


@dataclass(frozen=True)
class ArchiveConfig:
    """What ``ebb init`` sets: the time model and columns for the archive's life, the layout
    until ``migrate`` changes it. Build it with ``build_config``."""

    layout: str  # "doubly" | "wave"
    partitioning: str  # doubly: round-robin | chronological | random
    split: str  # wave: insertion | expiration
    G: int
    E: int
    n_wave: int
    mode: str  # "rebuild" | "norebuild"
    tau: int
    delta: int
    max_lifetime: int  # S, a multiple of delta
    key_column: str = "key"
    ts_column: str = "ts"
    exp_column: str = "exp"
    accept_overlong: bool = False
    block_bytes: int = DEFAULT_BLOCK_BYTES  # target size of a data block
    seed: int = 0  # random partitioning's hash seed
    time_unit: str | None = None  # informational: what one chronon is
    # informational: the instant of chronon 0 (ISO 8601, UTC); with a unit of TIME_UNITS_US, readers
    # show chronons as timestamps. Absent from the stored JSON when None, as in archives made before it
    origin: str | None = None
    # history kept for reads ``as_of`` an earlier instant (chronons; 0: only the current version)
    retain: int = 0
    update_log: int = DEFAULT_UPDATE_LOG  # update records kept (older ones only in the totals)
    # NoRebuild: expiration slots per section of a run (``section_slot``). Absent from the stored
    # JSON when 1, as in archives made before it
    section_slots: int = 1

    @property
    def time(self) -> TimeModel:
        return TimeModel(self.tau, self.delta, self.max_lifetime)

    @property
    def layout_obj(self) -> Layout:
        return Layout(
            kind=self.layout, p=self.time.p, G=self.G, E=self.E, partitioning=self.partitioning,
            split=self.split, n_wave=self.n_wave, seed=self.seed,
        )

    @property
    def n(self) -> int:
        return self.layout_obj.n

    @property
    def mode_text(self) -> str:
        """The mode as people read it: "rebuild", "norebuild", "norebuild, sections of 2 slots"."""
        return self.mode + (f", sections of {self.section_slots} slots" if self.section_slots > 1 else "")

    def section_slot(self, k_exp: np.ndarray) -> np.ndarray:
        """The section that records of expiration slots ``k_exp`` are written to in a NoRebuild run:
        the last slot of their group of ``section_slots`` consecutive slots, so that a section is
        dropped whole when its last slot expires (its earlier slots' records, expired, stay stored
        until then; reads filter them out). Fewer, larger sections mean fewer blocks per probe."""
        k_exp = np.asarray(k_exp, dtype=np.int64)
        if self.mode != "norebuild" or self.section_slots == 1:
            return k_exp
        return (k_exp // self.section_slots) * self.section_slots + (self.section_slots - 1)

    def to_json(self) -> bytes:
        d = asdict(self)
        if d["origin"] is None:  # such a configuration stays readable by an ebb that predates ``origin``
            del d["origin"]
        if d["section_slots"] == 1:  # likewise for ``section_slots``
            del d["section_slots"]
        return json.dumps(d, sort_keys=True).encode()

    @staticmethod
    def from_json(data: bytes) -> "ArchiveConfig":
        return ArchiveConfig(**json.loads(data))


def build_config(*, layout: str, mode: str, interval: int, max_lifetime: int, start: int = 0,
                 partitioning: str = "round-robin", G: int | None = None, E: int | None = None,
                 split: str = "insertion", n: int | None = None, key_column: str = "key",
                 ts_column: str = "ts", exp_column: str = "exp", accept_overlong: bool = False,
                 block_bytes: int | None = None, seed: int | None = None,
                 time_unit: str | None = None, retain: int = 0,
                 update_log: int = DEFAULT_UPDATE_LOG, origin: str | None = None,
                 section_slots: int = 1) -> ArchiveConfig:
    """A checked configuration with defaults applied (G = E = 2, n = 4, 512 KiB blocks, a fresh
    seed for random partitioning, sections one slot wide). Raises ConfigError naming the first bad setting."""
    for name, v in (("--interval (Delta)", interval), ("--max-lifetime (S)", max_lifetime)):
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ConfigError(f"{name} must be a positive integer number of chronons, got {v!r}")
    if not -MAX_TIME <= start <= MAX_TIME:
        raise ConfigError(f"--start (tau) must lie within +-{MAX_TIME} chronons, got {start}")
    if max_lifetime > MAX_TIME:
        raise ConfigError(f"--max-lifetime (S) must be at most {MAX_TIME} chronons, got {max_lifetime}")
    tm = TimeModel.create(start, interval, max_lifetime)
    if tm.p > MAX_SLOTS:
        raise ConfigError(
            f"S/Delta = {tm.p} slots; ebb supports at most {MAX_SLOTS} (raise --interval or lower --max-lifetime)")
    if mode not in ("rebuild", "norebuild"):
        raise ConfigError(f"--mode must be rebuild or norebuild, got {mode!r}")
    if layout == "doubly":
        if n is not None:
            raise ConfigError("--n is for wave indices; a doubly partitioned index takes --G and --E")
        G, E = (2 if G is None else G), (2 if E is None else E)
        if partitioning not in ("round-robin", "chronological", "random"):
            raise ConfigError(f"--partitioning must be round-robin, chronological or random, got {partitioning!r}")
        if G < 1 or E < 1:
            raise ConfigError(f"--G and --E must be at least 1, got G={G} E={E}")
        if partitioning == "chronological" and (G > tm.p or E > tm.p):
            raise ConfigError(f"chronological partitioning needs G and E at most p = S/Delta = {tm.p} "
                              f"(got G={G}, E={E}); more partitions would stay empty")
        n_wave, count = 1, G * E
    elif layout == "wave":
        if G is not None or E is not None:
            raise ConfigError("--G/--E are for doubly partitioned indices; a wave index takes --n")
        n_wave = 4 if n is None else n
        if split not in ("insertion", "expiration"):
            raise ConfigError(f"--split must be insertion or expiration, got {split!r}")
        if not 1 <= n_wave <= tm.p:
            raise ConfigError(f"a wave index needs 1 <= n <= p = S/Delta = {tm.p}, got n={n_wave}")
        G = E = 1
        count = n_wave
    else:
        raise ConfigError(f"--layout must be doubly or wave, got {layout!r}")
    if count > MAX_SUBINDICES:
        raise ConfigError(f"at most {MAX_SUBINDICES} sub-indices, got {count}")
    block_bytes = DEFAULT_BLOCK_BYTES if block_bytes is None else block_bytes
    if not MIN_BLOCK_BYTES <= block_bytes <= MAX_BLOCK_BYTES:
        raise ConfigError(f"--block-bytes must be between {MIN_BLOCK_BYTES} and {MAX_BLOCK_BYTES}, got {block_bytes}")
    cols = (key_column, ts_column, exp_column)
    if len(set(cols)) != 3:
        raise ConfigError("the key, ts and exp columns must be three different columns")
    for c in cols:
        if not c or c.startswith(RESERVED_PREFIX):
            raise ConfigError(f"column name {c!r} is not allowed (empty, or starts with the reserved {RESERVED_PREFIX!r})")
    if not isinstance(retain, int) or isinstance(retain, bool) or not 0 <= retain <= MAX_TIME:
        raise ConfigError(f"--retain must be a whole number of chronons from 0 to {MAX_TIME}, got {retain!r}")
    if not isinstance(update_log, int) or isinstance(update_log, bool) or not 1 <= update_log <= MAX_UPDATE_LOG:
        raise ConfigError(f"--update-log must be a whole number of update records from 1 to {MAX_UPDATE_LOG}, "
                          f"got {update_log!r}")
    if origin is not None:
        origin = normalize_origin(origin)
    if not isinstance(section_slots, int) or isinstance(section_slots, bool) or not 1 <= section_slots <= tm.p:
        raise ConfigError(f"--section-slots must be a whole number of slots from 1 to p = S/Delta = {tm.p}, "
                          f"got {section_slots!r}")
    if section_slots > 1 and (mode != "norebuild" or not (layout == "wave" and split == "insertion"
                                                         or layout == "doubly" and E == 1)):
        # a section is deleted at its last slot, by the update that deletes that slot: only where
        # no sub-index is chosen by expiration slot does that update reach every slot of the group
        raise ConfigError("--section-slots above 1 needs --mode norebuild and sub-indices that do not depend on "
                          "the expiration slot: a wave index split by insertion, or doubly partitioned with E = 1")
    if seed is None:
        seed = secrets.randbits(63) if layout == "doubly" and partitioning == "random" else 0
    return ArchiveConfig(
        layout=layout, partitioning=partitioning if layout == "doubly" else "round-robin",
        split=split if layout == "wave" else "insertion", G=G, E=E, n_wave=n_wave, mode=mode,
        tau=tm.tau, delta=tm.delta, max_lifetime=tm.max_lifetime, key_column=key_column, ts_column=ts_column,
        exp_column=exp_column, accept_overlong=bool(accept_overlong), block_bytes=int(block_bytes), seed=int(seed),
        time_unit=time_unit, retain=int(retain), update_log=int(update_log), origin=origin,
        section_slots=int(section_slots),
    )


def origin_us(text: str) -> int:
    """Microseconds since the Unix epoch of an ISO 8601 instant (UTC when it names no zone)."""
    try:
        t = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except (ValueError, AttributeError):
        raise ConfigError(f"--origin: {text!r} is not an ISO 8601 timestamp (e.g. 2026-01-01T00:00:00Z)") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.timezone.utc)
    return (t - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)) // dt.timedelta(microseconds=1)


def normalize_origin(text: str) -> str:
    """``text`` checked and written as UTC ISO 8601 with a trailing Z, as it is stored."""
    return format_origin(origin_us(text))


def format_origin(us: int) -> str:
    """Microseconds since the Unix epoch as UTC ISO 8601 with a trailing Z."""
    t = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(microseconds=us)
    return t.strftime("%Y-%m-%dT%H:%M:%S" + (".%f" if t.microsecond else "") + "Z")


def check_config(cfg: ArchiveConfig) -> ArchiveConfig:
    """Re-checks a configuration built elsewhere (for example read back from JSON)."""
    return build_config(
        layout=cfg.layout, mode=cfg.mode, interval=cfg.delta, max_lifetime=cfg.max_lifetime, start=cfg.tau,
        partitioning=cfg.partitioning, G=cfg.G if cfg.layout == "doubly" else None,
        E=cfg.E if cfg.layout == "doubly" else None, split=cfg.split,
        n=cfg.n_wave if cfg.layout == "wave" else None, key_column=cfg.key_column, ts_column=cfg.ts_column,
        exp_column=cfg.exp_column, accept_overlong=cfg.accept_overlong, block_bytes=cfg.block_bytes,
        seed=cfg.seed if (cfg.seed or cfg.partitioning != "random") else None, time_unit=cfg.time_unit,
        retain=cfg.retain, update_log=cfg.update_log, origin=cfg.origin, section_slots=cfg.section_slots,
    )
