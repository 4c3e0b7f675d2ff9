"""Kind ``aggregate``: a windowed aggregate evaluated by window ids (WID; Li et al. 2005).

With RANGE r SLIDE a, extent k covers events with ``max(0, (k+1)a - r) <= t < (k+1)a``; an
event at t belongs to extents ``floor(t/a) .. floor((t+r)/a) - 1``. Each non-empty
(extent, group) gives one row valid on ``[(k+1)a - 1, (k+2)a - 1)``: the value of the window
from the moment it closes until the next one does. Events before time 0 belong to no extent.
Update pattern: weakest (every row lives a)."""

from __future__ import annotations

from pyspark.sql import functions as F

from ..events import T, floor_div
from ..jobspec import Job, check_query


def results(job: Job, inputs: dict, lo: int | None = None, hi: int | None = None):
    """Rows of the extents whose rows start in (lo, hi] (all extents if lo/hi are None)."""
    q = job.query
    w = q.windows[0]
    df = inputs.get(w.source)
    if df is None:
        return None
    check_query(q)  # jobs built in code skip load_job
    a, r = w.slide, w.range
    if q.filter:
        df = df.filter(F.expr(q.filter))
    if w.filter:
        df = df.filter(F.expr(w.filter))
    k_lo = floor_div(T, a)
    k_hi = f"({floor_div(f'{T} + {r}', a)} - 1)"
    if lo is not None:
        # only extents whose row starts in (lo, hi]: (k+1)a - 1 > lo  and  (k+1)a - 1 <= hi
        k_lo = f"greatest({k_lo}, {floor_div(f'{lo} + 1', a)})"
        k_hi = f"least({k_hi}, {floor_div(f'{hi} + 1', a)} - 1)"
    df = df.filter(F.col(T) >= 0).withColumn("__klo", F.expr(k_lo)).withColumn("__khi", F.expr(k_hi))
    df = df.filter(F.col("__khi") >= F.col("__klo")).withColumn("__k", F.explode(F.sequence("__klo", "__khi")))
    aggs = [F.expr(f"{e} AS `{n}`") for n, e in q.aggregates.items()]
    out = df.groupBy("__k", *[F.col(f"`{g}`") for g in q.group_by]).agg(*aggs)
    return out.selectExpr(*[f"`{g}`" for g in q.group_by], *[f"`{n}`" for n in q.aggregates],
                          f"(__k + 1) * {a} - 1 AS ts", f"(__k + 2) * {a} - 1 AS exp")
