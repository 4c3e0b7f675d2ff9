"""One module per query kind of docs/spec.md ("Windowed results"). Each ``results`` function turns event
DataFrames (with chronon column ``__t``) into result rows ``key, ts, exp, payload...`` whose
validity ``[ts, exp)`` follows Kraemer's time-interval semantics."""

from __future__ import annotations

from . import aggregate, distinct, join, lifetime, window

BUILDERS = {
    "window": window.results,
    "join": join.results,
    "lifetime": lifetime.results,
    "aggregate": aggregate.results,
    "distinct": distinct.results,
}
