"""The TOML job file: sources, one windowed query, and the archive it feeds.

Example (docs/semantics.md explains every field)::

    [job]
    time_unit = "s"                  # one chronon; event times are converted to it
    origin = "2026-01-01T00:00:00Z"  # chronon 0 (timestamp event-time columns only)
    late_policy = "drop"             # or "fail"

    [[source]]
    name = "temperature"
    path = "landing/temperature"     # a directory of landed files, relative to this file
    format = "parquet"               # parquet | csv | json
    time_column = "event_time"       # a timestamp, or a number of chronons since the origin
    key = "sensor"                   # the source's key column
    lifetime = 600                   # kind "lifetime": a constant, or lifetime_column = "..."

    [query]
    kind = "lifetime"                # window | join | lifetime | aggregate | distinct
    sources = ["temperature"]

    [archive]
    path = "archive"
    layout = "auto"                  # auto | doubly | wave
    interval = 60                    # Delta
    start = 0                        # tau

Parsing checks every field and raises ``JobError`` naming the field and the problem.
"""

from __future__ import annotations

import datetime as dt
import os
import tomllib
from dataclasses import dataclass, field
from typing import Any

TIME_UNITS_US = {"us": 1, "ms": 1_000, "s": 1_000_000, "min": 60_000_000, "h": 3_600_000_000}
KINDS = ("window", "join", "lifetime", "aggregate", "distinct")
AGG_FUNCS = ("count", "sum", "avg", "min", "max")


class JobError(ValueError):
    """The job file is invalid or asks for a result ebb cannot archive."""


@dataclass(frozen=True)
class Source:
    name: str
    path: str  # absolute
    format: str
    time_column: str
    key: str
    lifetime: int | None = None
    lifetime_column: str | None = None
    options: dict[str, str] = field(default_factory=dict)  # passed to the Spark reader


@dataclass(frozen=True)
class Window:
    """A window over one source. ``range``/``slide`` for time windows; the other fields only
    exist so that unarchivable windows can be named in the rejection."""

    source: str
    range: int | None = None
    slide: int = 1
    rows: int | None = None  # count-based: rejected
    partition_by: tuple[str, ...] = ()  # partitioned: rejected
    unbounded: bool = False  # unbounded / landmark: rejected
    lifetime: int | None = None  # explicit constant lifetime instead of a window
    lifetime_column: str | None = None
    filter: str | None = None


@dataclass(frozen=True)
class Query:
    kind: str
    key: str  # output column that becomes the archive's search key
    windows: tuple[Window, ...]  # one per input (two for join)
    select: tuple[str, ...] = ()  # Spark SQL expressions
    filter: str | None = None
    on: tuple[str, ...] = ()  # join: equality columns (same name on both sides)
    condition: str | None = None  # join: extra Spark SQL condition over aliases l and r
    group_by: tuple[str, ...] = ()
    aggregates: dict[str, str] = field(default_factory=dict)  # output name -> "func(column)"
    max_lifetime: int | None = None  # declared S (needed for lifetime columns)


@dataclass(frozen=True)
class ArchiveSpec:
    path: str
    layout: str = "auto"
    partitioning: str = "round-robin"
    split: str = "insertion"
    G: int | None = None
    E: int | None = None
    n: int | None = None
    mode: str = "rebuild"
    interval: int = 1
    start: int = 0
    max_lifetime: int | None = None
    bucket_capacity: int | None = None


@dataclass(frozen=True)
class Job:
    path: str  # the job file
    time_unit: str
    origin_us: int
    late_policy: str
    sources: dict[str, Source]
    query: Query
    archive: ArchiveSpec


def _get(d: dict, key: str, typ, where: str, default: Any = ..., choices=None):
    if key not in d:
        if default is ...:
            raise JobError(f"{where}: missing {key!r}")
        return default
    v = d[key]
    if typ is int and isinstance(v, bool) or not isinstance(v, typ):
        raise JobError(f"{where}.{key}: expected {typ.__name__ if isinstance(typ, type) else typ}, got {v!r}")
    if choices is not None and v not in choices:
        raise JobError(f"{where}.{key}: {v!r} is not one of {', '.join(map(str, choices))}")
    return v


def _positive(v: int | None, where: str) -> int | None:
    if v is not None and v <= 0:
        raise JobError(f"{where}: must be a positive number of chronons, got {v}")
    return v


def _window(d: dict, where: str, default_source: str | None) -> Window:
    rng = d.get("range")
    unbounded = rng in ("unbounded", "landmark") or bool(d.get("landmark", False)) or bool(d.get("unbounded", False))
    if rng is not None and not unbounded and (not isinstance(rng, int) or isinstance(rng, bool)):
        raise JobError(f"{where}.range: expected a number of chronons or \"unbounded\", got {rng!r}")
    part = d.get("partition_by", [])
    if isinstance(part, str):
        part = [part]
    return Window(
        source=_get(d, "source", str, where, default_source),
        range=None if unbounded else _positive(rng, f"{where}.range"),
        slide=_positive(_get(d, "slide", int, where, 1), f"{where}.slide"),
        rows=_get(d, "rows", int, where, None),
        partition_by=tuple(part),
        unbounded=unbounded,
        lifetime=_positive(_get(d, "lifetime", int, where, None), f"{where}.lifetime"),
        lifetime_column=_get(d, "lifetime_column", str, where, None),
        filter=_get(d, "filter", str, where, None),
    )


