"""Update-pattern classification of a query (Golab and Oezsu 2005; docs/spec.md, "Windowed results").

- monotonic: results never expire (unbounded or landmark windows): rejected, nothing to expire;
- weakest non-monotonic: results expire in insertion order (equal lifetimes): a wave index;
- weak non-monotonic: expiration times known on insertion but not in insertion order (variable
  lifetimes): a doubly partitioned index, round-robin;
- strict non-monotonic: expiration depends on later input (count-based or partitioned windows,
  difference): rejected, an archive needs each result's expiration time when it is loaded.

``classify`` also derives S, the largest lifetime the query can produce, and the lookback: how
far before a tick's interval a tick must read events.
"""

from __future__ import annotations

from dataclasses import dataclass

from .jobspec import Job, JobError, Query, Window


@dataclass(frozen=True)
class Classification:
    pattern: str  # "weakest" | "weak"
    reason: str
    max_lifetime: int  # S
    lookback: int  # chronons before a tick's interval whose events a tick needs
    layout: str  # what "auto" picks: "wave" | "doubly"


def slide_interval(t: int, w: int, a: int) -> tuple[int, int]:
    """Kraemer's Algorithm 18: validity of an event at t in a time window RANGE w SLIDE a."""
    ts = -((-(t + 1)) // a) * a - 1
    te = ((t + w + a) // a) * a - 1
    return ts, te


def window_lifetimes(w: Window) -> set[int]:
    """Every lifetime a window can give a result (exact). In closed form, not by trying each
    instant of a slide period (a slide can be 2^62 chronons): over one period ``slide_interval``
    gives ts = slide - 1 and te = (1 + q + (t + r) // slide) * slide - 1, where q, r = divmod(range,
    slide), so te - ts is q * slide, and also (q + 1) * slide where r > 0."""
    if w.range is None:
        return set()
    q, r = divmod(w.range, w.slide)
    return {life for life in (q * w.slide, (q + 1) * w.slide if r else 0) if life > 0}


def _reject_unarchivable(w: Window, where: str) -> None:
    if w.unbounded:
        raise JobError(f"{where}: an unbounded or landmark window is monotonic: its results never expire, "
                       "so there is nothing for an archive of expiring data to do; store it in a regular table")
    if w.rows is not None:
        kind = "partitioned" if w.partition_by else "count-based"
        raise JobError(f"{where}: a {kind} window (rows = {w.rows}) is strict non-monotonic: when a result expires "
                       "depends on how many later events arrive, so its expiration time is unknown when it is loaded")
    if w.partition_by:
        raise JobError(f"{where}: a partitioned window is strict non-monotonic: expiration depends on later input")


def _validity(w: Window, job: Job, where: str, declared: int | None) -> tuple[set[int], bool]:
    """(possible lifetimes, whether they are known exactly) of one input's validity."""
    _reject_unarchivable(w, where)
    if w.lifetime_column:
        if declared is None:
            raise JobError(f"{where}: lifetimes come from column {w.lifetime_column!r}; declare the largest with "
                           "query.max_lifetime (or archive.max_lifetime)")
        return set(range(1, declared + 1)), False
    if w.lifetime is not None:
        return {w.lifetime}, True
    if w.range is None:
        raise JobError(f"{where}: give a time window (range = N) or a lifetime")
    return window_lifetimes(w), True


def classify(job: Job) -> Classification:
    """The query's update pattern, S, lookback and automatic layout; JobError if unarchivable."""
    q: Query = job.query
    declared = q.max_lifetime or job.archive.max_lifetime
    if q.kind == "lifetime":
        lives: set[int] = set()
        exact = True
        for i, w in enumerate(q.windows):
            l, e = _validity(w, job, f"source {w.source}", declared)
            if not l:
                raise JobError(f"source {w.source}: a lifetime query needs lifetime or lifetime_column on each source")
            lives |= l
            exact &= e
        s = max(lives)
        if len(lives) == 1 and exact:
            return Classification("weakest", f"every result lives exactly {s} chronons (constant lifetime), "
                                  "so results expire in the order they are inserted", s, 0, "wave")
        return Classification("weak", "lifetimes differ between results ("
                              + ("from a column" if not exact else ", ".join(map(str, sorted(lives)))) + "), so results "
                              "do not expire in insertion order, but each expiration time is known on insertion", s, 0, "doubly")
    w = q.windows[0]
    if q.kind == "join":
        l1, _ = _validity(q.windows[0], job, "query.left", declared)
        l2, _ = _validity(q.windows[1], job, "query.right", declared)
        s = min(max(l1), max(l2))
        lookback = max(max(l1), max(l2)) + max(q.windows[0].slide, q.windows[1].slide)
        return Classification("weak", "a join result is valid on the intersection of its inputs' intervals, "
                              "exp = min(exp1, exp2): lifetimes vary with how the inputs overlap", s, lookback, "doubly")
    if q.kind == "aggregate":
        _reject_unarchivable(w, "query")
        if w.range is None:
            raise JobError("query.range: an aggregate needs range = N and slide = a (chronons)")
        return Classification("weakest", f"a WID aggregate row of extent k is valid [(k+1)a-1, (k+2)a-1): every row "
                              f"lives exactly the slide a = {w.slide}, so rows expire in insertion order",
                              w.slide, w.range, "wave")
    lives, exact = _validity(w, job, "query", declared)
    if not lives:
        raise JobError(f"query: RANGE {w.range} SLIDE {w.slide} gives every result an empty interval")
    slide = w.slide if w.range is not None else 0
    if q.kind == "window":
        if w.lifetime_column:
            return Classification("weak", "lifetimes come from a column, so results do not expire in insertion order",
                                  max(lives), 0, "doubly")
        why = (f"each event is valid for the window's {w.range} chronons"
               + (f", rounded to slide boundaries of {w.slide}" if w.slide > 1 else "")
               + ", so results expire in the order they are inserted (FIFO)") if w.range else \
            f"every result lives exactly {w.lifetime} chronons, so results expire in insertion order"
        return Classification("weakest", why, max(lives), slide, "wave")
    # distinct
    return Classification("weak", "a distinct value stays valid while any of its events is in the window; each "
                          "result piece ends when its event leaves the window, so lifetimes vary",
                          max(lives), max(lives) + slide, "doubly")
