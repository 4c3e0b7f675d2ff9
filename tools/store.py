"""The interface every benchmarked store implements (ebb itself and each peer).

A store lives in one directory and is driven through the same schedule: ``create``, one
``load`` per update (the bulk load at tau first), and ``probe``/``scan`` after each update, all
"as of" the time of the last update; ``probe_many`` looks up a batch of keys at once
(tools/library_bench.py). ``close`` must release every file handle and memory map so
that a cold-cache measurement (drop caches, ``open``, operate) really reads from disk.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import pyarrow as pa

import numpy as np

from ..storage.arrow_np import to_np
from .workloads import Workload


@dataclass
class ReadResult:
    """What a probe or scan returned: a row count and the sum of ``seq`` (a cheap checksum that
    lets the runner check that every store returned the same records), plus store-specific
    counters (ebb: sub-indices and blocks read)."""

    rows: int
    seq_sum: int
    extra: dict[str, int] = field(default_factory=dict)

    @staticmethod
    def of_table(t: pa.Table, extra: dict[str, int] | None = None) -> "ReadResult":
        return ReadResult(int(t.num_rows), _seq_sum(t.column("seq")) if t.num_rows else 0, extra or {})


def _seq_sum(col: pa.ChunkedArray) -> int:
    """The sum of an int64 column without nulls. Arrow's sum kernel, and numpy's, cost tens of
    microseconds a call (90 right after an update), more than a probe of a few rows takes, so
    a probe's few values are summed as Python ints (as the peers sum theirs) and a scan's
    batches in numpy."""
    if len(col) <= 256:
        return sum(col.to_pylist())
    return sum(int(to_np(c).sum()) for c in col.chunks)


class Store(ABC):
    """One benchmarked store. Subclasses keep everything they write under ``self.path``."""

    name: str = "store"

    def __init__(self, path: str, workload: Workload):
        self.path = path
        self.workload = workload

    @abstractmethod
    def create(self) -> None:
        """Creates the empty store at ``self.path`` (the directory exists and is empty) and opens it."""

    @abstractmethod
    def open(self) -> None:
        """Opens the existing store."""

    @abstractmethod
    def close(self) -> None:
        """Closes every handle and memory map."""

    @abstractmethod
    def load(self, table: pa.Table, at: int) -> dict[str, int]:
        """One periodic update at ``at``: delete records with exp <= at, insert ``table``
        (atomically where the store can), durable on return. Returns store-specific counters."""

    def subindex_balance(self) -> dict[str, float]:
        """After an update: the records in the largest sub-index (``subidx_max_rows``) and the
        mean per sub-index (``subidx_mean_rows``); empty for a store without sub-indices (the
        peers). Called outside the timed update, so it may read what it needs."""
        return {}

    @abstractmethod
    def probe(self, key: int, at: int) -> ReadResult:
        """Records with this key valid at ``at`` (ts <= at < exp)."""

    def probe_many(self, keys: np.ndarray, at: int) -> ReadResult:
        """Records of every key of ``keys`` (unique int64 keys, in any order) valid at ``at``, as
        one result: the same rows as ``probe`` of each key. This default probes them one at a
        time; a store with a batch lookup of its own overrides it."""
        rows = seq = 0
        for key in keys.tolist():
            r = self.probe(key, at)
            rows += r.rows
            seq += r.seq_sum
        return ReadResult(rows, seq)

    @abstractmethod
    def scan(self, at: int) -> ReadResult:
        """Every record valid at ``at``, materialised (payload included) and then dropped."""
