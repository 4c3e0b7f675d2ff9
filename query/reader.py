"""Probes and scans of an archive from Python, filtered to the records valid at ``as_of``.

A thin layer over storage's read planning: every read opens (or is given) one snapshot, asks
it for a plan (``Snapshot.plan``) and executes the plan's tasks (``Snapshot.read``), exactly as
the Flight server and the Spark source do. Point probes are answered by the newest version's
snapshot kept prepared while no version commits (``storage.latest_snapshot``), or with
``follow`` by the follower's (``storage.follower``). Probe and range results are ordered by
(key, exp, ts); scans stream sub-index by sub-index in file order, and ranges stream in that
order too (``Snapshot.read_range``), both in memory bounded independently of the result.
Results are Arrow: probes return tables and a scan a ``pyarrow.RecordBatchReader``, which
DuckDB, polars and pandas read as they are (docs/offline-analysis.md).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Iterator

import pyarrow as pa

from ..storage.archive import Archive, open_readonly
from ..storage.errors import CorruptionError
from ..storage.follower import VersionFollower
from ..storage.keys import search_key
from ..storage.latest_snapshot import LatestSnapshot
from ..storage.read_plan import KeyRange, ReadTask, Scan
from ..storage.snapshot import Snapshot, ordered


@dataclass
class ReadStats:
    """What reads through one ArchiveReader have planned so far."""

    subindices_read: set[int] = field(default_factory=set)  # 1-based
    blocks_read: int = 0
    bytes_read: int = 0

    def reset(self) -> None:
        """Back to nothing read (in place: cheaper than a new ReadStats per probe)."""
        self.subindices_read.clear()
        self.blocks_read = self.bytes_read = 0

    def count(self, task: ReadTask) -> None:
        self.add(task.subindex, len(task.blocks), task.bytes)

    def add_searched(self, searched: list[tuple[int, int, int]]) -> None:
        """Counts a probe's (sub-index (0-based), blocks, bytes) of each run it searched."""
        subs = self.subindices_read
        for subindex, blocks, nbytes in searched:
            subs.add(subindex + 1)
            self.blocks_read += blocks
            self.bytes_read += nbytes

    def add(self, subindex: int, blocks: int, nbytes: int) -> None:
        """Counts ``blocks`` blocks of ``nbytes`` bytes planned in sub-index ``subindex`` (0-based)."""
        self.subindices_read.add(subindex + 1)
        self.blocks_read += blocks
        self.bytes_read += nbytes

    def to_dict(self) -> dict:
        return {"subindices_read": sorted(self.subindices_read), "blocks_read": self.blocks_read, "bytes_read": self.bytes_read}


