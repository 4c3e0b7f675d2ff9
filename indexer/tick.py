"""One tick: the results with ``ts`` in (lo, hi], computed by Spark and returned as Arrow.

A tick reads only the files whose event-time range meets ``(lo - lookback, hi]`` (the interval
plus the largest window), drops late events file by file, runs the query's builder and filters
to the tick's interval. ``frame`` is that DataFrame; ``compute`` brings it to the driver as one
Arrow table (``toArrow``), for the loader in this process. With executor loading
(``indexer/executor_load.py``) the DataFrame's rows stay on the executors.

A tick with no such file has no results for any query kind (every kind's output needs an input
event), so ``has_input`` lets the scheduler skip Spark for it. ``result_frame`` is shared with
``ebb explain``, which analyses the query over empty inputs with the sources' real schemas.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pyarrow as pa

from . import events
from .jobspec import Job, JobError
from .landing import LandedFile, files_for_range, list_files
from .patterns import Classification
from .queries import BUILDERS


@dataclass
class TickInput:
    files: int = 0  # files read
    rows: int = 0  # results
    skipped: bool = False  # no file in the input range: Spark was not run


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


def has_input(job: Job, cls: Classification, manifests: dict[str, dict[str, LandedFile]], lo: int, hi: int) -> bool:
    """Whether any landed file may hold events that the tick for (lo, hi] reads."""
    return any(files_for_range(manifests.get(w.source, {}), lo - cls.lookback + 1, hi) for w in job.query.windows)


_KEY_TYPES = ("bigint", "int", "smallint", "tinyint", "string")


# ebb's own columns (the event time ``__t`` and the like): Spark lists them among the columns it
# suggests, but a job cannot name them
_INTERNAL_COLUMN = re.compile(r"`?\b__[A-Za-z]\w*`?(, )?")


def public_message(msg: str) -> str:
    """A Spark error message without ebb's internal column names (a job cannot use them)."""
    return _INTERNAL_COLUMN.sub("", msg).replace(", ]", "]")


def result_frame(job: Job, inputs: dict, lo: int | None, hi: int | None):
    """The query's result DataFrame over ``inputs`` (None if no source has data), analysed:
    JobError if Spark rejects an expression, or the output lacks the key or has its own ts/exp."""
    from pyspark.errors import AnalysisException, ParseException

    try:
        df = BUILDERS[job.query.kind](job, inputs, lo, hi)
        if df is None:
            return None
        columns = df.columns  # analyses the plan
    except (AnalysisException, ParseException) as e:
        first = next((x.strip() for x in str(e).splitlines() if x.strip()), type(e).__name__)
        raise JobError(f"query: Spark cannot run it: {public_message(first)}") from None
    for reserved in ("ts", "exp"):
        if columns.count(reserved) > 1:
            raise JobError(f"query.select: the output may not have its own {reserved!r} column")
    if job.query.key not in columns:
        raise JobError(f"query.key {job.query.key!r} is not an output column (columns: "
                       f"{', '.join(c for c in columns if c not in ('ts', 'exp'))}); add it to query.select")
    key_type = df.schema[job.query.key].dataType.simpleString()
    if key_type not in _KEY_TYPES:
        raise JobError(f"query.key {job.query.key!r} has type {key_type}; an archive's key must be an integer or a string")
    return df


def check(spark, job: Job) -> list[str] | None:
    """Analyses the query over empty inputs with the schema of each source's first landed file,
    the way a tick would; returns the output columns as ``name: type``. None (nothing checked)
    if some source has no landed file yet."""
    inputs = {}
    for w in job.query.windows:
        src = job.sources[w.source]
        files = sorted(list_files(src.path))
        if not files:
            return None
        inputs[w.source] = events.read(spark, src, job, files[:1]).limit(0)
    df = result_frame(job, inputs, None, None)
    return [f"{f.name}: {f.dataType.simpleString()}" for f in df.schema.fields]


def frame(spark, job: Job, cls: Classification, manifests: dict[str, dict[str, LandedFile]], lo: int, hi: int):
    """(DataFrame of the results with lo < ts <= hi, ts and exp as bigint, or None if no source
    has data yet; TickInput with the files read)."""
    from pyspark.sql import functions as F

    info = TickInput()
    read_lo = lo - cls.lookback
    inputs = {}
    for w in job.query.windows:
        if w.source not in inputs:
            inputs[w.source] = _source_frame(spark, job, w.source, manifests.get(w.source, {}), read_lo, hi, info)
    df = result_frame(job, inputs, lo, hi)
    if df is None:
        return None, info
    df = df.filter((F.col("ts") > lo) & (F.col("ts") <= hi))
    return df.withColumn("ts", F.col("ts").cast("bigint")).withColumn("exp", F.col("exp").cast("bigint")), info


def compute(spark, job: Job, cls: Classification, manifests: dict[str, dict[str, LandedFile]],
            lo: int, hi: int) -> tuple[pa.Table, TickInput]:
    """Results with lo < ts <= hi as an Arrow table on the driver (no columns if no source has data yet)."""
    df, info = frame(spark, job, cls, manifests, lo, hi)
    if df is None:
        return pa.table({}), info
    table = df.toArrow()
    info.rows = table.num_rows
    return table, info
