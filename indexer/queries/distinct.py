"""Kind ``distinct``: duplicate elimination over a time window.

At every instant each distinct value (the projection ``select``) of the window's contents
appears once. Events of one value, ordered by their window intervals, contribute disjoint
pieces: event i covers ``[max(ts_i, max earlier exp), exp_i)``, which is empty (and dropped)
when earlier events already cover it. The pieces' union is the value's validity, and each
piece's end is known when it is produced. Update pattern: weak."""

from __future__ import annotations

from pyspark.sql import Window as W
from pyspark.sql import functions as F

from ..jobspec import Job, JobError, check_query
from .validity import EXP, TS, with_validity


def results(job: Job, inputs: dict, lo: int | None = None, hi: int | None = None):
    q = job.query
    w = q.windows[0]
    df = inputs.get(w.source)
    if df is None:
        return None
    check_query(q)  # jobs built in code skip load_job
    if q.filter:
        df = df.filter(F.expr(q.filter))
    vals = with_validity(df, w).selectExpr(*q.select, TS, EXP)
    cols = [c for c in vals.columns if c not in (TS, EXP)]
    if q.key not in cols:
        raise JobError(f"query.key {q.key!r} must be one of the selected columns ({', '.join(cols)})")
    earlier = W.partitionBy(*[F.col(f"`{c}`") for c in cols]).orderBy(TS, EXP).rowsBetween(W.unboundedPreceding, -1)
    pieces = vals.withColumn("__prev", F.max(EXP).over(earlier)).withColumn(
        "__start", F.greatest(F.col(TS), F.coalesce(F.col("__prev"), F.col(TS))))
    pieces = pieces.filter(F.col(EXP) > F.col("__start"))
    return pieces.selectExpr(*[f"`{c}`" for c in cols], "__start AS ts", f"{EXP} AS exp")
