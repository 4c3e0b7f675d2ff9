"""An update whose new run files are written by other processes (Spark tasks), then adopted at
the archive's single commit point.

It is ``update.Update`` cut in three, so that the records never gather in one process:

1. ``prepare`` (the driver, holding the writer lock) checks the update time and the batch's
   schema and splits the work into *parts*. A Rebuild part is a key range of one touched
   sub-index: its live runs cut, where a key changes, into stretches of about ``PART_BYTES``
   (a sub-index with no records is one part). A NoRebuild part is one sub-index that may
   receive records. The ``PartitionedUpdate`` it returns is small and picklable.
2. On the executors, ``part_of`` validates each batch and routes every record to its part, and
   ``write_part`` (one call per part) writes that part's new run: Rebuild merges the part's old
   blocks (expired records dropped) with its new records; NoRebuild writes the new records as
   a sectioned run. The file is fsync'd with its directory entry, and a ``PartResult`` (the
   sealed descriptor and counts) is all that goes back. Executors need the data directory,
   never the metadata.
3. ``PartsCommit`` (the driver, a writer of ``write_sequence.run``) checks that every part came
   back exactly once, applies NoRebuild deletions (metadata only), and commits the new version
   with the producer's checkpoint in one LMDB transaction, as ``update.Update`` does.

A failed, retried or duplicated task leaves only files that no commit references: recovery
removes them before the next update. A Rebuild sub-index written by several parts holds one
run per part, with disjoint key ranges (``maintenance.key_ordered_slices`` reads them in order).
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from . import files
from .errors import ArchiveError
from .faults import crash_point
from .files import OpenFiles
from .iostats import proc_io
from .maintenance import MaintenanceContext, RunSlice, SubIndexChange, key_ordered_slices, norebuild, rewrite
from .manifest import LiveRun, SubIndexState, read_schema_history, read_state
from .run_descriptor import RunDescriptor
from .schema import SchemaHistory
from .tuning import PART_BYTES
from .update import descriptor_reader, finish_update, input_table
from .update_plan import UpdatePlan, plan_update, subindex_of_rows, touched
from .validate import check_rows, conform_batch, conform_to, update_slot
from .write_sequence import Staged, Writer, commit, durable



@dataclass
class Part:
    """One task's share of an update: sub-index ``i``, keys in [lo, hi) (None: open), and
    (Rebuild) the stretches of old runs it rewrites (blocks at the edges are shared with the
    neighbouring parts, each keeping its own keys)."""

    i: int
    lo: object | None
    hi: object | None = None
    slices: list[RunSlice] = field(default_factory=list)
    descriptors: dict[str, bytes] = field(default_factory=dict)  # sealed descriptors of the slices' runs
    delete_upto: int | None = None  # Rebuild: drop records with exp <= this


@dataclass
class PartResult:
    """What a task returns: the new run of its part (sealed descriptor, if any) and counts."""

    part: int
    run: bytes | None
    run_name: str | None
    input_rows: int
    dropped: int
    inserted: int
    deleted: int
    blocks_read: int
    bytes_read: int
    seconds: float


@dataclass
class PartitionedUpdate:
    """The plan of one update whose parts are written elsewhere (see the module docstring)."""

    config: object  # ArchiveConfig
    schemas: SchemaHistory  # the archive's schema after this update, and its history
    sets_schema: bool  # the first batch with columns, or one that adds columns: the commit stores the schema
    data_dir: str
    base_seq: int  # the committed update this one follows
    last_slot: int | None
    slot: int
    at: int
    parts: list[Part]

    @property
    def schema(self) -> pa.Schema:
        return self.schemas.schema

    # -- executors ------------------------------------------------------------------------------
    def part_of(self, batch: pa.Table) -> np.ndarray:
        """Validates ``batch`` (RejectedBatch names every problem) and returns the part of each
        record (records already expired go to part 0, which drops and counts them)."""
        cfg = self.config
        table = conform_to(batch, self.schema)
        check_rows(table, cfg, self.at)
        ts = table.column(cfg.ts_column).to_numpy()
        exp = table.column(cfg.exp_column).to_numpy()
        bulk = self.last_slot is None and self.slot == 0
        _, _, sub = subindex_of_rows(cfg, bulk, self.slot, ts, exp)
        out = np.zeros(len(sub), np.int64)
        live = exp > self.at
        keys = None
        for i, (first, bounds) in self._bounds().items():
            mask = live & (sub == i)
            if not mask.any():
                continue
            if len(bounds) == 0:
                out[mask] = first
                continue
            if keys is None:
                keys = table.column(cfg.key_column).to_numpy(zero_copy_only=False)
            cuts = np.array(bounds, dtype=object if keys.dtype == object else None)
            out[mask] = first + np.searchsorted(cuts, keys[mask], side="right")
        stray = live & ~np.isin(sub, list(self._bounds()))
        if stray.any():  # cannot happen for a batch that passed check_rows: the layout's closed form
            raise ArchiveError(f"{int(stray.sum())} records map to a sub-index this update does not write")
        return out

    def _bounds(self) -> dict[int, tuple[int, list]]:
        """Sub-index -> (its first part, the ``lo`` of its other parts, ascending)."""
        out: dict[int, tuple[int, list]] = {}
        for k, p in enumerate(self.parts):
            if p.i not in out:
                out[p.i] = (k, [])
            else:
                out[p.i][1].append(p.lo)
        return out

    def write_part(self, k: int, batch: pa.Table) -> PartResult:
        """Writes part ``k``'s new run from its records ``batch`` (those ``part_of`` sent it) and
        returns its result. The file is durable when this returns; on error it is removed."""
        t0 = time.perf_counter()
        cfg, part = self.config, self.parts[k]
        table = conform_to(batch, self.schema)
        plan = plan_update(cfg, self.last_slot, self.slot, table)
        rows, slots = plan.rows_of(part.i)
        if rows.num_rows != plan.rows.num_rows:
            raise ArchiveError(f"part {k} (I{part.i + 1}) was sent records of other sub-indices")
        created: list[str] = []
        open_files = OpenFiles(self.data_dir)

        def descriptor(name: str) -> RunDescriptor:
            return RunDescriptor.from_bytes(part.descriptors[name], name, f"run {name}")

        ctx = MaintenanceContext(cfg, self.schemas, self.data_dir, open_files, descriptor, self.base_seq + 1, created)
        try:
            if cfg.mode == "rebuild":
                ch = rewrite(ctx, part.i, part.slices, rows, part.delete_upto, (part.lo, part.hi))
            else:
                ch = norebuild(ctx, part.i, SubIndexState(), rows, slots, None)
            durable(self.data_dir, created)
        except BaseException:
            for path in created:  # files of an update that will not commit
                files.FS.remove(path)
            raise
        finally:
            open_files.close()
        desc = ch.new_runs[0] if ch.new_runs else None
        return PartResult(k, desc.to_bytes() if desc else None, desc.name if desc else None, plan.input_rows,
                          plan.dropped, ch.inserted, ch.deleted, ch.blocks_read, ch.bytes_read,
                          round(time.perf_counter() - t0, 6))


def prepare(archive, input_schema: pa.Schema, at: int, part_bytes: int = PART_BYTES) -> PartitionedUpdate:
    """Plans the update at ``at`` of a batch with ``input_schema`` (caller holds the writer lock)."""
    with archive.env.begin() as txn:
        cfg = archive.reads.config(txn)
        state = read_state(txn)
        j = update_slot(cfg, state, at)
        stored = read_schema_history(txn)
        _, schemas = conform_batch(input_table(input_schema.empty_table(), cfg, stored), cfg, stored,
                                   state.update_seq + 1, at)
        plan = _empty_plan(cfg, state, j, schemas.schema)
        deletes, _ = touched(cfg, plan, state)
        descriptor = descriptor_reader(archive, txn)
        if cfg.mode == "rebuild":
            ctx = MaintenanceContext(cfg, schemas, archive.data_dir, archive.open_files, descriptor, 0, [])
            parts = []
            for i in sorted(deletes | set(plan.planned_insert)):
                parts += _rebuild_parts(ctx, i, state.subindices[i], at if i in deletes else None, part_bytes)
        else:
            parts = [Part(i, None) for i in plan.planned_insert]
    return PartitionedUpdate(cfg, schemas, input_schema.names != [] and schemas is not stored,
                             archive.data_dir, state.update_seq, state.last_slot, j, at, parts)


def _empty_plan(cfg, state, j: int, schema: pa.Schema) -> UpdatePlan:
    """The update's slots and planned sets (no records: those are on the executors)."""
    return plan_update(cfg, state.last_slot, j, schema.empty_table())


