"""Builders of Job objects for tests (without TOML files) and brute-force snapshot oracles."""

from __future__ import annotations

from collections import Counter

from ebb.indexer.jobspec import ArchiveSpec, Job, Query, Source


def job(kind: str, windows, *, key="key", select=(), filter=None, on=(), condition=None, group_by=(), aggregates=None,
        sources=("a", "b"), lifetimes=None, path="/nonexistent", max_lifetime=None, interval=1, start=0, late_policy="drop"):
    lifetimes = lifetimes or {}
    srcs = {n: Source(name=n, path=f"{path}/{n}", format="parquet", time_column="t", key="key",
                      lifetime=lifetimes.get(n)) for n in sources}
    q = Query(kind=kind, key=key, windows=tuple(windows), select=tuple(select), filter=filter, on=tuple(on),
              condition=condition, group_by=tuple(group_by), aggregates=dict(aggregates or {}), max_lifetime=max_lifetime)
    return Job(path=f"{path}/job.toml", time_unit="chronon", origin_us=0, late_policy=late_policy, sources=srcs, query=q,
               archive=ArchiveSpec(path=f"{path}/archive", interval=interval, start=start))


def in_window(t: int, now: int, w: int, a: int) -> bool:
    """Kraemer (17.1): is an event at t in the window RANGE w SLIDE a at instant ``now``?"""
    if now < a - 1:
        return False
    m = ((now + 1) // a) * a
    return max(m - w, 0) <= t <= m - 1


def snapshot(rows: list[dict], now: int, cols: list[str]) -> Counter:
    """The multiset of ``cols`` of result rows valid at ``now``."""
    return Counter(tuple(r[c] for c in cols) for r in rows if r["ts"] <= now < r["exp"])
