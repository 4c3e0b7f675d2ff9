"""The TOML job file: sources, one windowed query, and the archive it feeds.

docs/jobs.md is the reference: every section and field with its type, default and meaning, and
one complete example per query kind. In short::

    [job]
    time_unit = "s"                  # one chronon; event times are converted to it
    origin = "2026-01-01T00:00:00Z"  # chronon 0 (timestamp event-time columns only)
    late_policy = "drop"             # or "fail"
    grace = 60                       # a tick waits this long for files still landing (default: Delta)

    [[source]]
    name = "temperature"
    path = "landing/temperature"     # a directory of landed files, relative to this file
    format = "parquet"               # parquet | csv | json
    time_column = "event_time"       # a timestamp (any unit, with or without a zone), or a number
                                     # of chronons since the origin
    # epoch_unit = "ms"              # ... or an integer count of s | ms | us | ns since 1970 (UTC)
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

Parsing checks every field and raises ``JobError`` naming the field and the problem; a key that
is not a field of its section (a typo such as ``slid`` for ``slide``) is an error that names the
closest valid key. What can only be checked against the sources' columns (select expressions,
the key among the output columns) is checked by ``ebb explain`` and by every tick.
"""

from __future__ import annotations

import datetime as dt
import difflib
import os
import re
import tomllib
from dataclasses import dataclass, field
from typing import Any

from ..storage.config import TIME_UNITS_US
from ..storage.errors import UsageError
from ..storage.timemodel import MAX_TIME

# units of an integer epoch time column (``Source.epoch_unit``), in nanoseconds
EPOCH_UNITS_NS = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}
KINDS = ("window", "join", "lifetime", "aggregate", "distinct")
AGG_FUNCS = ("count", "sum", "avg", "min", "max")
DEFAULT_MAX_CATCHUP = 1000  # ticks `ebb run` runs at most without being told more

# The fields of each section (docs/jobs.md). Anything else is a typo or a misplaced field.
TOP_FIELDS = ("job", "source", "query", "archive")
JOB_FIELDS = ("time_unit", "origin", "late_policy", "max_catchup", "grace")
SOURCE_FIELDS = ("name", "path", "format", "time_column", "epoch_unit", "key", "lifetime", "lifetime_column",
                 "options")
# a window's fields; rows, partition_by, landmark and unbounded exist to name unarchivable windows
WINDOW_FIELDS = ("source", "range", "slide", "rows", "partition_by", "landmark", "unbounded", "lifetime",
                 "lifetime_column", "filter")
QUERY_FIELDS = {
    "window": ("kind", "key", "select", "max_lifetime") + WINDOW_FIELDS,
    "distinct": ("kind", "key", "select", "max_lifetime") + WINDOW_FIELDS,
    "aggregate": ("kind", "key", "group_by", "aggregates")
                 + tuple(f for f in WINDOW_FIELDS if f not in ("lifetime", "lifetime_column")),
    "join": ("kind", "key", "left", "right", "on", "condition", "select", "max_lifetime"),
    "lifetime": ("kind", "key", "sources", "source", "select", "filter", "max_lifetime"),
}
ARCHIVE_FIELDS = ("path", "layout", "partitioning", "split", "G", "E", "n", "mode", "interval", "start",
                  "max_lifetime", "block_bytes", "data_dir", "retain", "update_log", "section_slots")


class JobError(UsageError):
    """The job file is invalid or asks for a result ebb cannot archive (exit code 2)."""


def check_fields(d: dict, allowed: tuple[str, ...], where: str) -> None:
    """Rejects keys of ``d`` that are not in ``allowed``, naming the closest valid one."""
    for k in d:
        if k not in allowed:
            close = difflib.get_close_matches(k, allowed, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}?" if close else f"valid keys: {', '.join(allowed)}"
            raise JobError(f"unknown key {k!r} in {where}; {hint}")


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
    epoch_unit: str | None = None  # an integer time column counts these since 1970 UTC, not chronons


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
    block_bytes: int | None = None
    data_dir: str | None = None  # where run files go (default path/data): e.g. a shared file system
    retain: int = 0  # chronons of history kept for reads as of an earlier instant (storage's retain)
    update_log: int | None = None  # update records kept for `ebb stats` (None: storage's default)
    section_slots: int = 1  # NoRebuild: expiration slots per section of a run


