"""Spark data source ``ebb``: read an archive as a DataFrame (PySpark 4 Python data source API).

    from ebb.query.spark_source import register
    register(spark)                          # once per session
    df = spark.read.format("ebb").option("as_of", 1200).load("/data/arc")
    df.filter("key = 42")                    # pushed down: probes, not a scan

- Partitions: one per read task of storage's plan (``Snapshot.plan``): a scan gets a task per
  run of each sub-index (at most 64 MiB each), read in parallel; each partition executes its task
  (``Snapshot.read``) and streams Arrow record batches (no per-row Python).
- Filters on the key column are pushed down (``pushFilters``): ``=``, ``IN`` (and ``<=>``) become
  probes and ``<``, ``<=``, ``>``, ``>=`` key ranges; the plan then holds only the blocks that may
  hold those keys (found from the block directories; no data is read to plan). Other filters
  are left to Spark.
- Consistency: the planner takes a lease on the committed version it plans on (``Snapshot.lease``)
  and every partition carries it: whatever commits while the action runs, every task reads the
  planned version's blocks, which garbage collection keeps while the lease lives. Each task
  renews the lease as it reads; it expires ``lease_seconds`` after the last renewal (the source
  has no end-of-action hook), and the space it pinned comes back at the next update after that.
- Options: ``as_of`` (int chronons: the last update's time by default, or any instant the archive
  retains, ``ebb init --retain``); ``lease_seconds`` (default 60: every task renews it as it reads, so it lapses a minute after the last task of the action read); ``metrics_dir``: each
  partition writes a JSON file there with what it read (``ReadStats``: sub-indices, blocks,
  bytes, rows), for tests and tuning.

Writes: ``df.write.format("ebb").option("at", T).mode("append").save(PATH)`` loads a DataFrame as
the update at T, and ``df.writeStream.format("ebb")`` each micro-batch as the next update
(``indexer.spark_writer``; docs/offline-analysis.md, "Writing from Spark").

Planning runs on the driver, from the archive's metadata (or the copy published in a data
directory). Executors need only the data directory (docs/cluster.md): a partition reads its
planned blocks directly (``read_unpinned``); if its lease expired and the blocks were reclaimed,
it fails saying so, never with another version's rows.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass, replace
from typing import Any, Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource, DataSourceReader, DataSourceStreamWriter, DataSourceWriter, EqualNullSafe, EqualTo, Filter,
    GreaterThan, GreaterThanOrEqual, In, InputPartition, IsNotNull, LessThan, LessThanOrEqual,
)
from pyspark.sql.types import StructType

from ..storage.errors import ReadError, UsageError

FORMAT = "ebb"
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
# a Spark action has no end the source is told of: its lease lapses this long after a task last read
LEASE_SECONDS = 60.0


def register(spark) -> None:
    """Registers the ``ebb`` format with ``spark`` and enables Python filter pushdown (Spark
    refuses to plan a Python source that implements pushFilters without it)."""
    spark.conf.set(PUSHDOWN_CONF, "true")
    spark.dataSource.register(EbbDataSource)


@dataclass(frozen=True)
class KeySelection:
    """The keys the pushed filters allow: a set of points and/or inclusive bounds (None: open).
    ``points is None`` means no equality filter was pushed."""

    points: tuple | None = None
    lo: Any = None
    hi: Any = None

    def with_points(self, values) -> "KeySelection":
        vals = set(values)
        return replace(self, points=tuple(sorted(vals if self.points is None else vals & set(self.points))))

    def with_lo(self, v) -> "KeySelection":
        return replace(self, lo=v if self.lo is None else max(self.lo, v))

    def with_hi(self, v) -> "KeySelection":
        return replace(self, hi=v if self.hi is None else min(self.hi, v))

    @property
    def bounded(self) -> bool:
        return self.lo is not None or self.hi is not None

    def resolved_points(self) -> tuple | None:
        """The points within the bounds (None if no equality filter)."""
        if self.points is None:
            return None
        return tuple(p for p in self.points if (self.lo is None or p >= self.lo) and (self.hi is None or p <= self.hi))

    @property
    def empty(self) -> bool:
        pts = self.resolved_points()
        if pts is not None:
            return not pts
        return self.lo is not None and self.hi is not None and self.lo > self.hi


class EbbPartition(InputPartition):
    """One read task of the plan of one committed version (``update_seq``), pinned by ``lease``.
    ``kind`` is scan, probe or probe_range (what the pushed filters asked for)."""

    def __init__(self, task, update_seq: int, kind: str, read_args: tuple, lease):
        super().__init__(task.subindex)
        self.task, self.update_seq, self.kind, self.lease = task, update_seq, kind, lease
        self.read_args = read_args  # (data_dir, schema, config): to read without the metadata

    def __repr__(self) -> str:
        t = self.task
        return f"EbbPartition(I{t.subindex + 1} {t.file}, {len(t.blocks)} blocks, {self.kind}, update {self.update_seq}, as_of {t.as_of})"


class EbbDataSource(DataSource):
    """``spark.read.format("ebb").load(PATH)``."""

    def __init__(self, options: dict[str, str]):
        super().__init__(options)
        path = options.get("path")
        if not path:
            raise UsageError("the ebb data source needs a path: spark.read.format('ebb').load(PATH)")
        self.path = os.path.abspath(path)
        raw = options.get("as_of")
        try:
            self.as_of = None if raw in (None, "") else int(raw)
        except ValueError:
            raise UsageError(f"option as_of must be an integer number of chronons, got {raw!r}") from None
        raw = options.get("lease_seconds")
        try:
            self.lease_seconds = LEASE_SECONDS if raw in (None, "") else float(raw)
        except ValueError:
            self.lease_seconds = float("nan")
        if not self.lease_seconds > 0:  # also NaN: not a number, or "nan"
            raise UsageError(f"option lease_seconds must be a positive number of seconds, got {raw!r}")
        self.metrics_dir = options.get("metrics_dir") or None

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        from pyspark.sql.pandas.types import from_arrow_schema

        from ..storage.archive import open_readonly

        with open_readonly(self.path) as arc:
            schema = arc.schema
        if schema is None:
            raise ReadError(f"the archive {self.path} is empty: nothing has been loaded, so it has no schema yet")
        return from_arrow_schema(schema)

    def reader(self, schema: StructType) -> "EbbReader":
        from ..storage.archive import open_readonly

        with open_readonly(self.path) as arc:
            cfg = arc.config
            stored = arc.schema
        if stored is None:
            raise ReadError(f"the archive {self.path} is empty: nothing has been loaded")
        missing = [f.name for f in schema.fields if f.name not in stored.names]
        if missing:
            raise ReadError(f"column(s) {', '.join(missing)} are not in the archive (it has {', '.join(stored.names)})")
        key_is_int = pa.types.is_integer(stored.field(cfg.key_column).type)
        return EbbReader(self.path, self.as_of, self.lease_seconds, self.metrics_dir, schema, cfg.key_column,
                         key_is_int)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """``df.write.format("ebb").option("at", T).mode("append").save(PATH)``: the update at T
        (``indexer.spark_writer``)."""
        from ..indexer import spark_writer

        _refuse_overwrite(overwrite)
        at = spark_writer.options_at(self.options, streaming=False)
        return spark_writer.EbbWriter(self.path, spark_writer.plan(self.path, schema, at))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """``df.writeStream.format("ebb").start(PATH)``: each micro-batch the next update."""
        from ..indexer import spark_writer

        _refuse_overwrite(overwrite)
        spark_writer.options_at(self.options, streaming=True)
        return spark_writer.EbbStreamWriter(self.path, spark_writer.plan(self.path, schema, None))


def _refuse_overwrite(overwrite: bool) -> None:
    if overwrite:
        raise UsageError("an ebb archive only appends updates: write with mode('append') (outputMode('append') "
                         "when streaming); to start over, create a new archive with `ebb init`")


class EbbReader(DataSourceReader):
    """Plans partitions on one committed state and reads them as Arrow record batches."""

    def __init__(self, path: str, as_of: int | None, lease_seconds: float, metrics_dir: str | None,
                 schema: StructType, key_column: str, key_is_int: bool):
        self.path, self.as_of, self.lease_seconds, self.metrics_dir = path, as_of, lease_seconds, metrics_dir
        self.schema = schema
        self.key_column, self.key_is_int = key_column, key_is_int
        self.selection = KeySelection()

    # -- planning (driver-side Python worker) ----------------------------------------------------
    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        """Takes the filters on the key column that probes answer exactly; yields the rest (Spark
        evaluates those after the read)."""
        for f in filters:
            if not self._push(f):
                yield f

    def _key_value(self, v: Any) -> bool:
        from ..storage.keys import MAX_STRING_KEY_BYTES

        if self.key_is_int:
            return isinstance(v, int) and not isinstance(v, bool) and _INT64_MIN <= v <= _INT64_MAX
        return isinstance(v, str) and len(v.encode()) <= MAX_STRING_KEY_BYTES

    def _push(self, f: Filter) -> bool:
        """Narrows the selection by ``f``; True if the read then answers ``f`` exactly."""
        if getattr(f, "attribute", None) != (self.key_column,):
            return False
        sel = self.selection
        if isinstance(f, IsNotNull):
            return True  # keys are never null
        if isinstance(f, (EqualTo, EqualNullSafe)):
            if not self._key_value(f.value):
                return False
            self.selection = sel.with_points([f.value])
            return True
        if isinstance(f, In):
            # a NULL in the list matches nothing; any other non-key value: leave it to Spark
            vals = [v for v in f.value if v is not None]
            if not all(self._key_value(v) for v in vals):
                return False
            self.selection = sel.with_points(vals)
            return True
        if not isinstance(f, (GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual)) or not self._key_value(f.value):
            return False
        v = f.value
        strict = isinstance(f, (GreaterThan, LessThan))
        if self.key_is_int and strict:
            # integer keys: x > v is x >= v+1, exactly; out of int64 means nothing matches
            v = v + 1 if isinstance(f, GreaterThan) else v - 1
            if not _INT64_MIN <= v <= _INT64_MAX:
                self.selection = sel.with_points([])
                return True
        lower = isinstance(f, (GreaterThan, GreaterThanOrEqual))
        self.selection = sel.with_lo(v) if lower else sel.with_hi(v)
        # strict string bounds are read inclusively; Spark drops the bound itself afterwards
        return not (strict and not self.key_is_int)

    def partitions(self) -> Sequence[InputPartition]:
        from ..storage.archive import open_readonly
        from ..storage.read_plan import KeyRange, Probe, Scan

        with open_readonly(self.path) as arc, arc.snapshot() as snap:
            sel = self.selection
            points = sel.resolved_points()
            if sel.empty:
                return []  # Spark then runs one partition of InputPartition(None): no rows
            if points is not None:
                request, kind = Probe(points), "probe"
            elif sel.bounded:
                request, kind = KeyRange(sel.lo, sel.hi), "probe_range"
            else:
                request, kind = Scan(), "scan"
            tasks = snap.plan(request, self.as_of)
            if not tasks:
                return []
            try:
                lease = snap.lease(self.as_of, self.lease_seconds)  # taken while the snapshot still pins it
            except OSError:  # a read-only data directory: the read lasts as long as its version is kept
                lease = None
            args = snap.read_args()
            return [EbbPartition(task, snap.state.update_seq, kind, args, lease) for task in tasks]

    # -- reading (executor-side Python worker) ----------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, EbbPartition):
            return  # the placeholder partition Spark adds when the plan has none
        from ..indexer.spark import arrow_schema

        from ..storage.snapshot import read_unpinned
        from .reader import ReadStats

        target = arrow_schema(self.schema)
        names = self.schema.fieldNames()
        rows = 0
        lease = partition.lease
        try:
            if lease is not None:
                lease.renew()
            for b in read_unpinned(partition.task, *partition.read_args):
                if lease is not None:
                    lease.renew()  # touches the lease file at most every lease_seconds / 8
                rows += b.num_rows
                yield b.select(names).cast(target)
        finally:
            if self.metrics_dir:
                stats = ReadStats()
                stats.count(partition.task)
                self._write_metrics(partition, stats, rows)

    def _write_metrics(self, partition: EbbPartition, stats, rows: int) -> None:
        os.makedirs(self.metrics_dir, exist_ok=True)
        t = partition.task
        rec = {"subindex": t.subindex + 1, "file": t.file, "kind": partition.kind, "update_seq": partition.update_seq,
               "as_of": t.as_of, "rows": rows, "pid": os.getpid(), **stats.to_dict()}
        # one file per partition run (a unique name, so retries and parallel tasks never collide)
        name = os.path.join(self.metrics_dir, f"I{t.subindex + 1:04d}-{uuid.uuid4().hex}.json")
        with open(name + ".tmp", "w") as f:
            json.dump(rec, f)
        os.replace(name + ".tmp", name)
