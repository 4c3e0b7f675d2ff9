"""Allocation of fixed-size slots in a NoRebuild sub-index file.

A bucket occupies ``ceil(nbytes / capacity)`` consecutive slots (one, unless a single record
is larger than a slot). Freed slots go on a free list tagged with the transaction that freed
them; a slot is handed out again only once no live reader's snapshot is older than that
transaction, and never within the update that freed it (the committed state still uses it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .manifest import FREE


@dataclass
class Allocation:
    starts: np.ndarray  # first slot of each requested bucket
    free: np.ndarray  # the free list after allocation
    high_water: int  # slots in the file after allocation


def allocate(nslots: np.ndarray, free: np.ndarray, high_water: int, reusable_upto: int | None) -> Allocation:
    """Places buckets needing ``nslots`` slots each. Single-slot buckets reuse free slots freed
    by transactions <= ``reusable_upto`` (None: none are reusable), lowest slot first; the rest
    are appended at the high-water mark."""
    nslots = np.asarray(nslots, dtype=np.int64)
    starts = np.empty(nslots.size, dtype=np.int64)
    single = np.flatnonzero(nslots == 1)
    free = np.sort(free, order="slot")
    if reusable_upto is not None and single.size and free.size:
        usable = np.flatnonzero(free["txn"] <= reusable_upto)[: single.size]
        starts[single[: usable.size]] = free["slot"][usable].astype(np.int64)
        free = np.delete(free, usable)
        single = single[usable.size :]
    rest = np.concatenate([single, np.flatnonzero(nslots != 1)])
    rest.sort()
    if rest.size:
        need = nslots[rest]
        starts[rest] = high_water + np.cumsum(need) - need
        high_water += int(need.sum())
    return Allocation(starts, free, high_water)


def release(free: np.ndarray, starts: np.ndarray, nslots: np.ndarray, txn: int) -> np.ndarray:
    """Adds every slot of the given buckets to the free list, tagged with ``txn``."""
    nslots = np.asarray(nslots, dtype=np.int64)
    if nslots.size == 0:
        return free
    slots = np.repeat(np.asarray(starts, np.int64) - (np.cumsum(nslots) - nslots), nslots) + np.arange(int(nslots.sum()))
    add = np.zeros(slots.size, dtype=FREE)
    add["slot"] = slots
    add["txn"] = txn
    return np.concatenate([free, add])
