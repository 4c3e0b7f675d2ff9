"""Reading a source's events into Spark with their time as integer chronons (column ``__t``).

An event-time column may be a timestamp or date of any unit, with or without a zone (converted
with the job's origin and time unit), an integer count of ``epoch_unit`` since 1970 UTC, or an
integer count of chronons since the origin. Parquet nanosecond timestamps (pandas' default),
which Spark cannot read as timestamps, are read as integers and turned back into (microsecond)
timestamps here, as the file's footer says they are.
"""

from __future__ import annotations

import os

from .jobspec import EPOCH_UNITS_NS, TIME_UNITS_US, Job, JobError, Source

T = "__t"  # the chronon column every event DataFrame carries


def floor_div(x: str, d: int) -> str:
    """Spark SQL for floor(x / d), exact on bigints of either sign (d a positive constant)."""
    return f"((({x}) - pmod(({x}), {d})) div {d})"


def ceil_div(x: str, d: int) -> str:
    """Spark SQL for ceil(x / d)."""
    return f"(-{floor_div(f'-({x})', d)})"


def chronons(df, source: Source, job: Job):
    """``df`` with ``__t``: its event time as bigint chronons."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as ST

    if source.time_column not in df.columns:
        raise JobError(f"source {source.name}: time column {source.time_column!r} not found (columns: {', '.join(df.columns)})")
    dtype = df.schema[source.time_column].dataType
    col = F.col(f"`{source.time_column}`")
    if source.epoch_unit and isinstance(dtype, (ST.LongType, ST.IntegerType, ST.ShortType, ST.ByteType)):
        ns = EPOCH_UNITS_NS[source.epoch_unit]  # to microseconds: rounded down, as Spark's timestamps are
        x = f"cast(`{source.time_column}` as bigint)"
        us = f"{x} * {ns // 1000}" if ns >= 1000 else floor_div(x, 1000 // ns)
        df = df.withColumn("__us", F.expr(us) - F.lit(job.origin_us))
        return df.withColumn(T, F.expr(floor_div("__us", TIME_UNITS_US[job.time_unit]))).drop("__us")
    if isinstance(dtype, (ST.TimestampType, ST.TimestampNTZType, ST.DateType)):
        if job.time_unit == "chronon":
            raise JobError(f"source {source.name}: time column {source.time_column!r} is a {dtype.simpleString()}; "
                           "set job.time_unit to us, ms, s, min or h to convert it")
        df = df.withColumn("__us", F.unix_micros(col.cast("timestamp")) - F.lit(job.origin_us))
        return df.withColumn(T, F.expr(floor_div("__us", TIME_UNITS_US[job.time_unit]))).drop("__us")
    if isinstance(dtype, (ST.LongType, ST.IntegerType, ST.ShortType, ST.ByteType)):
        return df.withColumn(T, col.cast("bigint"))
    raise JobError(f"source {source.name}: time column {source.time_column!r} has type {dtype.simpleString()}; "
                   "it must be a timestamp, a date or an integer number of chronons (or of epoch_unit)"
                   + ("; text that is not all ISO 8601 timestamps stays a string" if isinstance(dtype, ST.StringType) else ""))


def _nanos_as_timestamps(df, first_file: str):
    """``df`` with each column the Parquet footer of ``first_file`` declares a nanosecond
    timestamp (read as bigint nanoseconds, ``spark.sql.legacy.parquet.nanosAsLong``) turned into
    a timestamp (with a zone) or timestamp_ntz (without), rounded down to the microsecond."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql import functions as F

    try:
        schema = pq.read_schema(first_file)
    except (OSError, pa.ArrowException) as e:
        raise JobError(f"cannot read the Parquet footer of {first_file}: {e}") from None
    for f in schema:
        if pa.types.is_timestamp(f.type) and f.type.unit == "ns" and f.name in df.columns:
            us = F.timestamp_micros(F.expr(floor_div(f"`{f.name}`", 1000)))
            df = df.withColumn(f.name, us if f.type.tz is not None else us.cast("timestamp_ntz"))
    return df


def _unreadable(source: Source, files: list[str], error: Exception) -> JobError:
    """The one-line error for a load Spark refused: the source, the file and, for Parquet, the
    columns of a type Spark cannot read, as the file's footer gives them."""
    first = " ".join(str(error).split())[:240]
    culprit = ""
    if source.format == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        for path in files:
            try:
                bad = [f"{f.name} ({f.type})" for f in pq.read_schema(path) if not _spark_reads(f.type)]
            except (OSError, pa.ArrowException):
                return JobError(f"source {source.name}: {path} is not a readable Parquet file: {first}")
            if bad:
                return JobError(f"source {source.name}: {path}: column {', '.join(bad)} has a type Spark cannot "
                                f"read; write it as another type (e.g. a timestamp or int64)")
        culprit = f" (in {files[0]}" + (f" or {len(files) - 1} more" if len(files) > 1 else "") + ")"
    return JobError(f"source {source.name}: Spark cannot read the {source.format} files{culprit}: {first}")


def _spark_reads(t) -> bool:
    """Whether Spark reads a Parquet column of Arrow type ``t`` (nanosecond timestamps: as above)."""
    import pyarrow as pa

    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _spark_reads(t.value_type)
    if pa.types.is_struct(t):
        return all(_spark_reads(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_map(t):
        return _spark_reads(t.key_type) and _spark_reads(t.item_type)
    return not (pa.types.is_time(t) or pa.types.is_duration(t) or pa.types.is_interval(t)
                or pa.types.is_float16(t) or pa.types.is_null(t))


def read(spark, source: Source, job: Job, paths: list[str]):
    """A DataFrame of the events in ``paths`` (relative to the source directory) plus ``__t``."""
    from pyspark.errors import PySparkException

    opts = dict(source.options)
    if source.format == "csv":
        opts.setdefault("header", "true")
        opts.setdefault("inferSchema", "true")
    if source.format == "json":
        opts.setdefault("inferTimestamp", "true")  # ISO 8601 text as timestamps, as CSV's inferSchema does
    files = [os.path.join(source.path, p) for p in paths]
    try:
        df = spark.read.format(source.format).options(**opts).load(files)
    except PySparkException as e:
        raise _unreadable(source, files, e) from None
    if source.format == "parquet" and files:
        df = _nanos_as_timestamps(df, files[0])
    return chronons(df, source, job)
