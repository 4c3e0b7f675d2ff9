"""The archive's cache of parsed run metadata: descriptors (without page sums), and page sums.

Run files and their descriptors never change once committed, so a parsed descriptor can serve
every later snapshot and update. The cache is bounded in bytes, not in runs: a descriptor grows
with its run (about 80 bytes a block, and 4 bytes a 4 KiB page of page sums), so a bound on the
number of runs would let the memory a process holds grow with the archive. Page sums, most of a
descriptor's bytes, are cached apart: only probes use them, so scans and updates never load them.
Point probes also keep each run's descriptor as contiguous arrays, with its key filters (``RunArrays``).
An entry larger than the whole budget is returned without being kept.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from .manifest import read_page_sums, read_run, read_run_value
from .point_probe import ReadFilters, RunArrays
from .run_descriptor import RunDescriptor
from .tuning import METADATA_CACHE_BYTES


class MetadataCache:
    """Least-recently-used run metadata within ``limit_bytes``, shared by the snapshots of one
    ``Archive`` (the Flight server reads in threads, hence the lock). Two threads that miss
    the same entry both read it; the second one's copy is kept."""

    def __init__(self, limit_bytes: int = METADATA_CACHE_BYTES):
        self.limit = limit_bytes
        self._entries: OrderedDict[tuple[str, str], tuple[object, int]] = OrderedDict()
        self._lock = threading.Lock()
        self.bytes = 0

    def descriptor(self, txn, name: str) -> RunDescriptor:
        """The descriptor of run ``name`` without its page sums, read in ``txn`` on a miss."""
        hit = self._get(("run", name))
        if hit is not None:
            return hit[0]
        desc = read_run(txn, name, with_sums=False)
        self._put(("run", name), desc, desc.nbytes)
        return desc

    def page_sums(self, txn, name: str) -> np.ndarray | None:
        """The page sums of run ``name`` (None: written without), read in ``txn`` on a miss."""
        hit = self._get(("sums", name))
        if hit is not None:
            return hit[0]
        sums = read_page_sums(txn, name)
        self._put(("sums", name), sums, 64 + (sums.nbytes if sums is not None else 0))
        return sums

    def run_arrays(self, txn, name: str, read_filters: ReadFilters) -> RunArrays:
        """What a native point probe needs of run ``name``: its descriptor's arrays, its page
        sums, and its key filters (``read_filters`` reads them from the run file)."""
        hit = self._get(("arrays", name))
        if hit is not None:
            return hit[0]
        lean, sums = self._get(("run", name)), self._get(("sums", name))
        if lean is None and sums is None:  # not read yet: straight from the stored value, no descriptor
            value, what = read_run_value(txn, name), f"descriptor of run {name}"
            arrays = RunArrays.from_value(value, name, what, read_filters)
            if arrays is None:  # string keys: parsed whole, both parts kept for other reads too
                desc = RunDescriptor.from_bytes(value, name, what)
                self.adopt(desc)
                arrays = RunArrays.of(desc, desc.sums, read_filters)
        else:
            desc = lean[0] if lean is not None else self.descriptor(txn, name)
            arrays = RunArrays.of(desc, sums[0] if sums is not None else self.page_sums(txn, name), read_filters)
        self._put(("arrays", name), arrays, arrays.nbytes)
        return arrays

    def holds_run_arrays(self, name: str) -> bool:
        """Whether ``run_arrays(name)`` would read nothing from the metadata."""
        with self._lock:
            return ("arrays", name) in self._entries or (("run", name) in self._entries and ("sums", name) in self._entries)

    def adopt(self, desc: RunDescriptor) -> None:
        """Caches both parts of a descriptor read whole: a run this process just committed, as
        its writer made it (the probes that follow an update then need not read the new runs'
        metadata back), or a run a probe needs (one read and parse, not one a part)."""
        if desc.sums is not None or not desc.paged:  # paged without sums: its sums are not at hand
            self._put(("sums", desc.name), desc.sums, 64 + (desc.sums.nbytes if desc.sums is not None else 0))
        lean = desc.without_sums()
        self._put(("run", desc.name), lean, lean.nbytes)

    def retain(self, names: set[str]) -> None:
        """Drops the entries of runs not in ``names``, the runs of a new current version: only a
        read of an older version reads a replaced run again (and reads its metadata back), and
        left to the least-recently-used order, replaced runs' entries held the whole budget after
        about 2,000 updates (docs/operations.md, "Soak test: results")."""
        with self._lock:
            for key in [k for k in self._entries if k[1] not in names]:
                self.bytes -= self._entries.pop(key)[1]

    def _get(self, key: tuple[str, str]) -> tuple[object, int] | None:
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None:
                self._entries.move_to_end(key)
            return hit

    def _put(self, key: tuple[str, str], value, nbytes: int) -> None:
        if nbytes > self.limit:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.bytes -= old[1]
            self._entries[key] = (value, nbytes)
            self.bytes += nbytes
            while self.bytes > self.limit:
                _, (_, n) = self._entries.popitem(last=False)
                self.bytes -= n
