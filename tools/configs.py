"""The configurations a benchmark runs: ebb's layouts (named as in the thesis) and the peers.

Names follow thesis section 4.4.1: ``R-ins4`` / ``R-exp9`` / ``D-ins16`` / ``D-exp25`` are wave
indices (R = REINDEX, i.e. ebb's rebuild mode; D = DEL, norebuild; ins/exp = split by insertion or
expiration time; the number is n); ``Rebuild4x4`` / ``NoRebuild2x8`` are doubly partitioned
round-robin indices with G x E sub-indices; a ``-chr`` suffix means chronological and ``-rand``
random partitioning; a ``-s<K>`` suffix on a NoRebuild layout whose sub-indices do not depend on
the expiration slot (D-ins, NoRebuild<G>x1) makes its sections K expiration slots wide (``ebb
init --section-slots``), e.g. ``D-ins4-s2``; a ``-b<K>k`` suffix on any layout sets its block
size to K KiB (``ebb init --block-bytes``; ebb's default otherwise), e.g. ``Rebuild2x2-b128k``.
Either suffix makes a line of its own in plots.
Peers are ``sqlite``, ``duckdb``, ``lmdb``, ``rocksdb`` and ``parquet``.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from ..storage.config import MAX_BLOCK_BYTES, MIN_BLOCK_BYTES

PEERS = ("sqlite", "duckdb", "lmdb", "rocksdb", "parquet")
WAVE_NS = (4, 9, 16, 25)
SQUARES = ((2, 2), (3, 3), (4, 4), (5, 5))
SKEWED = ((2, 8), (8, 2))


@dataclass(frozen=True)
class Config:
    """One thing to benchmark: an ebb layout or a peer store."""

    name: str
    family: str  # "wave" | "doubly" | "peer"
    mode: str = ""  # ebb: "rebuild" | "norebuild"
    split: str = ""  # wave: "insertion" | "expiration"
    partitioning: str = ""  # doubly: "round-robin" | "chronological" | "random"
    G: int = 0
    E: int = 0
    n: int = 0
    block_kib: int = 0  # the layout's block size in KiB (0: ebb's default)
    section_slots: int = 1  # NoRebuild: expiration slots per section

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def technique(self) -> str:
        """The line this configuration belongs to in the thesis's plots (n varies along it)."""
        blocks = (f"-s{self.section_slots}" if self.section_slots > 1 else "") + (f"-b{self.block_kib}k" if self.block_kib else "")
        if self.family == "wave":
            return self.name.removesuffix(blocks).rstrip("0123456789") + blocks
        if self.family == "doubly":
            base = "Rebuild" if self.mode == "rebuild" else "NoRebuild"
            return base + {"round-robin": "", "chronological": "-chr", "random": "-rand"}[self.partitioning] + blocks
        return self.name


_SUFFIXES = r"(?:-s([1-9]\d*))?(?:-b([1-9]\d*)k)?$"
_WAVE = re.compile(r"^([RD])-(ins|exp)(\d+)" + _SUFFIXES)
_DOUBLY = re.compile(r"^(Rebuild|NoRebuild)(\d+)x(\d+)(-chr|-rand)?" + _SUFFIXES)


def parse(name: str) -> Config:
    """The configuration a name denotes; ValueError with the accepted forms otherwise."""
    if name in PEERS:
        return Config(name=name, family="peer")
    config = _layout(name)
    if config.block_kib and not MIN_BLOCK_BYTES <= config.block_kib * 1024 <= MAX_BLOCK_BYTES:
        raise ValueError(f"{name}: blocks must be of {MIN_BLOCK_BYTES >> 10} to {MAX_BLOCK_BYTES >> 10} KiB")
    if config.section_slots > 1 and not (config.mode == "norebuild" and (config.split == "insertion" or config.E == 1)):
        raise ValueError(f"{name}: -s<K> is for NoRebuild layouts whose sub-indices do not depend on the "
                         "expiration slot (D-ins<n>, NoRebuild<G>x1)")
    if config.section_slots > 36:
        raise ValueError(f"{name}: sections of at most p = 36 slots")
    return config


