"""Which sub-index holds a record, and which sub-indices an update touches (docs/spec.md section 3).

Sub-indices are numbered 0..n-1 internally and I1..In (``i + 1``) everywhere a user sees them.
A layout maps an insertion slot and an expiration slot to a sub-index, vectorised over numpy
arrays, and answers which sub-indices the update of a slot inserts into and deletes from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np

_MASK64 = (1 << 64) - 1


def mix64(seed: int, k: np.ndarray) -> np.ndarray:
    """The fixed 64-bit mix h(seed, k) of random partitioning: splitmix64's finaliser applied to
    ``seed + k * 0x9E3779B97F4A7C15`` (all arithmetic mod 2**64). Part of the format: where
    stored records live depends on it (a change needs ``disk_format.FORMAT_VERSION`` bumped)."""
    with np.errstate(over="ignore"):
        z = np.uint64(seed & _MASK64) + k.astype(np.int64).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


@dataclass(frozen=True)
class Layout:
    """A partitioning of (insertion slot, expiration slot) pairs over n sub-indices.

    kind: "doubly" or "wave". For doubly: partitioning in {"round-robin", "chronological",
    "random"} and G x E sub-indices. For wave: split in {"insertion", "expiration"} and n.
    """

    kind: str
    p: int
    G: int = 1
    E: int = 1
    partitioning: str = "round-robin"
    split: str = "insertion"
    n_wave: int = 1
    seed: int = 0

    @property
    def n(self) -> int:
        return self.G * self.E if self.kind == "doubly" else self.n_wave

    # -- the closed forms of docs/spec.md section 3 ------------------------------------------------
    def _chrono(self, k: np.ndarray, parts: int) -> np.ndarray:
        return (((k - 1) % self.p) * parts) // self.p

    def _part(self, k: np.ndarray, parts: int) -> np.ndarray:
        """Which of ``parts`` the slots ``k`` fall in, by the layout's partitioning (doubly only)."""
        if self.partitioning == "round-robin":
            return (k - 1) % parts
        if self.partitioning == "chronological":
            return self._chrono(k, parts)
        return (mix64(self.seed, k) % np.uint64(parts)).astype(np.int64)

    def row(self, k_ins: np.ndarray) -> np.ndarray:
        """Row r (doubly only) from insertion slots."""
        return self._part(k_ins, self.G)

    def column(self, k_exp: np.ndarray) -> np.ndarray:
        """Column c (doubly only) from expiration slots."""
        return self._part(k_exp, self.E)

    def subindex_of(self, k_ins: np.ndarray, k_exp: np.ndarray) -> np.ndarray:
        """0-based sub-index of each record, from its insertion and expiration slots."""
        k_ins = np.asarray(k_ins, dtype=np.int64)
        k_exp = np.asarray(k_exp, dtype=np.int64)
        if self.kind == "doubly":
            return self.row(k_ins) * self.E + self.column(k_exp)
        k = k_ins if self.split == "insertion" else k_exp
        return self._chrono(k, self.n_wave)

    # -- what an update touches ---------------------------------------------------------------
    def insert_targets(self, j: int) -> list[int]:
        """Sub-indices that the update of slot j may insert into (records with k_ins = j)."""
        if self.kind == "doubly":
            r = int(self.row(np.array([j]))[0])
            return list(range(r * self.E, (r + 1) * self.E))
        if self.split == "insertion":
            return [int(self._chrono(np.array([j]), self.n_wave)[0])]
        return list(range(self.n_wave))

    def delete_targets(self, slots: Iterable[int]) -> list[int]:
        """Sub-indices that may hold records expiring in any of ``slots`` (k_exp in slots)."""
        ks = np.fromiter(slots, dtype=np.int64)
        if ks.size == 0:
            return []
        if self.kind == "doubly":
            cols = np.unique(self.column(ks))
            return sorted(int(r * self.E + c) for r in range(self.G) for c in cols)
        if self.split == "insertion":
            return list(range(self.n_wave))
        return sorted(int(i) for i in np.unique(self._chrono(ks, self.n_wave)))

    def insertion_slots_held(self, i: int, last_slot: int) -> list[int]:
        """Insertion slots among the last p (last_slot-p+1 .. last_slot) that map to sub-index i."""
        ks = np.arange(last_slot - self.p + 1, last_slot + 1, dtype=np.int64)
        if self.kind == "doubly":
            return [int(k) for k in ks[self.row(ks) == i // self.E]]
        if self.split == "insertion":
            return [int(k) for k in ks[self._chrono(ks, self.n_wave) == i]]
        return [int(k) for k in ks]

    def expiration_slots_held(self, i: int, last_slot: int) -> list[int]:
        """Expiration slots among the next p (last_slot+1 .. last_slot+p) that map to sub-index i."""
        ks = np.arange(last_slot + 1, last_slot + self.p + 1, dtype=np.int64)
        if self.kind == "doubly":
            return [int(k) for k in ks[self.column(ks) == i % self.E]]
        if self.split == "expiration":
            return [int(k) for k in ks[self._chrono(ks, self.n_wave) == i]]
        return [int(k) for k in ks]

    def describe(self) -> str:
        if self.kind == "doubly":
            return f"doubly partitioned {self.G}x{self.E}, {self.partitioning}"
        return f"wave index, n={self.n_wave}, split by {self.split}"


def compress_slots(slots: list[int]) -> list[list[int]]:
    """[1,2,3,7,8] -> [[1,3],[7,8]]: runs of consecutive slots, for display."""
    runs: list[list[int]] = []
    for s in slots:
        if runs and runs[-1][1] == s - 1:
            runs[-1][1] = s
        else:
            runs.append([s, s])
    return runs