def _rebuild_parts(ctx: MaintenanceContext, i: int, current: SubIndexState, delete_upto: int | None,
                   part_bytes: int) -> list[Part]:
    """Sub-index i's live runs cut into key ranges of about ``part_bytes``. A cut falls at a key
    that starts a block; the blocks before it that still hold that key go to both parts."""
    parts = [Part(i, None, delete_upto=delete_upto)]
    size = 0
    for s in key_ordered_slices(ctx, current):
        desc = ctx.descriptor(s.name)
        start = s.start
        lengths = desc.blocks["length"].tolist()
        for b in range(s.start, s.stop):
            first = desc.first_keys[b]
            if size >= part_bytes and b > start and (parts[-1].lo is None or first > parts[-1].lo):
                parts[-1].slices.append(RunSlice(s.name, start, b))
                parts[-1].hi = first
                parts.append(Part(i, first, delete_upto=delete_upto))
                size, start = 0, bisect.bisect_left(desc.last_keys, first, start, b)
            size += lengths[b]
        if s.stop > start:
            parts[-1].slices.append(RunSlice(s.name, start, s.stop))
    for p in parts:
        p.descriptors = {s.name: ctx.descriptor(s.name).to_bytes() for s in p.slices}
    return parts


class PartsCommit(Writer):
    """The commit of an update planned as ``pu`` whose parts came back as ``results``, as
    ``write_sequence.run`` drives it. A caller that plans or gathers the parts under the
    writer lock overrides ``prepare`` to set ``pu`` and ``results``. ``t0``, ``io0``: when the
    update started, for its record (default: when its commit starts)."""

    def __init__(self, pu: PartitionedUpdate | None = None, results: list[PartResult] | None = None,
                 checkpoint: dict[str, bytes] | None = None, late_rows: int = 0, t0: float | None = None,
                 io0: dict | None = None):
        self.pu, self.results = pu, results or []
        self.checkpoint, self.late_rows, self.t0, self.io0 = checkpoint, late_rows, t0, io0

    def write(self, archive, txn, created: list[str]) -> Staged:
        t0 = time.perf_counter() if self.t0 is None else self.t0
        io0 = proc_io() if self.io0 is None else self.io0
        pu, results = self.pu, self.results
        crash_point("partitioned.results_in")
        got = sorted(r.part for r in results)
        if got != list(range(len(pu.parts))):
            raise ArchiveError(f"the update's parts came back as {got}, expected each of 0..{len(pu.parts) - 1} once")
        state = read_state(txn)
        if state.update_seq != pu.base_seq:
            raise ArchiveError(f"the archive moved from update {pu.base_seq} to {state.update_seq} while this "
                               "update's parts were written; nothing was committed")
        plan = _empty_plan(pu.config, state, pu.slot, pu.schema)
        plan.input_rows = sum(r.input_rows for r in results)
        plan.dropped = sum(r.dropped for r in results)
        changes = _changes_of(archive, txn, pu, state, plan, results)
        record = finish_update(txn, state, plan, changes, self.late_rows, pu.schemas if pu.sets_schema else None,
                               self.checkpoint, t0, io0)
        return Staged(record, [desc for ch in changes for desc in ch.new_runs])

    def committed(self, record: dict) -> None:
        crash_point("update.after_commit")