def _layout(name: str) -> Config:
    m = _WAVE.match(name)
    if m:
        n = int(m.group(3))
        if not 1 <= n <= 36:
            raise ValueError(f"{name}: a wave index needs 1 <= n <= p = 36")
        return Config(name=name, family="wave", mode="rebuild" if m.group(1) == "R" else "norebuild",
                      split="insertion" if m.group(2) == "ins" else "expiration", n=n,
                      section_slots=int(m.group(4) or 1), block_kib=int(m.group(5) or 0))
    m = _DOUBLY.match(name)
    if m:
        g, e = int(m.group(2)), int(m.group(3))
        part = {None: "round-robin", "-chr": "chronological", "-rand": "random"}[m.group(4)]
        return Config(name=name, family="doubly", mode="rebuild" if m.group(1) == "Rebuild" else "norebuild",
                      partitioning=part, G=g, E=e, n=g * e, section_slots=int(m.group(5) or 1),
                      block_kib=int(m.group(6) or 0))
    raise ValueError(f"unknown configuration {name!r}: expected R-ins<n>, R-exp<n>, D-ins<n>, D-exp<n>, "
                     "Rebuild<G>x<E>, NoRebuild<G>x<E> (optionally -chr or -rand), any of them with -b<K>k "
                     "(blocks of K KiB), D-ins<n> and NoRebuild<G>x1 also with -s<K> (sections K slots wide), "
                     f"or one of {', '.join(PEERS)}")


def wave_layouts(ns: tuple[int, ...] = WAVE_NS) -> list[str]:
    return [f"{m}-{s}{n}" for m in "RD" for s in ("ins", "exp") for n in ns]


def doubly_layouts(shapes: tuple[tuple[int, int], ...] = SQUARES + SKEWED, suffixes: tuple[str, ...] = ("", "-chr")) -> list[str]:
    return [f"{m}{g}x{e}{suf}" for suf in suffixes for m in ("Rebuild", "NoRebuild") for g, e in shapes]


def default_configs(workload: str) -> list[str]:
    """What ``ebb bench WORKLOAD`` runs when no --configs are given (see docs/benchmarks.md)."""
    if workload == "thesis-small":
        return wave_layouts() + doubly_layouts() + list(PEERS)
    if workload == "quick":
        # every technique (wave R/D x ins/exp; doubly Rebuild/NoRebuild x round-robin/chronological/random)
        # at two sizes, Figure 4.4's 4x4/2x8/8x2, and every peer; small enough for CI
        return (wave_layouts((4, 9)) + doubly_layouts(((2, 2), (3, 3), (4, 4), (2, 8), (8, 2)), ("",))
                + doubly_layouts(((2, 2), (3, 3)), ("-chr",)) + doubly_layouts(((2, 2),), ("-rand",)) + list(PEERS))
    if workload == "fluctuating":
        # thesis Figure 4.8 (R-ins, D-ins, Rebuild, NoRebuild) at n = 4 and 16, plus random
        # partitioning, which section 4.3.3 proposes for fluctuating rates
        return ([f"{m}-ins{n}" for m in "RD" for n in (4, 16)]
                + doubly_layouts(((2, 2), (4, 4)), ("", "-rand")))
    if workload == "thesis-large":
        # Figures 4.9-4.11: R-ins, D-ins, Rebuild, NoRebuild; n = 4 and 16 (see docs/benchmarks.md)
        return [f"{m}-ins{n}" for m in "RD" for n in (4, 16)] + doubly_layouts(((2, 2), (4, 4)), ("",))
    if workload == "thesis-large-smallbatch":
        # the doubly partitioned layouts of thesis-large, for the update-memory comparison with thesis-small
        return doubly_layouts(((2, 2), (4, 4)), ("",))
    if workload == "periodic":
        # G = the workload's period (4, tools/workloads.py), so round-robin sends every burst to one row;
        # the three partitionings of section 4.3.3 in both modes
        return doubly_layouts(((4, 4),), ("", "-chr", "-rand"))
    if workload == "many-keys":
        return ["R-ins16", "D-ins16"] + doubly_layouts(((4, 4),), ("",)) + list(PEERS)
    raise ValueError(f"no default configurations for workload {workload!r}")
