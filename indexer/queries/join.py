"""Kind ``join``: an equi-join of two windowed sources (aliases ``l`` and ``r``) with an
optional extra condition. Two events join when their keys match and their validity intervals
overlap; the result is valid on the intersection, ``[max(ts1, ts2), min(exp1, exp2))``.
Update pattern: weak (lifetimes vary with the overlap)."""

from __future__ import annotations

from pyspark.sql import functions as F

from ..jobspec import Job, JobError
from .validity import EXP, TS, with_validity


def results(job: Job, inputs: dict, lo: int | None = None, hi: int | None = None):
    q = job.query
    lw, rw = q.windows
    ldf, rdf = inputs.get(lw.source), inputs.get(rw.source)
    if ldf is None or rdf is None:
        return None
    lsrc, rsrc = job.sources[lw.source], job.sources[rw.source]
    l = with_validity(ldf, lw).alias("l")
    r = with_validity(rdf, rw).alias("r")
    pairs = [(c, c) for c in q.on] or [(lsrc.key, rsrc.key)]
    for lc, rc in pairs:
        if lc not in ldf.columns or rc not in rdf.columns:
            raise JobError(f"query.on: column {lc!r} must exist in both sources")
    cond = [F.col(f"l.`{lc}`") == F.col(f"r.`{rc}`") for lc, rc in pairs]
    cond += [F.col(f"l.{TS}") < F.col(f"r.{EXP}"), F.col(f"r.{TS}") < F.col(f"l.{EXP}")]
    if q.condition:
        cond.append(F.expr(q.condition))
    joined = l.join(r, on=cond, how="inner")
    if q.select:
        select = list(q.select)
    else:
        lk = pairs[0][0]
        select = [f"l.`{lk}` AS `{q.key}`"]
        select += [f"l.`{c}` AS `l_{c}`" for c in ldf.columns if not c.startswith("__") and c not in (lk, lsrc.time_column)]
        select += [f"r.`{c}` AS `r_{c}`" for c in rdf.columns if not c.startswith("__") and c not in (pairs[0][1], rsrc.time_column)]
    return joined.selectExpr(*select, f"greatest(l.{TS}, r.{TS}) AS ts", f"least(l.{EXP}, r.{EXP}) AS exp")
