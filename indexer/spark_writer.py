"""Spark writes into an archive: ``df.write.format("ebb")`` loads a DataFrame as one update and
``df.writeStream.format("ebb")`` loads each micro-batch as one (PySpark's Python data source
write API: ``DataSourceArrowWriter`` and ``DataSourceStreamArrowWriter``, Arrow batches in).

    df.write.format("ebb").option("at", 1200).mode("append").save("/data/arc")

It is ``executor_load`` cut where the data source API cuts a write. The driver plans the update
(``partitioned_update.prepare``, in ``DataSource.writer``); each Spark task validates its share of
the DataFrame and routes every record to the update's parts (``part_of``) and returns a
``TaskOutput``; the driver commits the outputs Spark hands to ``commit`` (one per partition: the
attempt Spark committed) in the archive's single LMDB transaction (``PartsCommit``, a writer of
``storage.write_sequence``). A Python data source cannot ask Spark to shuffle its input
(PySpark's ``PythonWrite`` requests no distribution), so a task holds an arbitrary share of
every part, and what it writes depends on the mode:

- NoRebuild: a part's new run only adds records, so each task writes one run per part it has
  records for (``write_part``), and the commit adopts them all (one new run per task and
  sub-index).
- Rebuild: a part's new run merges the part's old blocks with all of its new records, which no
  one task holds. Tasks stage their validated records, by part, in the data directory; at the
  commit the driver writes each part's merged run (``write_part``, the same maintenance code).
  For Rebuild runs written by executors, use ``ebb run --load-on executors``.

Exactly once: an update time loads once (``validate.update_slot`` refuses an ``at`` that is not
after the last update), so a retried job fails at planning with that error and loads nothing.
A micro-batch is the update at the next update time (the last update's time + Delta, or tau for
an empty archive); its commit records the query's id and batch id (checkpoint
``spark-stream:QUERY_ID``), and a batch that a restarted query runs again is skipped.

The writer lock is held only during the commit, which refuses to commit if another update
committed since the plan, or if a run file a task wrote is gone (another writer's recovery
removed it). Files of failed task attempts, of a write that was not committed and staged
records are never referenced; recovery (run after this writer's commit, as its files exist
before it takes the lock, and before every other writer's) deletes them.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Iterator

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from ..storage import write_sequence
from ..storage.archive import Archive
from ..storage.errors import ArchiveError, UsageError
from ..storage.iostats import proc_io
from ..storage.partitioned_update import PartitionedUpdate, PartResult, PartsCommit, prepare
from .executor_load import reported

STREAM_CHECKPOINT = "spark-stream:"  # + the streaming query's id: the last batch it committed
STAGE_SUFFIX = ".stage.tmp"  # staged records: ``.tmp``, so recovery removes what no commit read
# local properties Structured Streaming gives each task of a micro-batch
_QUERY_ID, _BATCH_ID = "sql.streaming.queryId", "streaming.sql.batchId"


@dataclass
class TaskOutput(WriterCommitMessage):
    """What one task returns: the plan it wrote for, and its runs (NoRebuild) or the file of its
    staged records with the part of each record batch in it (Rebuild)."""

    plan: tuple  # ``_plan_key`` of the update it wrote for
    results: list[PartResult] = field(default_factory=list)
    staged: str | None = None
    staged_parts: list[int] = field(default_factory=list)
    query: str | None = None  # streaming: the query's id
    batch: int | None = None  # streaming: the micro-batch's id


def options_at(options: dict, streaming: bool) -> int | None:
    """The ``at`` option: required by a batch write, refused by a streaming one."""
    raw = options.get("at")
    if streaming:
        if raw not in (None, ""):
            raise UsageError("option at is for batch writes: a streaming write loads each micro-batch "
                             "at the next update time")
        return None
    try:
        return int(raw)
    except (TypeError, ValueError):
        raise UsageError(f"option at (the update time, in chronons) is required and must be an integer, got {raw!r}: "
                         "df.write.format('ebb').option('at', T).mode('append').save(PATH)") from None


def plan(path: str, schema: StructType, at: int | None) -> PartitionedUpdate:
    """The update at ``at`` (None: the next update time) of records with Spark schema ``schema``.
    Raises RejectedBatch if ``at`` is not after the last update or the schema does not match."""
    from .spark import arrow_schema

    with Archive(path) as archive, archive.metadata_errors():
        if at is None:
            state, tm = archive.state(), archive.config.time
            at = tm.time_of(0 if state.last_slot is None else state.last_slot + 1)
        return prepare(archive, arrow_schema(schema), at)


def write_task(pu: PartitionedUpdate, batches: Iterator[pa.RecordBatch], query: str | None = None,
               batch: int | None = None) -> TaskOutput:
    """A task's share of the update (see the module docstring); RejectedBatch for bad input."""
    with reported():
        if pu.config.mode == "norebuild":
            return TaskOutput(_plan_key(pu), _write_runs(pu, batches), query=query, batch=batch)
        staged, parts = _stage(pu, batches)
        return TaskOutput(_plan_key(pu), [], staged, parts, query, batch)