def _origin_us(text: str | None) -> int:
    if text is None:
        return 0
    try:
        t = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise JobError(f"job.origin: {text!r} is not an ISO 8601 timestamp") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.timezone.utc)
    return int(t.timestamp() * 1_000_000)


def load_job(path: str) -> Job:
    """Parses and checks a job file. Relative paths are taken relative to the file."""
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except FileNotFoundError:
        raise JobError(f"job file {path} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise JobError(f"{path} is not valid TOML: {e}") from None
    base = os.path.dirname(os.path.abspath(path))
    j = raw.get("job", {})
    unit = _get(j, "time_unit", str, "job", "s", choices=list(TIME_UNITS_US) + ["chronon"])
    sources: dict[str, Source] = {}
    for i, s in enumerate(raw.get("source", [])):
        where = f"source[{i}]"
        name = _get(s, "name", str, where)
        if name in sources:
            raise JobError(f"{where}.name: {name!r} is used twice")
        sources[name] = Source(
            name=name,
            path=os.path.join(base, _get(s, "path", str, where)),
            format=_get(s, "format", str, where, "parquet", choices=("parquet", "csv", "json")),
            time_column=_get(s, "time_column", str, where),
            key=_get(s, "key", str, where),
            lifetime=_positive(_get(s, "lifetime", int, where, None), f"{where}.lifetime"),
            lifetime_column=_get(s, "lifetime_column", str, where, None),
            options={k: str(v) for k, v in _get(s, "options", dict, where, {}).items()},
        )
    if not sources:
        raise JobError("the job has no [[source]]")
    q = raw.get("query")
    if q is None:
        raise JobError("the job has no [query]")
    kind = _get(q, "kind", str, "query")
    if kind == "difference":
        raise JobError("query kind 'difference' is strict non-monotonic: whether a result stays valid depends on "
                       "later input of the subtracted stream, so it cannot be archived with a fixed expiration time")
    if kind not in KINDS:
        raise JobError(f"query.kind: {kind!r} is not one of {', '.join(KINDS)}")
    if kind == "join":
        windows = (_window(_get(q, "left", dict, "query"), "query.left", None),
                   _window(_get(q, "right", dict, "query"), "query.right", None))
    elif kind == "lifetime":
        names = _get(q, "sources", list, "query", [q["source"]] if "source" in q else None)
        if not names:
            raise JobError("query.sources: a lifetime query needs at least one source")
        windows = tuple(Window(source=n, lifetime=sources[n].lifetime if n in sources else None,
                               lifetime_column=sources[n].lifetime_column if n in sources else None) for n in names)
    else:
        windows = (_window(q, "query", _get(q, "source", str, "query", None)),)
    for w in windows:
        if w.source is None or w.source not in sources:
            raise JobError(f"query: unknown source {w.source!r} (sources: {', '.join(sources)})")
    aggs = {k: str(v) for k, v in _get(q, "aggregates", dict, "query", {}).items()}
    query = Query(
        kind=kind,
        key=_get(q, "key", str, "query", sources[windows[0].source].key),
        windows=windows,
        select=tuple(_get(q, "select", list, "query", [])),
        filter=_get(q, "filter", str, "query", None),
        on=tuple([q["on"]] if isinstance(q.get("on"), str) else q.get("on", [])),
        condition=_get(q, "condition", str, "query", None),
        group_by=tuple(_get(q, "group_by", list, "query", [])),
        aggregates=aggs,
        max_lifetime=_positive(_get(q, "max_lifetime", int, "query", None), "query.max_lifetime"),
    )
    a = raw.get("archive")
    if a is None:
        raise JobError("the job has no [archive]")
    archive = ArchiveSpec(
        path=os.path.join(base, _get(a, "path", str, "archive")),
        layout=_get(a, "layout", str, "archive", "auto", choices=("auto", "doubly", "wave")),
        partitioning=_get(a, "partitioning", str, "archive", "round-robin", choices=("round-robin", "chronological", "random")),
        split=_get(a, "split", str, "archive", "insertion", choices=("insertion", "expiration")),
        G=_get(a, "G", int, "archive", None), E=_get(a, "E", int, "archive", None), n=_get(a, "n", int, "archive", None),
        mode=_get(a, "mode", str, "archive", "rebuild", choices=("rebuild", "norebuild")),
        interval=_positive(_get(a, "interval", int, "archive"), "archive.interval"),
        start=_get(a, "start", int, "archive"),
        max_lifetime=_positive(_get(a, "max_lifetime", int, "archive", None), "archive.max_lifetime"),
        bucket_capacity=_get(a, "bucket_capacity", int, "archive", None),
    )
    return Job(path=os.path.abspath(path), time_unit=unit, origin_us=_origin_us(j.get("origin")),
               late_policy=_get(j, "late_policy", str, "job", "drop", choices=("drop", "fail")),
               sources=sources, query=query, archive=archive)