@dataclass(frozen=True)
class Job:
    path: str  # the job file
    time_unit: str
    origin_us: int
    late_policy: str
    sources: dict[str, Source]
    query: Query
    archive: ArchiveSpec
    max_catchup: int = DEFAULT_MAX_CATCHUP  # most ticks one `ebb run` runs unless told more
    grace: int | None = None  # chronons tick T waits after T for files still landing (None: one Delta)


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


def _positive(v: int | None, where: str, what: str = "chronons") -> int | None:
    if v is not None and v <= 0:
        raise JobError(f"{where}: must be a positive number of {what}, got {v}")
    return _in_time_range(v, where)


def _non_negative(v: int | None, where: str, what: str = "chronons") -> int | None:
    if v is not None and v < 0:
        raise JobError(f"{where}: must be a number of {what} from 0 up, got {v}")
    return _in_time_range(v, where)


def _in_time_range(v: int | None, where: str) -> int | None:
    """``v``, if within ebb's time range (+-MAX_TIME chronons, storage/timemodel.py), where every
    difference of two times fits in 64 bits; any count checked here is far below it too."""
    if v is not None and not -MAX_TIME <= v <= MAX_TIME:
        raise JobError(f"{where}: {v} is outside ebb's time range (+-{MAX_TIME} chronons)")
    return v


def _grace(j: dict, unit: str) -> int | None:
    grace = _non_negative(_get(j, "grace", int, "job", None), "job.grace")
    if grace is not None and unit == "chronon":  # ticks then follow --ticks/--until, never a clock
        raise JobError("job.grace: time_unit is 'chronon', so there is no wall clock for a tick to wait on; remove grace")
    return grace


def _window(d: dict, where: str, default_source: str | None) -> Window:
    if where != "query":  # the query's own fields were checked against its kind
        check_fields(d, WINDOW_FIELDS, where)
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


_AGG = re.compile(r"^\s*(\w+)\s*\(\s*(\*|[^()]+?)\s*\)\s*$")


def check_aggregates(aggs: dict[str, str]) -> None:
    if not aggs:
        raise JobError("query.aggregates: give at least one, e.g. {n = \"count(*)\", mean = \"avg(value)\"}")
    for name, expr in aggs.items():
        m = _AGG.match(expr)
        if not m or m.group(1).lower() not in AGG_FUNCS:
            close = difflib.get_close_matches(m.group(1).lower(), AGG_FUNCS, n=1) if m else []
            hint = f"; did you mean {close[0]}({m.group(2)})?" if close else ""
            raise JobError(f"query.aggregates.{name}: {expr!r} is not one of "
                           f"{', '.join(f + '(column)' for f in AGG_FUNCS)}{hint}")
        if m.group(2) == "*" and m.group(1).lower() != "count":
            raise JobError(f"query.aggregates.{name}: only count takes *")