def _plan_key(pu: PartitionedUpdate) -> tuple:
    """What tasks and the commit must agree on: the version planned on, the time, the parts."""
    return pu.base_seq, pu.at, tuple((p.i, p.lo) for p in pu.parts)


def _write_runs(pu: PartitionedUpdate, batches: Iterator[pa.RecordBatch]) -> list[PartResult]:
    """NoRebuild: one run per part this task has records for."""
    tables = [pa.Table.from_batches([b]) for b in batches if b.num_rows]
    if not tables:
        return []
    table = pa.concat_tables(tables)
    part = pu.part_of(table)
    return [pu.write_part(int(k), table.filter(pa.array(part == k))) for k in np.unique(part)]


def _stage(pu: PartitionedUpdate, batches: Iterator[pa.RecordBatch]) -> tuple[str | None, list[int]]:
    """Rebuild: this task's records, validated, in an Arrow file of the data directory, one
    record batch per (input batch, part) as they arrive (so a task holds one batch at a time)."""
    path = os.path.join(pu.data_dir, f"spark-{uuid.uuid4().hex}{STAGE_SUFFIX}")
    parts: list[int] = []
    writer = None
    try:
        for b in batches:
            if not b.num_rows:
                continue
            part = pu.part_of(pa.Table.from_batches([b]))
            writer = writer or pa.ipc.new_file(path, b.schema)
            for k in np.unique(part):
                writer.write_batch(b.filter(pa.array(part == k)))
                parts.append(int(k))
    except BaseException:
        if writer is not None:
            writer.close()
            os.remove(path)
        raise
    if writer is None:
        return None, []
    writer.close()
    return path, parts


def _staged_part(pu: PartitionedUpdate, outputs: list[TaskOutput], k: int) -> pa.Table:
    """Part ``k``'s staged records, from every task's file."""
    batches = []
    for o in outputs:
        if k in o.staged_parts:
            reader = pa.ipc.open_file(pa.memory_map(o.staged))
            batches += [reader.get_batch(n) for n, p in enumerate(o.staged_parts) if p == k]
    return pa.Table.from_batches(batches) if batches else pu.schema.empty_table()


def commit(path: str, pu: PartitionedUpdate, outputs: list[TaskOutput | None]) -> dict | None:
    """Commits the update planned as ``pu`` with the outputs of its tasks, one per Spark
    partition; returns its record, or None for a micro-batch committed before."""
    t0, io0 = time.perf_counter(), proc_io()
    if any(o is None for o in outputs):
        raise ArchiveError("a task of this write returned no result; nothing was committed")
    with Archive(path) as archive:
        return write_sequence.run(archive, _Commit(pu, outputs, t0, io0))