def _changes_of(archive, txn, pu: PartitionedUpdate, state, plan: UpdatePlan,
                results: list[PartResult]) -> list[SubIndexChange]:
    """The parts' runs as the changes of the sub-indices they replace or add to, with NoRebuild
    deletions applied (metadata only)."""
    cfg = pu.config
    deletes, _ = touched(cfg, plan, state)
    changes: dict[int, SubIndexChange] = {}
    if cfg.mode == "norebuild":
        ctx = MaintenanceContext(cfg, pu.schemas, archive.data_dir, archive.open_files, descriptor_reader(archive, txn),
                                 0, [])
        empty = pu.schema.empty_table()
        for i in sorted(deletes):
            changes[i] = norebuild(ctx, i, state.subindices[i], empty, np.zeros(0, np.int64), pu.slot)
    for r in sorted(results, key=lambda r: r.part):
        i = pu.parts[r.part].i
        ch = changes.get(i)
        if ch is None:
            ch = changes[i] = SubIndexChange(i, [] if cfg.mode == "rebuild" else list(state.subindices[i].runs))
            if cfg.mode == "rebuild":
                ch.dropped_runs = [run.name for run in state.subindices[i].runs]
        ch.inserted += r.inserted
        ch.deleted += r.deleted
        ch.blocks_read += r.blocks_read
        ch.bytes_read += r.bytes_read
        if r.run is not None:
            desc = RunDescriptor.from_bytes(r.run, r.run_name, f"part {r.part}'s run {r.run_name}")
            ch.new_runs.append(desc)
            ch.runs.append(LiveRun.of(desc, 0))
            ch.blocks_written += int(desc.blocks.size)
            ch.bytes_written += desc.file_bytes
    return [changes[i] for i in sorted(changes)]


def finish(archive, pu: PartitionedUpdate, results: list[PartResult], checkpoint: dict[str, bytes] | None = None,
           late_rows: int = 0, t0: float | None = None, io0: dict | None = None) -> dict:
    """``PartsCommit``'s commit alone, for a caller that holds the writer lock since ``prepare``
    and does the rest of ``write_sequence.run`` itself. ArchiveError, with nothing committed, if a
    part is missing or the archive moved."""
    writer = PartsCommit(pu, results, checkpoint, late_rows, t0, io0)
    record = commit(archive, writer).record
    writer.committed(record)
    return record