def check_query(q: Query) -> None:
    """The checks that need no data: aggregate functions, the key among group_by, distinct's
    projection. Output columns are checked against the sources' schemas (``tick.check``)."""
    if q.kind == "aggregate":
        check_aggregates(q.aggregates)
        if q.key not in q.group_by:
            raise JobError(f"query.key {q.key!r} must be one of query.group_by ({', '.join(q.group_by) or 'empty'}): "
                           "each result row needs the archive's key")
    if q.kind == "distinct" and not q.select:
        raise JobError("query.select: a distinct query needs the projection whose values are made distinct")


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
    except IsADirectoryError:
        raise JobError(f"job file {path} is a directory; give the job's .toml file") from None
    except OSError as e:
        raise JobError(f"cannot read job file {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise JobError(f"{path} is not a TOML file: it is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as e:
        raise JobError(f"{path} is not valid TOML: {e}") from None
    base = os.path.dirname(os.path.abspath(path))
    check_fields(raw, TOP_FIELDS, "the job file (sections: [job], [[source]], [query], [archive])")
    for section in ("job", "query", "archive"):
        if section in raw and not isinstance(raw[section], dict):
            raise JobError(f"{section} must be a table: write [{section}]")
    if "source" in raw and not (isinstance(raw["source"], list) and all(isinstance(s, dict) for s in raw["source"])):
        raise JobError("source must be an array of tables: write [[source]] before each source")
    j = raw.get("job", {})
    check_fields(j, JOB_FIELDS, "[job]")
    unit = _get(j, "time_unit", str, "job", "s", choices=list(TIME_UNITS_US) + ["chronon"])
    sources: dict[str, Source] = {}
    for i, s in enumerate(raw.get("source", [])):
        where = f"source[{i}]"
        check_fields(s, SOURCE_FIELDS, f"[[source]] number {i + 1}" + (f" ({s['name']!r})" if isinstance(s.get("name"), str) else ""))
        name = _get(s, "name", str, where)
        if name in sources:
            raise JobError(f"{where}.name: {name!r} is used twice")
        sources[name] = Source(
            name=name,
            path=os.path.join(base, _get(s, "path", str, where)),
            format=_get(s, "format", str, where, "parquet", choices=("parquet", "csv", "json")),
            time_column=_get(s, "time_column", str, where),
            epoch_unit=_get(s, "epoch_unit", str, where, None, choices=tuple(EPOCH_UNITS_NS)),
            key=_get(s, "key", str, where),
            lifetime=_positive(_get(s, "lifetime", int, where, None), f"{where}.lifetime"),
            lifetime_column=_get(s, "lifetime_column", str, where, None),
            options={k: str(v) for k, v in _get(s, "options", dict, where, {}).items()},
        )
    if not sources:
        raise JobError("the job has no [[source]]")
    for src in sources.values():
        if src.epoch_unit and unit == "chronon":
            raise JobError(f"source {src.name}: epoch_unit needs job.time_unit (us, ms, s, min or h) to convert "
                           "epoch times to chronons")
    q = raw.get("query")
    if q is None:
        raise JobError("the job has no [query]")
    kind = _get(q, "kind", str, "query")
    if kind == "difference":
        raise JobError("query kind 'difference' is strict non-monotonic: whether a result stays valid depends on "
                       "later input of the subtracted stream, so it cannot be archived with a fixed expiration time")
    if kind not in KINDS:
        raise JobError(f"query.kind: {kind!r} is not one of {', '.join(KINDS)}")
    check_fields(q, QUERY_FIELDS[kind], f"[query] (kind {kind!r})")
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
    check_query(query)
    a = raw.get("archive")
    if a is None:
        raise JobError("the job has no [archive]")
    check_fields(a, ARCHIVE_FIELDS, "[archive]")
    archive = ArchiveSpec(
        path=os.path.join(base, _get(a, "path", str, "archive")),
        layout=_get(a, "layout", str, "archive", "auto", choices=("auto", "doubly", "wave")),
        partitioning=_get(a, "partitioning", str, "archive", "round-robin", choices=("round-robin", "chronological", "random")),
        split=_get(a, "split", str, "archive", "insertion", choices=("insertion", "expiration")),
        G=_positive(_get(a, "G", int, "archive", None), "archive.G", "sub-indices"),
        E=_positive(_get(a, "E", int, "archive", None), "archive.E", "sub-indices"),
        n=_positive(_get(a, "n", int, "archive", None), "archive.n", "sub-indices"),
        mode=_get(a, "mode", str, "archive", "rebuild", choices=("rebuild", "norebuild")),
        interval=_positive(_get(a, "interval", int, "archive"), "archive.interval"),
        start=_in_time_range(_get(a, "start", int, "archive"), "archive.start"),
        max_lifetime=_positive(_get(a, "max_lifetime", int, "archive", None), "archive.max_lifetime"),
        block_bytes=_get(a, "block_bytes", int, "archive", None),
        data_dir=(os.path.join(base, a["data_dir"]) if isinstance(a.get("data_dir"), str)
                  else _get(a, "data_dir", str, "archive", None)),
        retain=_non_negative(_get(a, "retain", int, "archive", 0), "archive.retain"),
        update_log=_positive(_get(a, "update_log", int, "archive", None), "archive.update_log", "update records"),
        section_slots=_positive(_get(a, "section_slots", int, "archive", 1), "archive.section_slots", "slots"),
    )
    return Job(path=os.path.abspath(path), time_unit=unit, origin_us=_origin_us(_get(j, "origin", str, "job", None)),
               late_policy=_get(j, "late_policy", str, "job", "drop", choices=("drop", "fail")),
               sources=sources, query=query, archive=archive,
               max_catchup=_positive(_get(j, "max_catchup", int, "job", DEFAULT_MAX_CATCHUP), "job.max_catchup",
                                     "ticks"),
               grace=_grace(j, unit))
