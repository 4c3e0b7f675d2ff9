"""Reading a source's events into Spark with their time as integer chronons (column ``__t``).

An event-time column may be a timestamp or date (converted with the job's origin and time unit)
or an integer count of chronons since the origin.
"""

from __future__ import annotations

import os

from .jobspec import TIME_UNITS_US, Job, JobError, Source

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
    if isinstance(dtype, (ST.TimestampType, ST.TimestampNTZType, ST.DateType)):
        if job.time_unit == "chronon":
            raise JobError(f"source {source.name}: time column {source.time_column!r} is a {dtype.simpleString()}; "
                           "set job.time_unit to us, ms, s, min or h to convert it")
        df = df.withColumn("__us", F.unix_micros(col.cast("timestamp")) - F.lit(job.origin_us))
        return df.withColumn(T, F.expr(floor_div("__us", TIME_UNITS_US[job.time_unit]))).drop("__us")
    if isinstance(dtype, (ST.LongType, ST.IntegerType, ST.ShortType, ST.ByteType)):
        return df.withColumn(T, col.cast("bigint"))
    raise JobError(f"source {source.name}: time column {source.time_column!r} has type {dtype.simpleString()}; "
                   "it must be a timestamp, a date or an integer number of chronons")


def read(spark, source: Source, job: Job, paths: list[str]):
    """A DataFrame of the events in ``paths`` (relative to the source directory) plus ``__t``."""
    opts = dict(source.options)
    if source.format == "csv":
        opts.setdefault("header", "true")
        opts.setdefault("inferSchema", "true")
    df = spark.read.format(source.format).options(**opts).load([os.path.join(source.path, p) for p in paths])
    return chronons(df, source, job)
