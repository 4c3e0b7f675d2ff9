"""NoRebuild (DEL) maintenance: fixed-size buckets, changed one at a time.

Each key owns one or more fixed-size buckets (slots of ``capacity`` bytes) in the sub-index's
slot file, each sorted by ``exp``. An update reads only the buckets it must change:

- a bucket whose records have all expired is freed without being read;
- a bucket with some expired records is read and its survivors rewritten;
- new records go into the key's last bucket if it has room, then into new buckets.

Changed buckets are written copy-on-write into free slots, so the committed state is never
overwritten; the slots they replace are freed when the update commits.
"""

from __future__ import annotations

import mmap
import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import directory, keys as keycodec, slot_allocator
from .faults import crash_point
from .files import MappedFile, fsync_dir, norebuild_file
from .manifest import SubIndexState, read_free, write_free
from .records import descriptors, key_runs, sort_by_key_exp
from .work import SubIndexResult, SubIndexWork, UpdateContext, exp_range
from .ranges import scatter


def default_capacity(bytes_per_pair: float, max_row: int) -> int:
    """Slot size giving about 2.5 buckets per key per sub-index (thesis section 4.4.1), and
    never smaller than the largest record."""
    return int(max(64, max_row, -(-bytes_per_pair // 2.5)))


def pack(sizes: np.ndarray, runs: np.ndarray, capacity: int) -> np.ndarray:
    """Bucket boundaries for rows grouped into key runs: each bucket holds rows of one key
    and at most ``capacity`` bytes, unless a single row is larger (then it is alone)."""
    if sizes.size == 0:
        return np.zeros(1, dtype=np.int64)
    largest = int(sizes.max())
    step = capacity - largest if capacity > largest else 1
    cum_before = np.cumsum(sizes) - sizes
    run_of_row = np.repeat(np.arange(runs.size - 1), np.diff(runs))
    within = cum_before - cum_before[runs[:-1]][run_of_row]
    chunk = within // step
    new_bucket = np.ones(sizes.size, dtype=bool)
    new_bucket[1:] = (run_of_row[1:] != run_of_row[:-1]) | (chunk[1:] != chunk[:-1])
    return np.append(np.flatnonzero(new_bucket), sizes.size).astype(np.int64)


def maintain(ctx: UpdateContext, work: SubIndexWork, old: SubIndexState) -> SubIndexResult:
    """Applies deletions (exp <= work.delete_upto) and ``work.rows`` to sub-index ``work.i``."""
    cfg, codec, cap = ctx.config, ctx.codec, ctx.capacity
    i, db, T = work.i, ctx.dir_db[work.i], work.delete_upto
    res = SubIndexResult(i, SubIndexState(generation=0, slots=old.slots))
    rows = work.rows
    # rows are sorted by key: their distinct keys are the first of each run, already in order
    distinct_new = keycodec.encode_arrow(rows.column(cfg.key_column).take(pa.array(key_runs(rows, cfg.key_column)[:-1])))
    if T is not None:
        ent = directory.load_all(ctx.txn, db)
    else:
        ent = directory.load_keys(ctx.txn, db, distinct_new.to_pylist())
    ent_keys = pa.array(ent.keys, pa.binary())
    d = ent.descs
    nbk = d.size
    full = (d["max_exp"] <= T) if T is not None else np.zeros(nbk, bool)
    part = ((d["min_exp"] <= T) & ~full) if T is not None else np.zeros(nbk, bool)
    # the last bucket of each key receiving new records is opened if it has room
    key_has_new = pc.is_in(ent_keys, value_set=distinct_new).to_numpy(zero_copy_only=False).astype(bool)
    last_of_key = np.cumsum(ent.per_key_counts()) - 1
    open_ = np.zeros(nbk, bool)
    cand = last_of_key[key_has_new]
    open_[cand] = d["nbytes"][cand] < cap
    open_ &= ~full
    read = part | open_
    changed = full | read

    # read what must change and keep the survivors
    parts = []
    src = MappedFile(os.path.join(ctx.data_dir, norebuild_file(i))) if read.any() else None
    try:
        if src is not None:
            rd = d[read]
            res.buckets_read = int(rd.size)
            res.bytes_read = int(rd["nbytes"].sum())
            got = codec.decode(src.array, rd["loc"], rd["count"])
            if T is not None:
                kept = got.filter(pc.greater(got.column(cfg.exp_column), T))
                res.deleted += got.num_rows - kept.num_rows
                got = kept
            parts.append(got)
    finally:
        if src is not None:
            src.close()
    res.deleted += int(d["count"][full].sum())
    if rows.num_rows:
        parts.append(rows.cast(codec.physical_schema))
        res.inserted = rows.num_rows
    merged = sort_by_key_exp(pa.concat_tables(parts), cfg.key_column, cfg.exp_column) if parts else None

    # write the new buckets copy-on-write
    free = read_free(ctx.txn, ctx.meta, i)
    new_descs = np.zeros(0, directory.DESC)
    new_bucket_keys = pa.array([], pa.binary())
    if merged is not None and merged.num_rows:
        runs = key_runs(merged, cfg.key_column)
        bounds = pack(codec.row_sizes(merged), runs, cap)
        buf, starts = codec.encode(merged, bounds)
        nbytes = np.diff(starts)
        nslots = -(-nbytes // cap)
        alloc = slot_allocator.allocate(nslots, free, old.slots, ctx.reusable_upto)
        free = alloc.free
        path = os.path.join(ctx.data_dir, norebuild_file(i))
        _write_slots(path, buf, starts, alloc.starts * cap, alloc.high_water * cap, created=ctx.created)
        crash_point("norebuild.slots_written")
        res.state.slots = alloc.high_water
        new_descs = descriptors(merged, cfg.exp_column, bounds, buf, starts, 0)
        new_descs["loc"] = alloc.starts * cap
        new_bucket_keys = keycodec.encode_arrow(merged.column(cfg.key_column).take(pa.array(bounds[:-1])))
        res.buckets_written = int(new_descs.size)
        res.bytes_written = int(nbytes.sum())
    # free what was replaced: only after commit can these slots be reused
    gone = d[changed]
    free = slot_allocator.release(free, gone["loc"] // cap, -(-gone["nbytes"].astype(np.int64) // cap), ctx.txn_id)
    res.buckets_freed = int(gone.size)
    write_free(ctx.txn, ctx.meta, i, free)

    # directory: affected keys get their kept buckets plus the new ones
    changed_keys = ent_keys.take(pa.array(np.unique(ent.bucket_key[changed])))
    affected = keycodec.sorted_unique(pa.concat_arrays([changed_keys, new_bucket_keys]))
    old_pos = pc.index_in(ent_keys, value_set=affected).fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    new_pos = pc.index_in(new_bucket_keys, value_set=affected).to_numpy(zero_copy_only=False).astype(np.int64)
    keep_idx = np.flatnonzero(~changed & (old_pos[ent.bucket_key] >= 0)) if nbk else np.zeros(0, np.int64)
    kb = np.concatenate([old_pos[ent.bucket_key[keep_idx]], new_pos])
    kd = np.concatenate([d[keep_idx], new_descs])
    order = np.argsort(kb, kind="stable")
    directory.put_keys(ctx.txn, db, affected.to_pylist(), kb[order], kd[order])

    # sizes after the update
    if T is not None:
        all_after = np.concatenate([d[~changed], new_descs])
        lo_exp, hi_exp = exp_range(all_after)
    else:
        lo_new, hi_new = exp_range(new_descs)
        lo_exp = min(x for x in (old.min_exp, lo_new) if x is not None) if (old.min_exp, lo_new) != (None, None) else None
        hi_exp = max(x for x in (old.max_exp, hi_new) if x is not None) if (old.max_exp, hi_new) != (None, None) else None
    records = old.records - int(d["count"][changed].sum()) + int(new_descs["count"].sum())
    res.state.records = records
    res.state.bytes = old.bytes - int(gone["nbytes"].sum()) + res.bytes_written
    res.state.buckets = old.buckets - int(gone.size) + int(new_descs.size)
    res.state.min_exp, res.state.max_exp = (lo_exp, hi_exp) if records else (None, None)
    return res


def _write_slots(path: str, buf: np.ndarray, starts: np.ndarray, offsets: np.ndarray, size: int, created: list[str]) -> None:
    """Writes bucket b (buf[starts[b]:starts[b+1]]) at byte ``offsets[b]`` of the slot file,
    growing it to ``size``, and makes it durable."""
    existed = os.path.exists(path)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    if not existed:
        created.append(path)
    try:
        if os.fstat(fd).st_size < size:
            os.ftruncate(fd, size)
        with mmap.mmap(fd, size) as mm:
            dst = np.frombuffer(mm, dtype=np.uint8)
            scatter(dst, offsets, buf, np.diff(starts))
            del dst
            mm.flush()
        os.fsync(fd)
    finally:
        os.close(fd)
    if not existed:
        fsync_dir(os.path.dirname(path))
