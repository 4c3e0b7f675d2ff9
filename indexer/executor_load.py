"""Loading a tick on Spark executors: the tick's results never come to the driver.

The driver plans the update (``storage.partitioned_update.prepare``: one part per key range of a
touched Rebuild sub-index, or per NoRebuild sub-index receiving records). A ``mapInArrow`` over
the tick's DataFrame validates every batch and tags each record with its part; a repartition
makes part k Spark partition k; the task of partition k writes part k's run into the shared data
directory and returns a one-row result. The driver collects only those results and adopts them
at the archive's single commit point (``PartsCommit``, a writer of ``storage.write_sequence``),
with the scheduler's checkpoint, so a tick still commits exactly once. A failed, retried or
speculative task leaves only unreferenced files, which recovery removes at the next update.
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, fields

import numpy as np
import pyarrow as pa

from ..storage import errors, write_sequence
from ..storage.iostats import proc_io
from ..storage.partitioned_update import PartitionedUpdate, PartResult, PartsCommit, prepare
from ..storage.tuning import PART_BYTES

PART_COLUMN = "__ebb_part"
_RESULT_SCHEMA = pa.schema([
    ("part", pa.int64()), ("run", pa.binary()), ("run_name", pa.string()), ("input_rows", pa.int64()),
    ("dropped", pa.int64()), ("inserted", pa.int64()), ("deleted", pa.int64()), ("blocks_read", pa.int64()),
    ("bytes_read", pa.int64()), ("seconds", pa.float64()),
])
assert _RESULT_SCHEMA.names == [f.name for f in fields(PartResult)]
_ERROR = re.compile(r"EBB-ERROR (\w+): (.*)")
_keys_cache: dict[int, list[int]] = {}


def load(spark, archive, df, at: int, checkpoint: dict[str, bytes] | None = None, late_rows: int = 0,
         part_bytes: int = PART_BYTES, wait_s: float = 0.0) -> dict:
    """Applies the update at ``at`` with the rows of ``df`` (which has ts and exp as bigint),
    written by Spark tasks; returns the update record with the tasks' and the commit's times.
    ``wait_s``: how long to wait for another writer (an update, or a migration) to finish."""
    t0, io0 = time.perf_counter(), proc_io()
    tasks = _Tasks(spark, df, at, part_bytes, checkpoint, late_rows, t0, io0)
    record = write_sequence.run(archive, tasks, wait_s)
    record.update(parts=len(tasks.pu.parts), plan_seconds=round(tasks.t1 - t0, 3),
                  tasks_seconds=round(tasks.t2 - tasks.t1, 3), commit_seconds=round(time.perf_counter() - tasks.t2, 3),
                  part_seconds_max=max((r.seconds for r in tasks.results), default=0.0))
    return record


class _Tasks(PartsCommit):
    """The update's parts, planned and written by Spark tasks under the writer lock (after
    recovery, which would remove their runs), then committed."""

    def __init__(self, spark, df, at: int, part_bytes: int, checkpoint: dict[str, bytes] | None, late_rows: int,
                 t0: float, io0: dict):
        super().__init__(checkpoint=checkpoint, late_rows=late_rows, t0=t0, io0=io0)
        self.spark, self.df, self.at, self.part_bytes = spark, df, at, part_bytes

    def prepare(self, archive) -> bool:
        from .spark import arrow_schema

        self.pu = prepare(archive, arrow_schema(self.df.schema), self.at, self.part_bytes)
        self.t1 = time.perf_counter()
        self.results = _run_parts(self.spark, self.df, self.pu)
        self.t2 = time.perf_counter()
        return True


def _run_parts(spark, df, pu: PartitionedUpdate) -> list[PartResult]:
    from pyspark.errors import PySparkException
    from pyspark.sql.types import LongType, StructField, StructType
    from py4j.protocol import Py4JJavaError

    from .spark import arrow_schema

    n = len(pu.parts)
    keys = np.asarray(_partition_keys(spark, n), np.int64)
    input_schema = df.schema
    empty = arrow_schema(input_schema).empty_table()  # for a task given no records

    def route(batches):
        with reported():
            for b in batches:
                ids = pu.part_of(pa.Table.from_batches([b]))
                yield b.append_column(PART_COLUMN, pa.array(keys[ids], pa.int64()))

    def write(batches):
        from pyspark import TaskContext

        with reported():
            k = TaskContext.get().partitionId()
            tables = []
            for b in batches:
                if b.num_rows and not (b.column(PART_COLUMN).to_numpy() == keys[k]).all():
                    raise errors.ArchiveError(f"Spark partition {k} received records of another part")
                tables.append(pa.Table.from_batches([b]).drop_columns([PART_COLUMN]))
            table = pa.concat_tables(tables) if tables else empty
            r = pu.write_part(k, table)
            yield pa.RecordBatch.from_pylist([asdict(r)], schema=_RESULT_SCHEMA)

    routed = StructType(input_schema.fields + [StructField(PART_COLUMN, LongType(), False)])
    result_struct = "part long, run binary, run_name string, input_rows long, dropped long, inserted long, " \
                    "deleted long, blocks_read long, bytes_read long, seconds double"
    try:
        out = df.mapInArrow(route, routed).repartition(n, PART_COLUMN).mapInArrow(write, result_struct).toArrow()
    except (PySparkException, Py4JJavaError) as e:
        m = _ERROR.search(str(e))
        if m is None:
            raise
        cls = getattr(errors, m.group(1), errors.ArchiveError)
        raise cls(m.group(2)) from None
    return [PartResult(**row) for row in out.to_pylist()]


class reported:
    """Re-raises an ebb error inside a task as one line the driver can parse back (Spark wraps
    a task's exception in its own, with the Python traceback as text)."""

    def __enter__(self):
        return self

    def __exit__(self, kind, e, tb):
        if isinstance(e, errors.EbbError):
            raise RuntimeError(f"EBB-ERROR {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
        return False


def _partition_keys(spark, n: int) -> list[int]:
    """For each partition 0..n-1 of ``repartition(n, col)``, a bigint value that Spark's own hash
    sends there (asked of Spark rather than re-implemented)."""
    if n not in _keys_cache:
        from pyspark.sql import functions as F

        found: dict[int, int] = {}
        size = 8 * n
        while len(found) < n:
            t = spark.range(0, size).select("id", F.expr(f"pmod(hash(id), {n})").alias("p")).toArrow()
            for v, p in zip(t.column("id").to_pylist(), t.column("p").to_pylist()):  # 8n values, once per n
                found.setdefault(p, v)
            size *= 4
        _keys_cache[n] = [found[p] for p in range(n)]
    return _keys_cache[n]
