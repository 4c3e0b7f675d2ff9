"""A consistent, read-only view of one committed version of the archive.

A snapshot is an LMDB read transaction: it pins one version, so the run files and blocks that
version references are not reclaimed while it is open (``recovery.collect_garbage`` waits for
it), and updates committing meanwhile are invisible to it. ``plan`` turns a request into read
tasks; ``read`` executes one. Opening a snapshot takes no lock and never waits for a writer.
"""

from __future__ import annotations

import functools
from typing import Iterator

import numpy as np
import pyarrow as pa

from . import leases
from .arrow_np import empty_table
from .block_format import physical_schema
from .config import ArchiveConfig
from .errors import CorruptionError, ReadError
from .files import MappedSource
from .keys import check_range_bounds, comparable, int_keys, search_key
from .manifest import ArchiveState, KeptVersion, kept_version_at, oldest_kept_version
from .point_probe import ColumnLayout, PreparedProbe, PreparedRun, ProbeRuns, RunToProbe
from .point_probe import probe as point_probe
from .point_probe import probe_many as point_probe_many
from .range_stream import merged, ordered
from .read_plan import KeyRange, Probe, ReadRequest, ReadTask, plan, sources, where
from .run_descriptor import RunDescriptor
from .schema import SchemaHistory
from .timemodel import read_instant
from .task_reader import execute, prefetch_heads


