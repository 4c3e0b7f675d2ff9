"""The statistics the layout advisor needs, derived from a job and a sample of its landed data,
or from an existing archive (and the helpers ``bench`` derives a benchmark workload's with).

A ``WorkloadProfile`` (``cost_model``) describes the *results* an archive receives:
records per update and their variation, the fraction expiring in each slot ahead, the number of
keys, the stored size of a record. From a job, the sample is of landed *events*, so the query's
results are worked out from the events here, without Spark, kind by kind (docs/semantics.md):

- ``window`` and ``lifetime``: one result per event, valid on its window interval (Kraemer's
  slide rule, as ``indexer/queries/validity.py``) or for its lifetime;
- ``aggregate``: one row per (extent, group) with events, living one slide;
- ``distinct``: one piece per event not already covered by an earlier one of its value;
- ``join``: the pairs of events with equal keys whose intervals overlap, valid on the
  intersection (counted over a sample of left events when there are many).

Filters and join conditions are Spark SQL, which is not evaluated here: every event is taken to
pass (the rate is an upper bound) and the profile's notes say so. Select expressions that are
not plain column names are counted as 8 bytes.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ...storage.block_format import row_sizes
from ...storage.disk_format import INS_SLOT_BYTES
from ...storage.errors import UsageError
from ...storage.tuning import DEFAULT_BLOCK_BYTES
from ..jobspec import TIME_UNITS_US, Job, Query, Source, Window
from ..landing import list_files
from ..patterns import classify
from .cost_model import WorkloadProfile

SAMPLE_BYTES = 256 << 20  # the most landed bytes read per source (the newest files)
JOIN_LEFT_SAMPLE = 20_000  # left events whose join partners are enumerated
MAX_RESULTS = 20_000_000  # aggregate rows enumerated at most (a sample of groups' ranges beyond)
_PLAIN = re.compile(r"^`?([A-Za-z_][A-Za-z0-9_]*)`?(?:\s+(?:AS\s+)?`?([A-Za-z_][A-Za-z0-9_]*)`?)?$", re.IGNORECASE)


@dataclass(frozen=True)
class Events:
    """A source's sampled events: their times in chronons and their columns."""

    t: np.ndarray
    table: pa.Table


@dataclass(frozen=True)
class Results:
    """The results a query makes of the sampled events (times, keys) and the size of one."""

    ts: np.ndarray
    exp: np.ndarray
    keys: int  # distinct keys among them
    row_bytes: float  # bytes of one result row as a read returns it
    types: tuple[pa.DataType, ...]  # its columns' types (for the block overhead)
    weight: float = 1.0  # results each one here stands for (when they were counted over a sample)


def uniform_lifetime_offsets(delta: int, p: int) -> np.ndarray:
    """h[a], a = 0..p, for integer lifetimes uniform in [1, p*Delta] and ts uniform in its slot
    (the benchmark workloads, tools/workloads.py): exp - T_j = L - u with u uniform in
    [0, Delta), so a = ceil((L - u) / Delta)."""
    s = p * delta
    u = np.arange(delta, dtype=np.int64)[:, None]
    a = np.arange(p + 1, dtype=np.int64)[None, :]
    lo = np.maximum(1, (a - 1) * delta + u + 1)
    hi = np.minimum(s, a * delta + u)
    return np.clip(hi - lo + 1, 0, None).sum(axis=0) / (delta * s)


def _one_row(t: pa.DataType) -> pa.Array:
    if pa.types.is_binary(t) or pa.types.is_string(t) or pa.types.is_large_binary(t) or pa.types.is_large_string(t):
        return pa.array([""]).cast(t)
    try:
        return pa.array([0]).cast(t)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return pa.nulls(1, t)


