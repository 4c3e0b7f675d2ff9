"""Kind ``window``: a time-based sliding window (RANGE w, optional SLIDE a) over one source,
with an optional filter and projection. Result rows keep the event's columns (or the
projection) and are valid on the event's window interval. Update pattern: weakest."""

from __future__ import annotations

from pyspark.sql import functions as F

from ..jobspec import Job
from .validity import EXP, TS, payload_columns, with_validity


def results(job: Job, inputs: dict, lo: int | None = None, hi: int | None = None):
    q = job.query
    w = q.windows[0]
    df = inputs.get(w.source)
    if df is None:
        return None
    if q.filter:
        df = df.filter(F.expr(q.filter))
    df = with_validity(df, w)
    src = job.sources[w.source]
    select = list(q.select) or payload_columns(df, {src.time_column})
    return df.selectExpr(*select, f"{TS} AS ts", f"{EXP} AS exp")