def key_array(keys, key_type: pa.DataType) -> np.ndarray:
    """``keys`` (any collection or iterable of keys, or an Arrow or numpy array) as a numpy array
    of the key column's values, ascending, each once; ReadError if they are not keys of
    ``key_type``. Integer keys are not passed through ``pyarrow.array``, whose first call imports
    pandas (a quarter second)."""
    if isinstance(keys, (str, bytes)):  # else each character would be a key
        raise ReadError(f"probe keys must be a collection of keys, not one {type(keys).__name__} (probe takes one key)")
    if isinstance(keys, (pa.Array, pa.ChunkedArray)):
        keys = keys.to_numpy(zero_copy_only=False)
    if pa.types.is_integer(key_type):
        try:
            if not isinstance(keys, (np.ndarray, list, tuple)) and not hasattr(keys, "__array__"):
                keys = list(keys)  # a set, a generator, a dict's keys: any iterable of keys
            return np.unique(int_keys(keys))
        except ReadError:
            raise
        except (TypeError, ValueError, OverflowError):
            raise ReadError(f"probe keys must be numbers (the key column is {key_type})") from None
    try:
        values = pa.array(list(keys), key_type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
        raise ReadError(f"probe keys must be of the key column's type, {key_type}") from None
    if values.null_count:
        raise ReadError("probe keys cannot be null")
    return np.unique(values.to_numpy(zero_copy_only=False))


def _filters(source: MappedSource, what: str, name: str, start: int, end: int) -> pa.Buffer:
    """The key filters of run ``name``: bytes [start, end) of its file, read through ``source``
    (its map's descriptor: no second open). CorruptionError naming ``what`` if they do not end
    where the file does (filters placed by the wrong bits a record would pass their sums and
    hide rows), DataIOError if the file cannot be read (``files.read_exact``)."""
    if source.size != end:
        raise CorruptionError(f"{what}, run {name}: its key filters end at byte {end}, the file at {source.size}")
    return source.read(start, end - start, f"{what}, run {name}, key filters")


class Snapshot:
    """Read access to one committed version. Use as a context manager or call ``close``."""

    def __init__(self, archive, marks_read: bool = True):
        """A snapshot of ``archive``'s newest committed version. ``marks_read``: reads may answer
        from it, so from now on no older version may answer this archive's reads (the follower
        prepares a version with False: no answer comes from it until it is served)."""
        self._archive = archive
        self._pins: dict[int, leases.Lease | None] = {}  # kept versions read, by txn id
        env = archive.env
        self.txn = env.begin(buffers=False)
        try:
            self.config: ArchiveConfig
            self.state: ArchiveState
            self._reads = archive.reads
            self.config, self.state = self._reads.version(env, self.txn)
            if marks_read:
                self._reads.mark_read(self.state.update_seq)
            stored = self._reads.schema(env, self.txn)
        except BaseException:
            self.close()
            raise
        # the newest schema: every read returns it (older runs' rows with nulls in the columns
        # added since), as of any instant
        self.schemas: SchemaHistory | None = None if stored is None else stored.history
        self.schema: pa.Schema | None = None if stored is None else stored.schema
        self._physical = None if stored is None else stored.physical
        self._point_layout = None if stored is None else stored.point_layout
        self._runs: ProbeRuns | None = None  # this version's point-probe run set, once prepared
        self._time: int | None = None  # ``time``, once asked for

    # -- time -----------------------------------------------------------------------------------
    @property
    def time(self) -> int:
        """Time of the last committed update (tau before the first)."""
        if self._time is None:
            tm = self.config.time
            self._time = tm.tau if self.state.last_slot is None else tm.time_of(self.state.last_slot)
        return self._time

    def check_as_of(self, as_of: int | None) -> int:
        """``as_of`` or the snapshot's time; ReadError for an instant before the oldest version
        the archive keeps (docs/spec.md section 2)."""
        return self.version_at(as_of)[0]

    def version_at(self, as_of: int | None) -> tuple[int, ArchiveState]:
        """``as_of`` (default: the snapshot's time) and the state of the version current at that
        instant: this snapshot's, or for an earlier instant the version kept for it
        (``config.retain``), which this snapshot then pins with a lease until it is closed (the
        window may move past it meanwhile). ReadError naming the oldest readable instant if none
        is kept. As of this snapshot's own version it needs no metadata: a served snapshot
        answers from any thread, even after ``close``."""
        t, kept = self._version(as_of)
        return t, self.state if kept is None else kept.state

    def _version(self, as_of: int | None) -> tuple[int, KeptVersion | None]:
        """``as_of`` and the kept version current then (None: this snapshot's own)."""
        if as_of is None:
            return self.time, None
        as_of = read_instant(as_of)
        if as_of >= self.time:
            return as_of, None
        kept = kept_version_at(self.txn, as_of)
        if kept is None:
            oldest = oldest_kept_version(self.txn)
            since = self.time if oldest is None else oldest.time
            raise ReadError(f"as_of {as_of} is before {since}, the oldest instant this archive can still read "
                            f"(the last update was at {self.time}; it keeps {self.config.retain} chronons of history: "
                            "ebb init --retain)")
        if kept.txn not in self._pins:
            self._pins[kept.txn] = self._pin_kept(kept)
        return as_of, kept

    def _pin_kept(self, kept: KeptVersion) -> leases.Lease | None:
        """A lease on kept version ``kept``, taken while the newest version still keeps it (so
        garbage collection, which reads leases after trimming, sees it); ReadError if the
        retention window has moved past it since this snapshot began. None where leases cannot
        be written (a read-only mount): the read then lasts as long as the window keeps it."""
        try:
            lease = leases.take(self._archive.data_dir, kept.txn)
        except OSError:
            return None
        with self._archive.env.begin() as newest:
            still = kept_version_at(newest, kept.time)
        if still is None or still.txn != kept.txn:
            lease.release()
            raise ReadError(f"the version current at {kept.time} left the retention window while this read began "
                            "(the archive keeps its last config.retain chronons); read a later instant")
        return lease

    @property
    def version_txn(self) -> int:
        """The LMDB transaction id that committed this snapshot's version (what garbage
        collection and leases count versions by)."""
        return self.txn.id()

    def version_token(self) -> object:
        """What ``Archive.newest_version`` returns while this snapshot's version is the newest
        (asked while the snapshot is open): taken from the snapshot itself, not read before it
        opened, where a commit in between would pair an older version with a newer token."""
        return self.txn.id()

    # -- pinning beyond this process ------------------------------------------------------------
    def lease(self, as_of: int | None = None, seconds: float = leases.DEFAULT_SECONDS) -> leases.Lease:
        """Pins the version current at ``as_of`` for reads that outlive this snapshot or run in
        other processes (the tasks of a Spark action): its space stays until the lease is
        released or ``seconds`` pass without a renewal (``leases``). OSError if the data
        directory is not writable here."""
        _, kept = self._version(as_of)
        return leases.take(self._archive.data_dir, self.version_txn if kept is None else kept.txn, seconds)

    def hold(self) -> None:
        """Keeps this snapshot's version readable until it is closed, however long a read of it
        lasts. An archive's own snapshot already does (its LMDB read transaction is in the
        writer's reader table), and so does one reading a kept version (``version_at``); a
        published copy's takes a lease (``_PublishedSnapshot``)."""

    @property
    def n(self) -> int:
        return len(self.state.subindices)

    # -- planning and reading -------------------------------------------------------------------
    def descriptor(self, name: str) -> RunDescriptor:
        """The descriptor of a run of this version, without its page sums (cached: run files
        never change)."""
        return self._reads.metadata.descriptor(self.txn, name)

    def page_sums(self, name: str) -> np.ndarray | None:
        """The page sums of a run of this version (None: written without them; cached)."""
        return self._reads.metadata.page_sums(self.txn, name)

    def plan(self, request: ReadRequest, as_of: int | None = None, subindices: list[int] | None = None) -> list[ReadTask]:
        """The read tasks answering ``request`` as of ``as_of`` (default: the last update)."""
        t, state = self.version_at(as_of)
        if self.schema is None:
            return []
        if isinstance(request, KeyRange):
            check_range_bounds(request.lo, request.hi, self.schema.field(self.config.key_column).type)
        return plan(state, self.descriptor, request, t, self.schemas, subindices, self.page_sums)

    def probe(self, key, as_of: int | None = None,
              subindices: list[int] | None = None) -> tuple[pa.Table, list[tuple[int, int, int]]]:
        """The records of ``key`` valid at ``as_of`` ordered by (exp, ts), and (sub-index,
        blocks, bytes) of each run searched: in one native call where that applies
        (``native_probe``), else through the planned read of a ``Probe``; the same answer,
        checks and errors either way."""
        key = search_key(key)
        got = self.native_probe(key, as_of, subindices)
        if got is not None:
            return got
        cfg = self.config
        if key is None:  # else the plan takes it for an open bound and reads every key
            raise ReadError("a probe key cannot be null (probe_range(None, None) reads every key)")
        if self.schema is not None:  # else the plan's key comparisons fail in Python's terms
            key_type = self.schema.field(cfg.key_column).type
            if not comparable(key, key_type):
                raise ReadError(f"probe key {key!r} is not of the key column's type, {key_type}")
        tasks = self.plan(Probe((key,)), as_of, subindices)
        if self.schema is None:
            return pa.table({}), []
        table = ordered(list(self.read_all(tasks)), self.schema, cfg.key_column, cfg.exp_column, cfg.ts_column)
        return table, [(t.subindex, len(t.blocks), t.bytes) for t in tasks]

    def native_probe(self, key, as_of: int | None = None,
                     subindices: list[int] | None = None) -> tuple[pa.Table, list[tuple[int, int, int]]] | None:
        """``probe`` planned and read in one native call (``point_probe``); None where that path
        does not apply (an empty archive, a key not of the key column's type, the native module
        not built, more runs than it may hold open at once, a run written before a load
        added columns)."""
        t, state = self.version_at(as_of)
        layout = self._point_layout
        if layout is None or not layout.accepts(key):
            return None
        runs = self._point_runs(layout, subindices, state)
        return None if runs is None else point_probe(runs, key, t, self.schema, f"archive {self._archive.path}")

    def probe_many(self, keys: np.ndarray | list, as_of: int | None = None,
                   subindices: list[int] | None = None) -> tuple[pa.Table, list[tuple[int, int, int]]]:
        """The records of every key of ``keys`` valid at ``as_of``, ordered by (key, exp, ts), and
        (sub-index, blocks, bytes) searched: ``probe`` of each key at once, in one native call
        that decodes each block once for all its keys (int64 keys), else through the planned read
        of one ``Probe`` of every key. Repeated keys are searched once."""
        t, state = self.version_at(as_of)
        if self.schema is None:
            return pa.table({}), []
        layout = self._point_layout
        unique = key_array(keys, self.schema.field(self.config.key_column).type)
        if not unique.size:
            return empty_table(self.schema), []
        runs = None if layout is None else self._point_runs(layout, subindices, state)
        if runs is not None:
            return point_probe_many(runs, unique, t, self.schema, f"archive {self._archive.path}")
        tasks = self.plan(Probe(tuple(unique.tolist())), as_of, subindices)
        cfg = self.config
        table = ordered(list(self.read_all(tasks)), self.schema, cfg.key_column, cfg.exp_column, cfg.ts_column)
        return table, [(t.subindex, len(t.blocks), t.bytes) for t in tasks]

    def prepare_point_probes(self, read_metadata: bool = False) -> None:
        """Prepares what point probes of this version need (each run's arrays and map) ahead of
        the first one. Without ``read_metadata`` only from metadata in memory already (the update
        that commits a version calls this, and reads no metadata of runs it did not write). With
        it, reads the runs' descriptors and page sums if they fit the metadata cache's budget, and
        asks for each run file's first page, so that the file system has read where the file's
        blocks lie (``ArchiveReader.prepare_probes``)."""
        layout, meta = self._point_layout, self._reads.metadata
        if layout is None:
            return
        runs = [run for _, _, sub in sources(self.state, None) for run in sub.runs]
        if read_metadata:  # descriptors (~80 bytes a block) and page sums (4 bytes a 4 KiB page)
            if sum(80 * r.blocks + r.bytes // 1024 for r in runs) > meta.limit:
                return
            prepared = self._point_runs(layout, None, self.state)
            for source in prepared.sources if prepared is not None else ():
                source.prefetch(0, 1)
        elif all(meta.holds_run_arrays(r.name) for r in runs):
            self._point_runs(layout, None, self.state)

    def _point_runs(self, layout: ColumnLayout, subindices: list[int] | None, state: ArchiveState) -> ProbeRuns | None:
        """The runs a point probe searches (it skips those expired by its ``as_of``). Those of
        every sub-index are kept for the archive's current version (``ReadState.point_runs``),
        and for this snapshot's, while their arrays fit within the metadata cache's budget. None
        if there are more than half the open files' limit: the native probe maps them all at
        once, where the planned read holds one run open at a time, and the limit keeps
        descriptors below a process's. None too if a run was written under an older schema
        than the newest: the native code reads one layout of columns (such runs are rewritten or
        expire within about S of the load that added columns)."""
        reads = self._reads
        whole = subindices is None and state is self.state
        if whole and self._runs is not None:
            return self._runs
        kept = reads.point_runs(state) if subindices is None else None
        if kept is not None:
            if whole:
                self._runs = kept
            return kept
        if sum(len(sub.runs) for _, _, sub in sources(state, subindices)) > reads.open_files.limit // 2:
            return None
        newest = self.schemas.current
        if newest and any(self.descriptor(run.name).schema != newest for _, _, sub in sources(state, subindices)
                          for run in sub.runs):
            return None
        meta, files, kept_runs = reads.metadata, reads.open_files, reads.prepared_runs
        prepared, live = [], []
        for draining, i, sub in sources(state, subindices):
            at = where(i, draining)
            what = f"archive {self._archive.path}, {at}"
            for run in sub.runs:
                p = kept_runs.get(run.name)
                if p is None or p.run.subindex != i or p.run.where != at:
                    source = files.mapped(run.name)
                    arrays = meta.run_arrays(self.txn, run.name, functools.partial(_filters, source, what))
                    p = PreparedRun.of(RunToProbe(i, at, run.name), source, arrays)
                prepared.append(p)
                live.append((run.max_exp, run.first_live))
        found = ProbeRuns.of(prepared, live, layout, self.schema)
        if subindices is None and sum(p.nbytes for p in prepared) <= meta.limit:
            if whole:
                self._runs = found
            reads.keep_point_runs(state, found)
        return found

    def warm_point_probes(self) -> None:
        """Probes, once and for nothing, a key of this version's newest run through the prepared
        run set. Its first probe otherwise pays on the request path for code and arrays the
        commit (and a loader on the other core) pushed out of the CPU's caches: up to 0.3 ms
        against a steady 0.02 ms (docs/io.md, "Serving for a long time")."""
        if self._runs is None:
            return
        newest = max((run for _, _, sub in sources(self.state, None) for run in sub.runs),
                     key=lambda run: run.max_exp, default=None)
        keys = [] if newest is None else self.descriptor(newest.name).first_keys
        if keys:
            self.native_probe(keys[len(keys) // 2])

    def probes_natively(self, key) -> bool:
        """Whether a point probe of ``key`` (as of this version) takes the native path with the run
        set already prepared, needing no metadata (``prepared_for_probes``)."""
        return self._runs is not None and self._point_layout.accepts(key)

    def prepared_probe(self) -> "PreparedProbe | None":
        """This version's prepared point probes as one object that answers them without the
        snapshot (``latest_snapshot``), or None if its run set is not built."""
        if self._runs is None:
            return None
        return PreparedProbe(self._runs, self._point_layout.accepts, self.time, self.schema,
                             f"archive {self._archive.path}")

    @property
    def prepared_for_probes(self) -> bool:
        """Whether point probes of this version need nothing more from the metadata (its run set
        is built), so that any thread may run them, even after ``close``."""
        return self._runs is not None

    def read(self, task: ReadTask) -> Iterator[pa.RecordBatch]:
        """Executes one task of this snapshot's plan (archive schema, valid records only)."""
        for pin in self._pins.values():  # a long read of a kept version
            if pin is not None:
                pin.renew()
        cfg = self.config
        return execute(task, self._reads.open_files, self._physical, cfg.key_column, cfg.ts_column,
                       cfg.exp_column, f"archive {self._archive.path}, {task.where}")

    def read_all(self, tasks: list[ReadTask]) -> Iterator[pa.RecordBatch]:
        """``read`` of each of ``tasks`` in order, after starting the first reads of every keyed
        task at once (``task_reader.prefetch_heads``): on a cold cache the sub-indices' blocks
        are then read in parallel, not one after another."""
        if self._physical is not None:
            prefetch_heads(tasks, self._reads.open_files, self._physical, self.config.key_column)
        for task in tasks:
            yield from self.read(task)

    def read_range(self, tasks: list[ReadTask]) -> Iterator[pa.RecordBatch]:
        """The records of ``tasks``, this snapshot's plan of a ``KeyRange``, ordered by (key, exp,
        ts) and streamed in memory bounded by the plan's shape, not by the result: a merge of
        every task's sections (``range_stream.merged``), each read a block at a time as the
        merge asks for it. Nothing is read before the first batch is asked for."""
        cfg = self.config
        streams = (self._block_by_block(part) for task in tasks for part in task.sections())
        return merged(streams, self.schema, cfg.key_column, cfg.exp_column, cfg.ts_column)

    def _block_by_block(self, task: ReadTask) -> Iterator[pa.RecordBatch]:
        """``read`` of ``task`` one block at a time, so that no more than one block of it is
        read ahead of what its consumer holds (a task reads up to 8 MiB of adjacent blocks
        at once, ``task_reader.SPAN_BYTES``)."""
        for i in range(len(task.blocks)):
            yield from self.read(task.part(i, i + 1))

    def read_args(self) -> tuple[str, pa.Schema, ArchiveConfig]:
        """What ``read_unpinned`` needs besides a task: the data directory, schema and config."""
        return self._archive.data_dir, self.schema, self.config

    def close(self) -> None:
        if self.txn is not None:
            self.txn.abort()
            self.txn = None
        pins, self._pins = self._pins, {}
        for pin in pins.values():
            if pin is not None:
                pin.release()

    def __enter__(self) -> "Snapshot":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_unpinned(task: ReadTask, data_dir: str, schema: pa.Schema, config: ArchiveConfig) -> Iterator[pa.RecordBatch]:
    """Executes a task of some snapshot's plan without the archive's metadata: for a process
    that has only the data files (a Spark executor). Nothing here pins the version: the planner
    holds a lease on it (``Snapshot.lease``), and if the blocks were reclaimed all the same the
    read fails (file missing, or a checksum mismatch); it never returns rows of another version."""
    from .files import OpenFiles

    files = OpenFiles(data_dir)
    try:
        yield from execute(task, files, physical_schema(schema), config.key_column, config.ts_column,
                           config.exp_column, f"data directory {data_dir}, {task.where}")
    finally:
        files.close()