def block_overhead(types: tuple[pa.DataType, ...]) -> float:
    """Bytes an encoded block adds to its rows: one Arrow IPC record-batch message of these
    column types (plus the insertion slot), less the bytes of its one row."""
    cols = [_one_row(t) for t in types] + [pa.array([0], pa.int64())]
    batch = pa.record_batch(cols, names=[f"c{i}" for i in range(len(cols))])
    return float(batch.serialize().size - row_sizes(pa.Table.from_batches([batch]))[0])


def profile(results: Results, *, tau: int, delta: int, p: int, block_bytes: int | None, source: str,
            notes: list[str]) -> WorkloadProfile:
    """The profile of ``results`` for an archive with this time model: the records of update j
    are those with ts in slot j; each expires slot(exp) - j slots later."""
    if results.ts.size == 0:
        raise UsageError(f"{source}: the sample yields no results, so there is nothing to measure a rate from")
    slot_ts = -((tau - results.ts) // delta)
    offset = np.clip(-((tau - results.exp) // delta) - slot_ts, 0, p)
    h = np.bincount(offset, minlength=p + 1)[:p + 1].astype(float)
    counts = np.bincount(slot_ts - slot_ts.min()).astype(float) * results.weight
    inner = counts[1:-1] if counts.size > 2 else counts  # the first and last slot are cut by the sample's ends
    if inner.size < 2:
        notes.append("the sample covers fewer than three updates: the rate's variation is taken as 0")
    return WorkloadProfile(
        delta=delta, p=p, rate=float(inner.mean()), rate_cv=float(inner.std() / inner.mean()) if inner.size >= 2 else 0.0,
        exp_offsets=tuple((h / h.sum()).tolist()), keys=max(results.keys, 1), record_bytes=results.row_bytes + INS_SLOT_BYTES,
        visible_bytes=results.row_bytes, block_overhead_bytes=block_overhead(results.types),
        block_bytes=block_bytes or DEFAULT_BLOCK_BYTES, source=source, notes=tuple(notes))


# -- from a job and its landed files -----------------------------------------------------------
def job_profile(job: Job, samples: dict[str, list[str]] | None = None) -> WorkloadProfile:
    """The profile of ``job``'s results, worked out from a sample of each source's landed files
    (``samples``: source name -> files or directories; default: the source's landing directory)."""
    cls = classify(job)
    a = job.archive
    s = a.max_lifetime or cls.max_lifetime
    p = -(-s // a.interval)
    notes: list[str] = []
    events = {}
    for w in job.query.windows:
        if w.source in events:
            continue
        src = job.sources[w.source]
        paths = (samples or {}).get(w.source) or [src.path]
        events[w.source] = read_events(src, job, paths)
    q = job.query
    if q.filter or any(w.filter for w in q.windows) or q.condition:
        notes.append("filters and join conditions are not evaluated: every event is taken to pass, so the rate "
                     "is an upper bound")
    res = query_results(q, job.sources, events, notes)
    where = ", ".join(f"{n}: {ev.t.size} events" for n, ev in events.items())
    return profile(res, tau=a.start, delta=a.interval, p=p, block_bytes=a.block_bytes,
                   source=f"job {job.path} ({q.kind}; sample of {where})", notes=notes)


def _files(paths: list[str]) -> list[str]:
    out = []
    for path in paths:
        if os.path.isdir(path):
            out += [os.path.join(path, rel) for rel in list_files(path)]
        elif os.path.isfile(path):
            out.append(path)
        else:
            raise UsageError(f"sample {path} does not exist")
    return out


def read_events(src: Source, job: Job, paths: list[str]) -> Events:
    """The newest landed files of ``src`` under ``paths``, up to SAMPLE_BYTES, with event times
    in chronons (as ``indexer/events.py`` computes them in Spark)."""
    import pyarrow.csv as pcsv
    import pyarrow.json as pjson
    import pyarrow.parquet as pq

    files = sorted(_files(paths), key=lambda f: os.stat(f).st_mtime_ns, reverse=True)
    if not files:
        raise UsageError(f"source {src.name}: no landed file to sample under {', '.join(paths)}")
    picked, size = [], 0
    for f in files:
        if picked and size + os.path.getsize(f) > SAMPLE_BYTES:
            break
        picked.append(f)
        size += os.path.getsize(f)
    tables = []
    for f in picked:
        try:
            if src.format == "parquet":
                tables.append(pq.read_table(f))
            elif src.format == "csv":
                delim = src.options.get("delimiter", src.options.get("sep", ","))
                tables.append(pcsv.read_csv(f, parse_options=pcsv.ParseOptions(delimiter=delim)))
            else:
                tables.append(pjson.read_json(f))
        except (OSError, pa.ArrowInvalid) as e:
            raise UsageError(f"source {src.name}: cannot read sample file {f} as {src.format}: {e}") from None
    table = pa.concat_tables(tables, promote_options="permissive")
    if src.time_column not in table.column_names:
        raise UsageError(f"source {src.name}: time column {src.time_column!r} not in the sample "
                         f"(columns: {', '.join(table.column_names)})")
    return Events(chronons(table.column(src.time_column), src, job), table)


def chronons(col: pa.ChunkedArray, src: Source, job: Job) -> np.ndarray:
    """Event times in chronons: timestamps and dates through the job's origin and unit, integers
    as they are."""
    t = col.type
    if pa.types.is_timestamp(t) or pa.types.is_date(t):
        if job.time_unit == "chronon":
            raise UsageError(f"source {src.name}: time column {src.time_column!r} is a {t}; set job.time_unit to convert it")
        us = pc.cast(col, pa.timestamp("us", tz=getattr(t, "tz", None))).cast(pa.int64()).to_numpy()
        return (us - job.origin_us) // TIME_UNITS_US[job.time_unit]
    if pa.types.is_integer(t):
        return pc.cast(col, pa.int64()).to_numpy()
    raise UsageError(f"source {src.name}: time column {src.time_column!r} has type {t}; it must be a timestamp, a date "
                     "or an integer number of chronons")


def validity(w: Window, ev: Events) -> tuple[np.ndarray, np.ndarray]:
    """[ts, exp) of each event under window or lifetime ``w`` (indexer/queries/validity.py)."""
    t = ev.t
    if w.lifetime_column:
        if w.lifetime_column not in ev.table.column_names:
            raise UsageError(f"source {w.source}: lifetime column {w.lifetime_column!r} not in the sample")
        return t, t + pc.cast(ev.table.column(w.lifetime_column), pa.int64()).to_numpy(zero_copy_only=False)
    if w.lifetime is not None:
        return t, t + w.lifetime
    a, r = w.slide, w.range
    return -((-(t + 1)) // a) * a - 1, ((t + r + a) // a) * a - 1


def _column_bytes(table: pa.Table, name: str) -> float:
    return float(row_sizes(table.select([name])).mean()) if table.num_rows else 8.0


def _plain(expr: str) -> tuple[str, str] | None:
    """(column, output name) of a select expression that is a column name (``c``, ``c AS x``)."""
    m = _PLAIN.match(expr.strip())
    return (m.group(1), m.group(2) or m.group(1)) if m else None


def _output(select: tuple[str, ...], default: list[str], table: pa.Table, notes: list[str]) -> tuple[float, list]:
    """(bytes, types) of the output columns: ``select`` (or ``default``: column names) plus ts, exp."""
    size, types = 16.0, [pa.int64(), pa.int64()]
    for expr in (select or tuple(default)):
        col = _plain(expr)
        if col and col[0] in table.column_names:
            size += _column_bytes(table, col[0])
            types.append(table.schema.field(col[0]).type)
        else:
            size += 8.0
            types.append(pa.float64())
            notes.append(f"select expression {expr!r} is counted as 8 bytes")
    return size, types


def _codes(table: pa.Table, columns: list[str]) -> np.ndarray:
    """One integer per distinct combination of ``columns`` (0 .. distinct - 1)."""
    code = np.zeros(table.num_rows, dtype=np.int64)
    for c in columns:
        part = table.column(c).combine_chunks().dictionary_encode().indices.to_numpy(zero_copy_only=False)
        code = code * (int(part.max()) + 1 if part.size else 1) + part
    return np.unique(code, return_inverse=True)[1]


def _distinct_keys(*cols: pa.ChunkedArray | pa.Array) -> int:
    arrays = [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in cols]
    if len({a.type for a in arrays}) > 1:
        arrays = [a.cast(pa.string()) for a in arrays]
    return int(pc.count_distinct(pa.concat_arrays(arrays)).as_py()) if arrays else 0


def query_results(q: Query, sources: dict[str, Source], events: dict[str, Events], notes: list[str]) -> Results:
    """The results of query ``q`` over the sampled events (module docstring)."""
    if q.kind == "window":
        w = q.windows[0]
        ev, src = events[w.source], sources[w.source]
        ts, exp = validity(w, ev)
        keep = exp > ts
        size, types = _output(q.select, [c for c in ev.table.column_names if c != src.time_column], ev.table, notes)
        return Results(ts[keep], exp[keep], _distinct_keys(_key(ev.table, q.key).filter(pa.array(keep))), size,
                       tuple(types))
    if q.kind == "lifetime":
        parts = []
        for w in q.windows:
            ev, src = events[w.source], sources[w.source]
            ts, exp = validity(w, ev)
            keep = exp > ts
            skip = {src.time_column, src.key, w.lifetime_column}
            size, types = _output(q.select, [src.key] + [c for c in ev.table.column_names if c not in skip],
                                  ev.table, notes)
            parts.append((ts[keep], exp[keep], _key(ev.table, src.key).filter(pa.array(keep)), size + 4 + len(w.source),
                          types))
        n = sum(x[0].size for x in parts)
        return Results(np.concatenate([x[0] for x in parts]), np.concatenate([x[1] for x in parts]),
                       _distinct_keys(*(x[2] for x in parts)), sum(x[3] * x[0].size for x in parts) / max(n, 1),
                       tuple(parts[0][4]) + (pa.string(),))
    if q.kind == "aggregate":
        return _aggregate(q, events[q.windows[0].source])
    if q.kind == "distinct":
        return _distinct(q, events[q.windows[0].source], notes)
    return _join(q, sources, events, notes)


def _key(table: pa.Table, name: str) -> pa.ChunkedArray:
    if name not in table.column_names:
        raise UsageError(f"key column {name!r} not in the sample (columns: {', '.join(table.column_names)})")
    return table.column(name)


def _expand(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(which range, value) for every integer of the ranges [lo_i, hi_i]."""
    n = hi - lo + 1
    which = np.repeat(np.arange(lo.size), n)
    return which, lo[which] + np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)


def _aggregate(q: Query, ev: Events) -> Results:
    """One row per (extent k, group) with events: an event at t >= 0 is in extents
    floor(t/a) .. floor((t+r)/a) - 1; the row of extent k is valid [(k+1)a - 1, (k+2)a - 1).
    Each group's rows are the union of its events' extent ranges, merged in order."""
    w = q.windows[0]
    a, r = w.slide, w.range
    keep = ev.t >= 0
    t, table = ev.t[keep], ev.table.filter(pa.array(keep))
    if not t.size:
        return Results(np.zeros(0, np.int64), np.zeros(0, np.int64), 0, 16.0, (pa.int64(), pa.int64()))
    group = _codes(table, list(q.group_by))
    lo, hi = t // a, (t + r) // a - 1
    order = np.lexsort([lo, group])
    group, lo, hi = group[order], lo[order], hi[order]
    shift = group * (int(hi.max() - lo.min()) + 2)
    reach = np.maximum.accumulate(hi + shift) - shift  # the furthest extent reached so far in the group
    starts = np.ones(lo.size, dtype=bool)
    starts[1:] = (group[1:] != group[:-1]) | (lo[1:] > reach[:-1] + 1)
    ends = np.append(np.flatnonzero(starts)[1:], lo.size) - 1
    k0, k1 = lo[starts], reach[ends]
    rows = float((k1 - k0 + 1).sum())
    if rows > MAX_RESULTS:  # a sample of the merged ranges stands for all
        pick = np.sort(np.random.default_rng(0).choice(k0.size, max(1, int(k0.size * MAX_RESULTS / rows)), replace=False))
        k0, k1 = k0[pick], k1[pick]
    _, k = _expand(k0, k1)
    ts = (k + 1) * a - 1
    size = 16.0 + sum(_column_bytes(table, g) for g in q.group_by) + 8.0 * len(q.aggregates)
    types = (pa.int64(), pa.int64()) + tuple(table.schema.field(g).type for g in q.group_by) + (pa.float64(),) * len(q.aggregates)
    return Results(ts, ts + a, _distinct_keys(_key(table, q.key)), size, types, rows / max(k.size, 1))


def _distinct(q: Query, ev: Events, notes: list[str]) -> Results:
    """Pieces: per value, ordered by (ts, exp), event i covers [max(ts_i, earlier exps), exp_i)."""
    w = q.windows[0]
    ts, exp = validity(w, ev)
    columns = [c[0] for c in map(_plain, q.select) if c and c[0] in ev.table.column_names]
    value = _codes(ev.table, columns or [q.key])
    order = np.lexsort([exp, ts, value])
    value, ts, exp = value[order], ts[order], exp[order]
    shift = value * (int(exp.max() - exp.min()) + 2)
    covered = np.maximum.accumulate(exp + shift) - shift  # latest exp so far of the value
    prev = ts.copy()
    same = value[1:] == value[:-1]
    prev[1:][same] = covered[:-1][same]
    start = np.maximum(ts, prev)
    keep = exp > start
    size, types = _output(q.select, [], ev.table, notes)
    return Results(start[keep], exp[keep], _distinct_keys(_key(ev.table, q.key).take(pa.array(order[keep]))), size,
                   tuple(types))


def _join(q: Query, sources: dict[str, Source], events: dict[str, Events], notes: list[str]) -> Results:
    """Pairs with equal keys whose intervals overlap, valid [max(ts), min(exp)); enumerated for
    at most JOIN_LEFT_SAMPLE left events, each result then standing for several."""
    lw, rw = q.windows
    lev, rev = events[lw.source], events[rw.source]
    lsrc, rsrc = sources[lw.source], sources[rw.source]
    lk, rk = (q.on[0], q.on[0]) if q.on else (lsrc.key, rsrc.key)
    lts, lexp = validity(lw, lev)
    rts, rexp = validity(rw, rev)
    keys = pa.concat_arrays([c.combine_chunks() for c in (_key(lev.table, lk), _key(rev.table, rk))]
                            if _key(lev.table, lk).type == _key(rev.table, rk).type else
                            [c.combine_chunks().cast(pa.string()) for c in (_key(lev.table, lk), _key(rev.table, rk))])
    code = keys.dictionary_encode().indices.to_numpy(zero_copy_only=False).astype(np.int64)
    lcode, rcode = code[:lts.size], code[lts.size:]
    # right events by (key, ts); a left event's partners are those of its key with r.ts < l.exp
    # (a prefix of its key's stretch) and r.exp > l.ts; times ranked so (key, time) packs in an int64
    times = np.unique(np.concatenate([rts, lexp]))
    width = times.size + 1
    rpack = np.sort(rcode * width + np.searchsorted(times, rts))
    rorder = np.lexsort([rts, rcode])
    rts_s, rexp_s = rts[rorder], rexp[rorder]
    pick = np.arange(lts.size)
    if lts.size > JOIN_LEFT_SAMPLE:
        pick = np.sort(np.random.default_rng(0).choice(lts.size, JOIN_LEFT_SAMPLE, replace=False))
    first = np.searchsorted(rpack, lcode[pick] * width, "left")
    stop = np.searchsorted(rpack, lcode[pick] * width + np.searchsorted(times, lexp[pick]), "left")
    which, ri = _expand(first, stop - 1)
    li = pick[which]
    overlap = rexp_s[ri] > lts[li]
    li, ri = li[overlap], ri[overlap]
    ts, exp = np.maximum(lts[li], rts_s[ri]), np.minimum(lexp[li], rexp_s[ri])
    if q.select:
        size, types = _output(q.select, [], pa.concat_tables([lev.table, rev.table], promote_options="permissive"), notes)
    else:
        lsize, ltypes = _output((), [lk] + [c for c in lev.table.column_names if c not in (lk, lsrc.time_column)],
                                lev.table, notes)
        rsize, rtypes = _output((), [c for c in rev.table.column_names if c not in (rk, rsrc.time_column)], rev.table, notes)
        size, types = lsize + rsize - 16.0, ltypes + rtypes[2:]
    return Results(ts, exp, _distinct_keys(_key(lev.table, lk).take(pa.array(li))), size, tuple(types),
                   lts.size / pick.size)


# -- from an archive ---------------------------------------------------------------------------
ARCHIVE_SAMPLE_BYTES = 64 << 20


def archive_profile(path: str) -> tuple[WorkloadProfile, dict]:
    """The profile of what an archive receives (its update log: records per update and those
    dropped as already expired; a sample of its live records: keys, sizes, expiration offsets),
    and its configuration."""
    from dataclasses import asdict

    from ...query.reader import ArchiveReader
    from ...storage.read_plan import Scan

    with ArchiveReader(path) as r:
        arc = r.archive
        cfg, tm = arc.config, arc.config.time
        log = [u for u in arc.updates() if u["kind"] == "periodic"]
        if not log:
            raise UsageError(f"{path}: no periodic update yet, so there is no rate to measure")
        inputs = np.array([u["input_rows"] for u in log[-100:]], dtype=float)
        dropped = sum(u["dropped_expired"] for u in log[-100:]) / max(inputs.sum(), 1.0)
        with r.snapshot() as snap:
            tasks = snap.plan(Scan())
            stride = max(1, math.ceil(sum(t.bytes for t in tasks) / ARCHIVE_SAMPLE_BYTES))
            batches = [b for t in tasks[::stride] for b in snap.read(t)]
        if not batches:
            raise UsageError(f"{path}: the archive holds no live record to sample")
        table = pa.Table.from_batches(batches)
    notes = [f"a {100 / stride:.0f}% sample of the live records" if stride > 1 else "every live record sampled"]
    ts = table.column(cfg.ts_column).to_numpy()
    exp = table.column(cfg.exp_column).to_numpy()
    p = tm.p
    # a record of offset a stays for a updates, so live records over-represent long offsets by a
    a = np.clip(tm.slots(exp) - tm.slots(ts), 1, p)
    h = np.zeros(p + 1)
    h[1:] = np.bincount(a, minlength=p + 1)[1:] / np.arange(1, p + 1)
    h = (1 - dropped) * h / h.sum()
    h[0] = dropped
    visible = float(row_sizes(table).mean())
    prof = WorkloadProfile(
        delta=tm.delta, p=p, rate=float(inputs.mean()), rate_cv=float(inputs.std() / inputs.mean()) if inputs.size > 1 else 0.0,
        exp_offsets=tuple(h.tolist()), keys=int(pc.count_distinct(table.column(cfg.key_column)).as_py()),
        record_bytes=visible + INS_SLOT_BYTES, visible_bytes=visible,
        block_overhead_bytes=block_overhead(tuple(f.type for f in table.schema)), block_bytes=cfg.block_bytes,
        source=f"archive {path} ({len(log)} periodic updates)", notes=tuple(notes))
    return prof, asdict(cfg)
