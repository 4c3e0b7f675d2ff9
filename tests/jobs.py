"""The tests' jobs: job files (TOML) of the scheduler tests and the events they read, builders of
Job objects (without TOML files), and brute-force snapshot oracles."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa

from ebb.indexer.jobspec import ArchiveSpec, Job, Query, Source
from ebb.indexer.synthetic import land

# -- job files ----------------------------------------------------------------------------------
# Events are rows (user, t, ...) landed in <landing>/<source>; time is in chronons and the archive
# is updated every 5 chronons from 40. A test that needs a variant edits the text (the [job]
# section comes first and [archive] last, so appended lines land in [archive]).

# the join of the last 12 chronons of clicks with the last 8 of views, on user
JOIN = '''kind = "join"
key = "user"
left = {source = "clicks", range = 12}
right = {source = "views", range = 8}'''
AGGREGATE = '''kind = "aggregate"
source = "clicks"
range = 15
slide = 4
group_by = ["user"]
aggregates = {n = "count(*)", total = "sum(amount)", top = "max(amount)"}'''
DISTINCT = '''kind = "distinct"
source = "clicks"
range = 9
slide = 2
select = ["user", "amount"]'''


def job_toml(query: str, sources=("clicks",), *, landing="landing", archive="archive", mode="norebuild",
             archive_extra: str = "") -> str:
    """A job file's text: [query] ``query`` over ``sources`` (landed in ``landing``/<name>), loaded
    into the archive at ``archive`` (relative paths are the job file's directory's) in ``mode``;
    ``archive_extra``: more lines of [archive]."""
    text = '[job]\ntime_unit = "chronon"\n'
    for name in sources:
        text += f'[[source]]\nname = "{name}"\npath = "{landing}/{name}"\ntime_column = "t"\nkey = "user"\n'
    text += f"[query]\n{query}\n"
    text += f'[archive]\npath = "{archive}"\nmode = "{mode}"\ninterval = 5\nstart = 40\n'
    return text + "".join(line + "\n" for line in archive_extra.splitlines())


def join_job(landing="landing", archive="archive", mode="norebuild", *, archive_extra: str = "") -> str:
    """``job_toml`` of the JOIN of clicks and views."""
    return job_toml(JOIN, ("clicks", "views"), landing=landing, archive=archive, mode=mode, archive_extra=archive_extra)


def land_join_inputs(landing, rng, t_end: int, users: int, rate: int) -> None:
    """Clicks and views, (user, t, x) with user < ``users``, for the intervals (hi - 5, hi] up to
    ``t_end``: up to ``rate`` events each, at random."""
    for src in ("clicks", "views"):
        for hi in range(20, t_end + 1, 5):
            n = int(rng.integers(0, rate))
            land(pa.table({"user": rng.integers(0, users, n), "t": rng.integers(hi - 4, hi + 1, n),
                           "x": rng.integers(0, 9, n)}), str(landing / src), f"{src}-{hi}.parquet")


# -- Job objects --------------------------------------------------------------------------------


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
