"""One tick: the results with ``ts`` in (lo, hi], computed by Spark and returned as Arrow.

A tick reads only the files whose event-time range meets ``(lo - lookback, hi]`` (the interval
plus the largest window), drops late events file by file, runs the query's builder and filters
to the tick's interval. The result travels to the loader as one Arrow table (``toArrow``).
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from . import events
from .jobspec import Job, JobError
from .landing import LandedFile, files_for_range
from .patterns import Classification
from .queries import BUILDERS


@dataclass
class TickInput:
    files: int = 0  # files read
    rows: int = 0  # results


def _source_frame(spark, job: Job, name: str, manifest: dict[str, LandedFile], lo: int, hi: int, info: TickInput):
    """Events of one source with lo < t <= hi and not late; None if the source never had a file."""
    from pyspark.sql import functions as F

    if not manifest:
        return None
    src = job.sources[name]
    groups = files_for_range(manifest, lo + 1, hi)
    frames = []
    for threshold, paths in groups.items():
        df = events.read(spark, src, job, paths)
        if threshold is not None:
            df = df.filter(F.col(events.T) > threshold)
        frames.append(df)
        info.files += len(paths)
    if not frames:
        # keep the schema so the query still type-checks: read one file, take no rows
        any_file = sorted(manifest)[0]
        return events.read(spark, src, job, [any_file]).limit(0)
    df = frames[0]
    for f in frames[1:]:
        df = df.unionByName(f)
    return df.filter((F.col(events.T) > lo) & (F.col(events.T) <= hi))


def compute(spark, job: Job, cls: Classification, manifests: dict[str, dict[str, LandedFile]],
            lo: int, hi: int) -> tuple[pa.Table, TickInput]:
    """Results with lo < ts <= hi as an Arrow table (no columns if no source has data yet)."""
    from pyspark.sql import functions as F

    info = TickInput()
    read_lo = lo - cls.lookback
    inputs = {}
    for w in job.query.windows:
        if w.source not in inputs:
            inputs[w.source] = _source_frame(spark, job, w.source, manifests.get(w.source, {}), read_lo, hi, info)
    df = BUILDERS[job.query.kind](job, inputs, lo, hi)
    if df is None:
        return pa.table({}), info
    for reserved in ("ts", "exp"):
        if df.columns.count(reserved) > 1:
            raise JobError(f"query.select: the output may not have its own {reserved!r} column")
    if job.query.key not in df.columns:
        raise JobError(f"query.key {job.query.key!r} is not an output column (columns: {', '.join(df.columns)})")
    df = df.filter((F.col("ts") > lo) & (F.col("ts") <= hi))
    df = df.withColumn("ts", F.col("ts").cast("bigint")).withColumn("exp", F.col("exp").cast("bigint"))
    table = df.toArrow()
    info.rows = table.num_rows
    return table, info
