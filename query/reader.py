"""Probes and scans over one consistent snapshot, filtered to the records valid at ``as_of``.

Every read opens a storage ``Snapshot`` (an LMDB read transaction plus file maps), so an update
committing meanwhile is either wholly visible or not at all. Records are returned only if
``ts <= as_of < exp``; buckets whose largest ``exp`` is <= as_of are skipped unread.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..storage.archive import Archive
from ..storage.directory import Entries
from ..storage.schema import INS_SLOT
from ..storage.snapshot import Snapshot

SCAN_CHUNK_BYTES = 32 << 20


@dataclass
class ReadStats:
    """What reads through one ArchiveReader have touched so far."""

    subindices_read: set[int] = field(default_factory=set)  # 1-based
    buckets_read: int = 0
    bytes_read: int = 0

    def to_dict(self) -> dict:
        return {"subindices_read": sorted(self.subindices_read), "buckets_read": self.buckets_read, "bytes_read": self.bytes_read}


class ArchiveReader:
    """Read-only access to an archive: ``probe``, ``probe_range``, ``scan`` and ``stats``."""

    def __init__(self, path_or_archive: str | Archive, readonly: bool = False):
        """``readonly`` (with a path): open without write access, so opening never waits for
        an update in progress elsewhere; use it in processes that only read."""
        self._own = not isinstance(path_or_archive, Archive)
        self.archive = Archive(path_or_archive, readonly=readonly) if self._own else path_or_archive
        self.io = ReadStats()

    def close(self) -> None:
        if self._own:
            self.archive.close()

    def __enter__(self) -> "ArchiveReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- public reads ---------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        """A snapshot to pass to several reads so that they see one committed state (and so that
        the caller knows which one: ``snap.state.update_seq``). The caller closes it."""
        return self.archive.snapshot()

    def probe(self, key, as_of: int | None = None, subindices: list[int] | None = None,
              snapshot: Snapshot | None = None) -> pa.Table:
        """Records with this key valid at ``as_of`` (default: the last update's time).
        ``snapshot``: read that committed state (left open) instead of a new one."""
        with self._use(snapshot) as snap:
            t = snap.check_as_of(as_of)
            return self._collect(snap, t, lambda i: snap.entries(i, key, point=True), subindices)

    def probe_range(self, lo, hi, as_of: int | None = None, subindices: list[int] | None = None,
                    snapshot: Snapshot | None = None) -> pa.Table:
        """Records with lo <= key <= hi valid at ``as_of``. Either bound may be None (open)."""
        with self._use(snapshot) as snap:
            t = snap.check_as_of(as_of)
            return self._collect(snap, t, lambda i: snap.entries(i, lo, hi), subindices)

    def scan(self, as_of: int | None = None, subindices: list[int] | None = None,
             snapshot: Snapshot | None = None) -> Iterator[pa.RecordBatch]:
        """Streams every record valid at ``as_of`` as record batches, sub-index by sub-index
        in file order. A snapshot this call opens stays open until the iterator is exhausted or
        closed; a ``snapshot`` passed in is left open for its owner to close."""
        snap = snapshot if snapshot is not None else self.archive.snapshot()
        try:
            t = snap.check_as_of(as_of)
        except Exception:
            if snapshot is None:
                snap.close()
            raise
        return self._scan(snap, t, subindices, close=snapshot is None)

    def scan_table(self, as_of: int | None = None, subindices: list[int] | None = None) -> pa.Table:
        """``scan`` collected into one table."""
        batches = list(self.scan(as_of, subindices))
        return pa.Table.from_batches(batches, schema=self.result_schema()) if batches else self.result_schema().empty_table()

    def result_schema(self) -> pa.Schema:
        s = self.archive.schema
        return s if s is not None else pa.schema([])

    def stats(self) -> dict:
        return self.archive.stats()

    # -- internals ------------------------------------------------------------------------------
    @contextmanager
    def _use(self, snapshot: Snapshot | None) -> Iterator[Snapshot]:
        """The caller's snapshot (left open), or a new one closed after the read."""
        if snapshot is not None:
            yield snapshot
            return
        with self.archive.snapshot() as snap:
            yield snap

    def _targets(self, snap: Snapshot, subindices: list[int] | None) -> list[int]:
        if snap.schema is None:
            return []
        return [i for i in (range(snap.n) if subindices is None else subindices) if snap.state.subindices[i].records]

    def _live(self, entries: Entries, t: int) -> np.ndarray:
        d = entries.descs
        return d[d["max_exp"] > t]

    def _read_valid(self, snap: Snapshot, i: int, descs: np.ndarray, t: int) -> pa.Table:
        self.io.subindices_read.add(i + 1)
        self.io.buckets_read += int(descs.size)
        self.io.bytes_read += int(descs["nbytes"].sum())
        rows = snap.read(i, descs)
        ts, exp = rows.column(snap.config.ts_column), rows.column(snap.config.exp_column)
        valid = pc.and_(pc.less_equal(ts, t), pc.greater(exp, t))
        return rows.filter(valid).drop_columns([INS_SLOT])

    def _collect(self, snap: Snapshot, t: int, entries_of, subindices) -> pa.Table:
        parts = []
        for i in self._targets(snap, subindices):
            descs = self._live(entries_of(i), t)
            self.io.subindices_read.add(i + 1)
            if descs.size:
                parts.append(self._read_valid(snap, i, descs, t))
        if not parts:
            return self.result_schema().empty_table() if snap.schema is not None else pa.table({})
        return pa.concat_tables(parts).cast(snap.schema)

    def _scan(self, snap: Snapshot, t: int, subindices, close: bool = True) -> Iterator[pa.RecordBatch]:
        try:
            for i in self._targets(snap, subindices):
                descs = self._live(snap.entries(i), t)
                if not descs.size:
                    continue
                descs = descs[np.argsort(descs["loc"], kind="stable")]  # file order: sequential reads (locs are unique)
                ends = np.cumsum(descs["nbytes"].astype(np.int64))
                cuts = np.searchsorted(ends, np.arange(SCAN_CHUNK_BYTES, int(ends[-1]), SCAN_CHUNK_BYTES), side="right")
                edges = np.unique(np.concatenate([[0], cuts, [descs.size]])).tolist()
                for a, b in zip(edges[:-1], edges[1:]):
                    chunk = descs[a:b]
                    # the map is advised random-access (for probes): ask for this chunk's pages ahead
                    snap.file(i).prefetch(int(chunk["loc"][0]), int(chunk["loc"][-1] + chunk["nbytes"][-1]))
                    part = self._read_valid(snap, i, chunk, t).cast(snap.schema)
                    for batch in part.to_batches():
                        if batch.num_rows:
                            yield batch
        finally:
            if close:
                snap.close()
