"""One periodic update (docs/spec.md section 2): validate, plan, maintain, stage.

``Update`` is the writer ``write_sequence.run`` drives (``Archive.load``), inside its one LMDB
write transaction and in three parts: ``update_plan`` (pure: slots, sub-indices, touched sets),
``maintenance`` (new run files, written and fsync'd), and ``finish_update`` (the new version
staged in the transaction, which the sequence commits: the single commit point). On any error
before the commit the sequence aborts the transaction and removes the files the update created,
leaving the archive exactly as it was. Nothing after the commit can undo it.
"""

from __future__ import annotations

import time
from typing import Callable

import pyarrow as pa

from .commit import stage
from .drain import drain
from .faults import crash_point
from .iostats import delta as io_delta, proc_io
from .maintenance import MaintenanceContext, SubIndexChange, norebuild, rebuild
from .manifest import read_schema_history, read_state
from .update_plan import UpdatePlan, plan_update, touched
from .run_descriptor import RunDescriptor
from .schema import SchemaHistory
from .update_record import UpdateRecord
from .validate import check_rows, conform_batch, update_slot
from .write_sequence import Staged, Writer, durable

Progress = Callable[[str], None]


class Update(Writer):
    """The update at time ``at`` with the records of ``table``. ``checkpoint`` entries (name ->
    bytes) and ``late_rows`` commit in the same transaction, so a producer's progress and the
    data can never disagree."""

    def __init__(self, table: pa.Table, at: int, progress: Progress | None = None,
                 checkpoint: dict[str, bytes] | None = None, late_rows: int = 0):
        self.table, self.at, self.progress = table, at, progress
        self.checkpoint, self.late_rows = checkpoint, late_rows

    def write(self, archive, txn, created: list[str]) -> Staged:
        t0, io0 = time.perf_counter(), proc_io()
        at, table = self.at, self.table
        cfg = archive.reads.config(txn)  # ``migrate`` may have changed the layout since the last update
        state = read_state(txn)
        j = update_slot(cfg, state, at)
        stored = read_schema_history(txn)
        sets_schema = table.num_columns > 0  # a batch with no columns sets nothing, not even the first schema
        table = input_table(table, cfg, stored)
        table, schemas = conform_batch(table, cfg, stored, state.update_seq + 1, at)
        check_rows(table, cfg, at)
        crash_point("update.validated")

        plan = plan_update(cfg, state.last_slot, j, table)
        ctx = MaintenanceContext(cfg, schemas, archive.data_dir, archive.open_files, descriptor_reader(archive, txn),
                                 state.update_seq + 1, created)
        changes = self._maintain(ctx, state, plan)
        durable(archive.data_dir, created)
        crash_point("update.runs_written")

        record = finish_update(txn, state, plan, changes, self.late_rows,
                               schemas if sets_schema and schemas is not stored else None, self.checkpoint, t0, io0)
        return Staged(record, [desc for ch in changes for desc in ch.new_runs])

    def _maintain(self, ctx: MaintenanceContext, state, plan: UpdatePlan) -> list[SubIndexChange]:
        """Writes the new runs of every sub-index the update touches."""
        deletes, inserts = touched(ctx.config, plan, state)
        changes = []
        todo = sorted(deletes | inserts)
        for step, i in enumerate(todo, 1):
            if self.progress:
                what = "delete+insert" if i in deletes and i in inserts else "delete" if i in deletes else "insert"
                self.progress(f"I{i + 1}: {what} ({step}/{len(todo)})")
            rows, slots = plan.rows_of(i)
            if ctx.config.mode == "rebuild":
                ch = rebuild(ctx, i, state.subindices[i], rows, self.at if i in deletes else None)
            else:
                ch = norebuild(ctx, i, state.subindices[i], rows, slots, plan.slot if i in deletes else None)
            changes.append(ch)
        return changes

    def committed(self, record: dict) -> None:
        crash_point("update.after_commit")


def input_table(table: pa.Table, cfg, stored: SchemaHistory | None) -> pa.Table:
    """``table``, or for a table with no columns ("nothing to insert" from a producer that has
    seen no data yet, so knows no schema) an empty table of the stored or minimal schema."""
    if table.num_columns or table.num_rows:
        return table
    table = (stored.schema if stored else pa.schema([(cfg.key_column, pa.int64()), (cfg.ts_column, pa.int64()),
                                  (cfg.exp_column, pa.int64())])).empty_table()
    if stored is None:
        table = table.cast(pa.schema([pa.field(f.name, f.type, nullable=False) for f in table.schema]))
    return table


def descriptor_reader(archive, txn) -> Callable[[str], RunDescriptor]:
    """Reads run descriptors (without page sums) in ``txn``, through the archive's cache."""
    return lambda name: archive.metadata.descriptor(txn, name)


def finish_update(txn, state, plan: UpdatePlan, changes: list[SubIndexChange], late_rows: int,
                  schemas: SchemaHistory | None, checkpoint: dict[str, bytes] | None, t0: float, io0: dict) -> dict:
    """Writes the new version (state, runs, update record, checkpoint, runs drained from
    replaced layouts, and ``schemas`` if this update set or grew the schema) into ``txn``, for
    ``write_sequence`` to commit: shared by updates whose runs this process or Spark tasks wrote.
    ``plan`` gives the update's slot and planned sets; ``plan.rows`` is not used."""
    j, at = plan.slot, plan.time
    state.last_slot = j
    state.update_seq += 1
    state.late_rows += late_rows
    record = UpdateRecord(
        seq=state.update_seq, time=at, slot=j, kind="bulk" if plan.bulk else "periodic",
        slots_processed=list(plan.deletion_slots or []), input_rows=plan.input_rows,
        inserted=sum(c.inserted for c in changes), deleted=sum(c.deleted for c in changes),
        dropped_expired=plan.dropped, late_rows=late_rows,
        planned_insert_into=[i + 1 for i in plan.planned_insert],
        planned_delete_from=[i + 1 for i in plan.planned_delete],
        subindices_touched=[c.i + 1 for c in changes],
        subindices_read=[c.i + 1 for c in changes if c.blocks_read],
        subindices_written=[c.i + 1 for c in changes if c.new_runs or c.dropped_runs or c.dead_prefixes],
        blocks_read=sum(c.blocks_read for c in changes), bytes_read=sum(c.bytes_read for c in changes),
        blocks_written=sum(c.blocks_written for c in changes),
        bytes_written=sum(c.bytes_written for c in changes),
        per_subindex=[c.to_dict() for c in changes],
    )
    drained = drain(state, at)
    record.drained_runs, record.drained_records = len(drained.runs), drained.records
    for k, v in io_delta(io0, proc_io()).items():
        setattr(record, k, v)
    record.wall_seconds = round(time.perf_counter() - t0, 6)
    stage(txn, state, changes, schemas, checkpoint, record.to_dict(), drained.runs)
    crash_point("update.before_commit")
    return record.to_dict()
