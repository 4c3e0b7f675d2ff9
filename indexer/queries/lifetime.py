"""Kind ``lifetime``: events with explicit lifetimes (a constant per source, or a column),
valid on [t, t + lifetime). Several sources are unioned (e.g. sensors polled every 10 and
every 15 minutes); a ``source`` column says where each row came from. Update pattern: weakest
if every lifetime is the same constant, else weak."""

from __future__ import annotations

from pyspark.sql import functions as F

from ..jobspec import Job
from .validity import EXP, TS, payload_columns, with_validity


def results(job: Job, inputs: dict, lo: int | None = None, hi: int | None = None):
    q = job.query
    parts = []
    for w in q.windows:
        df = inputs.get(w.source)
        if df is None:
            continue
        src = job.sources[w.source]
        if q.filter:
            df = df.filter(F.expr(q.filter))
        df = with_validity(df, w)
        skip = {src.time_column, src.key}
        if w.lifetime_column:
            skip.add(w.lifetime_column)
        select = list(q.select) or ([f"`{src.key}` AS `{q.key}`"] + payload_columns(df, skip | {q.key}))
        parts.append(df.selectExpr(*select, f"'{w.source}' AS source", f"{TS} AS ts", f"{EXP} AS exp"))
    if not parts:
        return None
    out = parts[0]
    for p in parts[1:]:
        out = out.unionByName(p, allowMissingColumns=True)
    return out