class _Commit(PartsCommit):
    """The tasks' outputs adopted under the writer lock. Their files exist before it, so
    recovery runs after the commit (it then removes failed task attempts' runs and the staged
    records), and a micro-batch committed before commits nothing."""

    runs_before_lock = True

    def __init__(self, pu: PartitionedUpdate, outputs: list[TaskOutput], t0: float, io0: dict):
        super().__init__(pu, t0=t0, io0=io0)
        self.outputs = outputs
        self.stream = {(o.query, o.batch) for o in outputs if o.query is not None}

    def prepare(self, archive) -> bool:
        pu, outputs = self.pu, self.outputs
        if self.stream:
            (query, batch), = self.stream
            name = STREAM_CHECKPOINT + query
            done = archive.checkpoint(name)
            if done is not None and json.loads(done)["batch"] >= batch:
                return False
            self.checkpoint = {name: json.dumps({"batch": batch, "at": pu.at}).encode()}
        _check_unmoved(archive, pu, outputs)
        if pu.config.mode == "rebuild":
            self.results = [pu.write_part(k, _staged_part(pu, outputs, k)) for k in range(len(pu.parts))]
        else:
            # several tasks write runs of one part: the commit takes each run as a part of its own
            runs = [r for o in outputs for r in o.results]
            self.pu = replace(pu, parts=[pu.parts[r.part] for r in runs])
            self.results = [replace(r, part=n) for n, r in enumerate(runs)]
        return True


def _check_unmoved(archive: Archive, pu: PartitionedUpdate, outputs: list[TaskOutput]) -> None:
    """ArchiveError unless the archive is still at the version the tasks wrote for, and every
    file they wrote is still there (caller holds the writer lock, so nothing can remove it now)."""
    seq = archive.state().update_seq
    if seq != pu.base_seq or any(o.plan != _plan_key(pu) for o in outputs):
        raise ArchiveError(f"the archive changed (update {seq} committed) while this write ran; nothing was committed: "
                           "write again")
    names = [o.staged for o in outputs if o.staged] + [r.run_name for o in outputs for r in o.results if r.run_name]
    gone = [n for n in names if not os.path.exists(os.path.join(pu.data_dir, n))]
    if gone:
        raise ArchiveError(f"{len(gone)} files this write's tasks wrote were removed (by another writer's recovery), "
                           f"e.g. {os.path.basename(gone[0])}; nothing was committed: write again")


def _remove_outputs(pu: PartitionedUpdate, outputs: list[TaskOutput | None]) -> None:
    """After a failed write: the files its successful tasks wrote (recovery would, later)."""
    for o in outputs:
        if o is None:
            continue
        for name in [o.staged] + [r.run_name for r in o.results]:
            if name:
                try:
                    os.remove(os.path.join(pu.data_dir, name))
                except FileNotFoundError:
                    pass


class EbbWriter(DataSourceArrowWriter):
    """``df.write.format("ebb").option("at", T).mode("append").save(PATH)``: the update at T."""

    def __init__(self, path: str, pu: PartitionedUpdate):
        self.path, self.pu = path, pu

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskOutput:
        return write_task(self.pu, iterator)

    def commit(self, messages: list[TaskOutput | None]) -> None:
        commit(self.path, self.pu, messages)

    def abort(self, messages: list[TaskOutput | None]) -> None:
        _remove_outputs(self.pu, messages)


class EbbStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("ebb").start(PATH)``: each micro-batch the update at the next
    update time. Spark calls ``DataSource.streamWriter`` for every micro-batch, before its tasks
    and again for its commit, so each plans on the archive's newest version."""

    def __init__(self, path: str, pu: PartitionedUpdate):
        self.path, self.pu = path, pu

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskOutput:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        return write_task(self.pu, iterator, ctx.getLocalProperty(_QUERY_ID), int(ctx.getLocalProperty(_BATCH_ID)))

    def commit(self, messages: list[TaskOutput | None], batchId: int) -> None:
        if any(o is not None and o.batch != batchId for o in messages):
            raise ArchiveError(f"micro-batch {batchId} received results of another batch; nothing was committed")
        if messages:  # a micro-batch with no task has no query id to record: nothing to load
            commit(self.path, self.pu, messages)

    def abort(self, messages: list[TaskOutput | None], batchId: int) -> None:
        _remove_outputs(self.pu, messages)
