"""Validity intervals of input events: time windows with slide, or explicit lifetimes.

An event at t is valid on [t, t+1). A time window RANGE w SLIDE a makes it valid on
``[ceil((t+1)/a)*a - 1, floor((t+w+a)/a)*a - 1)`` (Kraemer, Algorithm 18; SLIDE 1 gives
[t, t+w)); empty intervals are dropped. An explicit lifetime l makes it valid on [t, t+l).
"""

from __future__ import annotations

from ..events import T, ceil_div, floor_div
from ..jobspec import JobError, Window

TS, EXP = "__ts", "__exp"


def with_validity(df, w: Window):
    """``df`` plus ``__ts``/``__exp`` for window or lifetime ``w``; empty intervals removed."""
    from pyspark.sql import functions as F

    if w.filter:
        df = df.filter(F.expr(w.filter))
    if w.lifetime_column:
        if w.lifetime_column not in df.columns:
            raise JobError(f"source {w.source}: lifetime column {w.lifetime_column!r} not found")
        df = df.withColumn(TS, F.col(T)).withColumn(EXP, F.col(T) + F.col(f"`{w.lifetime_column}`").cast("bigint"))
    elif w.lifetime is not None:
        df = df.withColumn(TS, F.col(T)).withColumn(EXP, F.col(T) + F.lit(w.lifetime))
    else:
        a, r = w.slide, w.range
        df = df.withColumn(TS, F.expr(f"{ceil_div(f'{T} + 1', a)} * {a} - 1")).withColumn(
            EXP, F.expr(f"{floor_div(f'{T} + {r + a}', a)} * {a} - 1"))
    return df.filter(F.col(EXP) > F.col(TS))


def payload_columns(df, exclude: set[str]) -> list[str]:
    """Backquoted names of ``df``'s columns except ebb's own and ``exclude``."""
    return [f"`{c}`" for c in df.columns if not c.startswith("__") and c not in exclude]