class ArchiveReader:
    """Read access to an archive: ``probe``, ``probe_range``, ``scan`` and ``stats``."""

    def __init__(self, path_or_archive: str | Archive, readonly: bool = True, follow: bool = False):
        """With a path, the archive is opened read-only (never waiting for a writer) unless
        ``readonly=False``; the path may also be the data directory of an archive with its own
        data directory (``PublishedArchive``). With an ``Archive``, that archive is used as it is.
        ``follow``: for a process that serves probes for a long time, a background thread
        prepares each new version as it commits (``storage.follower``), so that no probe pays
        for the switch; probes then read the newest version prepared, milliseconds behind."""
        self._own = not isinstance(path_or_archive, Archive)
        if not self._own:
            self.archive = path_or_archive
        else:
            self.archive = open_readonly(path_or_archive) if readonly else Archive(path_or_archive)
        self.io = ReadStats()
        self._follower = VersionFollower(self.archive) if follow else None
        self._latest = None if follow else LatestSnapshot(self.archive)

    def served_snapshot(self, as_of: int | None = None) -> Snapshot | None:
        """With ``follow``: the prepared snapshot of the newest version followed, if point probes
        as of ``as_of`` can use it (it is shared: do not close it); else None."""
        return None if self._follower is None else self._follower.snapshot_for_probe(as_of)

    def followed_update_seq(self) -> int | None:
        """With ``follow``: the update the follower serves, which may trail the newest commit
        for a moment (probes then read the newest on a snapshot of their own); else None."""
        return None if self._follower is None else self._follower.served_update_seq()

    def prepare_probes(self) -> None:
        """Reads now what the first point probe of the current version would: the block
        directory of every run (within the metadata cache's budget), and where each run file's
        blocks lie on disk; the snapshot prepared then answers the probes that follow while no
        version commits (``storage.latest_snapshot``). For a process that serves probes, called
        once after opening (the bench's stores do; the Flight server follows versions instead),
        as RocksDB's open reads each table's index and filter blocks; later versions are
        prepared by the update that commits them, or by their first probe."""
        with self.archive.snapshot() as snap:
            try:
                snap.prepare_point_probes(read_metadata=True)
            except (CorruptionError, OSError):
                return  # left for a read to report, in its own terms
            if self._latest is not None:
                self._latest.keep(snap)  # the probes that follow, while no version commits

    def close(self) -> None:
        if self._follower is not None:
            self._follower.close()
        if self._latest is not None:
            self._latest.clear()
        if self._own:
            self.archive.close()

    def __enter__(self) -> "ArchiveReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def snapshot(self) -> Snapshot:
        """A snapshot to pass to several reads so that they see one committed state (and so that
        the caller knows which one: ``snap.state.update_seq``). The caller closes it."""
        return self.archive.snapshot()

    def probe(self, key, as_of: int | None = None, subindices: list[int] | None = None,
              snapshot: Snapshot | None = None) -> pa.Table:
        """Records with this key valid at ``as_of`` (default: the last update's time), ordered by
        (exp, ts) (``Snapshot.probe``)."""
        key = search_key(key)
        if snapshot is None and subindices is None:
            # the newest version's kept snapshot, or the served one, answers natively without a transaction
            if self._latest is not None:
                got = self._latest.probe(key, as_of)
                if got is not None:
                    return self._counted(got)
            else:
                served = self.served_snapshot(as_of)
                if served is not None and served.probes_natively(key):
                    return self._counted(served.probe(key, as_of))
        return self._on_snapshot(snapshot, subindices is None, lambda snap: snap.probe(key, as_of, subindices))

    def probe_many(self, keys, as_of: int | None = None, subindices: list[int] | None = None,
                   snapshot: Snapshot | None = None) -> pa.Table:
        """Records of every key of ``keys`` (a list, a set or any iterable of keys, or an Arrow,
        numpy, pandas or polars array) valid at ``as_of``, ordered by (key, exp, ts): ``probe`` of
        each key, on its terms (a number an int64 column cannot hold, such as 1.5, matches nothing;
        a null is a ReadError), in one call that reads each block once for all the keys it holds
        (``Snapshot.probe_many``). For many keys at once, far cheaper per key than probing one at
        a time."""
        if snapshot is None and subindices is None and self._latest is not None:
            got = self._latest.probe_many(keys, as_of)
            if got is not None:
                return self._counted(got)
        return self._on_snapshot(snapshot, subindices is None, lambda snap: snap.probe_many(keys, as_of, subindices))

    def _on_snapshot(self, snapshot: Snapshot | None, keepable: bool, probe) -> pa.Table:
        """``probe`` of ``snapshot``, or of a snapshot opened for it and closed after; one whose
        point probes it prepared is kept for the probes that follow (``keepable``: it probed
        every sub-index)."""
        if snapshot is not None:
            return self._counted(probe(snapshot))
        snap = self.archive.snapshot()
        try:
            got = probe(snap)
            if keepable and self._latest is not None:
                self._latest.keep(snap)
        finally:
            snap.close()
        return self._counted(got)

    def _counted(self, got: tuple[pa.Table, list[tuple[int, int, int]]]) -> pa.Table:
        table, searched = got
        self.io.add_searched(searched)
        return table

    def probe_range(self, lo, hi, as_of: int | None = None, subindices: list[int] | None = None,
                    snapshot: Snapshot | None = None) -> pa.Table:
        """Records with lo <= key <= hi valid at ``as_of``, ordered by (key, exp, ts). Either
        bound may be None (open). Read whole and sorted once: as fast as reads go when the
        table is held anyway (``probe_range_batches`` streams a range too large to hold)."""
        snap = snapshot if snapshot is not None else self.archive.snapshot()
        try:
            tasks = snap.plan(KeyRange(lo, hi), as_of, subindices)
            if snap.schema is None:
                return pa.table({})
            for task in tasks:
                self.io.count(task)
            cfg = snap.config
            return ordered(list(snap.read_all(tasks)), snap.schema, cfg.key_column, cfg.exp_column, cfg.ts_column)
        finally:
            if snapshot is None:
                snap.close()

    def probe_range_batches(self, lo, hi, as_of: int | None = None, subindices: list[int] | None = None,
                            snapshot: Snapshot | None = None) -> Iterator[pa.RecordBatch]:
        """``probe_range`` as a generator of record batches in the same order, read as they are
        consumed in memory bounded independently of the result (``Snapshot.read_range``): for
        ranges too large to hold. Planned now (errors such as an ``as_of`` out of reach are
        raised here); a snapshot this call opens stays open until the generator is exhausted
        or closed."""
        return self._planned(KeyRange(lo, hi), as_of, subindices, snapshot)[1]

    def scan(self, as_of: int | None = None, subindices: list[int] | None = None,
             snapshot: Snapshot | None = None) -> pa.RecordBatchReader:
        """Every record valid at ``as_of``, as a ``pyarrow.RecordBatchReader`` with the snapshot's
        schema that reads block by block as it is consumed: iterate it, or hand it to DuckDB
        (``duckdb.sql("select ... from reader")``), polars (``polars.from_arrow(reader)``) or
        pandas (``reader.read_pandas()``); it can be read once. A snapshot this call opens stays
        open until the reader is exhausted, closed or collected; a ``snapshot`` passed in is left
        open. Arrow's stream interface carries an error as a message, so a read that fails while
        streaming raises a pyarrow error (ArrowInvalid, OSError) that quotes ebb's;
        ``scan_batches`` raises ebb's own classes (``ebb.storage.errors``)."""
        schema, batches = self._planned(Scan(), as_of, subindices, snapshot)
        # from_batches alone keeps the generator (and so the snapshot) until the reader is
        # collected: its close() does not reach the generator. Imported through the C stream
        # interface, close() releases the stream and with it the last reference to the
        # generator, whose finally closes the snapshot.
        return pa.RecordBatchReader.from_stream(pa.RecordBatchReader.from_batches(schema, batches))

    def scan_batches(self, as_of: int | None = None, subindices: list[int] | None = None,
                     snapshot: Snapshot | None = None) -> Iterator[pa.RecordBatch]:
        """``scan`` as a generator of record batches, for callers that handle ebb's errors by
        class (the CLI's exit codes, the Flight server's error statuses). A snapshot this call
        opens stays open until the generator is exhausted or closed."""
        return self._planned(Scan(), as_of, subindices, snapshot)[1]

    def scan_table(self, as_of: int | None = None, subindices: list[int] | None = None) -> pa.Table:
        """``scan`` collected into one table."""
        # no batches: a table without chunks (``Schema.empty_table`` would import pandas)
        return pa.Table.from_batches(list(self.scan_batches(as_of, subindices)), schema=self.result_schema())

    def result_schema(self) -> pa.Schema:
        s = self.archive.schema
        return s if s is not None else pa.schema([])

    def stats(self) -> dict:
        return self.archive.stats()

    # -- internals ------------------------------------------------------------------------------
    def _planned(self, request: Scan | KeyRange, as_of: int | None, subindices: list[int] | None,
                 snapshot: Snapshot | None) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
        """Plans a scan or a key range now (so that an instant out of reach fails here, not at
        the first batch) and returns the schema of its batches and the generator that reads
        them: a scan's in file order, a range's merged in (key, exp, ts) order."""
        snap = snapshot if snapshot is not None else self.archive.snapshot()
        try:
            tasks = snap.plan(request, as_of, subindices)
            snap.hold()  # a long read may outlast many updates: its version stays readable until it ends
        except BaseException:
            if snapshot is None:
                snap.close()
            raise
        schema = snap.schema if snap.schema is not None else pa.schema([])
        batches = self._stream(snap, tasks, isinstance(request, KeyRange), close=snapshot is None)
        if snapshot is None:
            # a generator closed or dropped before its first batch never runs its finally
            weakref.finalize(batches, snap.close)
        return schema, batches

    def _stream(self, snap: Snapshot, tasks: list[ReadTask], in_key_order: bool,
                close: bool) -> Iterator[pa.RecordBatch]:
        try:
            if in_key_order:
                for task in tasks:
                    self.io.count(task)
                yield from snap.read_range(tasks)
            else:
                for task in tasks:
                    self.io.count(task)
                    yield from snap.read(task)
        finally:
            if close:
                snap.close()
