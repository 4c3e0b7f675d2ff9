"""Rebuild (REINDEX) maintenance: rewrite a touched sub-index into a new file.

The old file is read in key order, chunk by chunk (``CHUNK_BYTES`` of buckets at a time),
expired records are dropped, the new records of the same key range are merged in, and each
key's records are written as one variable-size bucket sorted by ``exp``. The new file gets the
next generation number and becomes current when the update's transaction commits; the old one
is deleted once no reader can still see it.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import directory, keys as keycodec
from .faults import crash_point
from .files import MappedFile, fsync_dir, rebuild_file, write_all
from .manifest import SubIndexState
from .records import descriptors, key_runs, sort_by_key_exp
from .work import SubIndexResult, SubIndexWork, UpdateContext, exp_range

CHUNK_BYTES = 64 << 20


def _chunks(nbytes: np.ndarray) -> list[tuple[int, int]]:
    """Splits buckets (in key order) into runs of about CHUNK_BYTES."""
    if nbytes.size == 0:
        return [(0, 0)]
    ends = np.cumsum(nbytes)
    cuts = np.searchsorted(ends, np.arange(CHUNK_BYTES, int(ends[-1]), CHUNK_BYTES), side="right")
    edges = np.unique(np.concatenate([[0], cuts, [nbytes.size]])).tolist()
    return list(zip(edges[:-1], edges[1:]))


def maintain(ctx: UpdateContext, work: SubIndexWork, old: SubIndexState) -> SubIndexResult:
    """Rewrites sub-index ``work.i``: old records minus expired ones, plus ``work.rows``."""
    cfg, codec = ctx.config, ctx.codec
    i, db = work.i, ctx.dir_db[work.i]
    res = SubIndexResult(i, SubIndexState())
    entries = directory.load_all(ctx.txn, db)
    src = MappedFile(os.path.join(ctx.data_dir, rebuild_file(i, old.generation))) if old.generation else None
    gen = old.generation + 1
    path = os.path.join(ctx.data_dir, rebuild_file(i, gen))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    ctx.created.append(path)
    out_keys: list[bytes] = []
    out_descs: list[np.ndarray] = []
    offset = 0
    new_rows = work.rows
    new_keys = np.array(keycodec.encode(new_rows.column(cfg.key_column)), dtype=object) if new_rows.num_rows else None
    try:
        chunks = _chunks(entries.descs["nbytes"].astype(np.int64))
        for c, (a, b) in enumerate(chunks):
            lo = 0 if c == 0 or new_keys is None else int(np.searchsorted(new_keys, entries.keys[a], "left"))
            hi = new_rows.num_rows if c == len(chunks) - 1 or new_keys is None else int(np.searchsorted(new_keys, entries.keys[b], "left"))
            parts = []
            if b > a:
                d = entries.descs[a:b]
                res.buckets_read += b - a
                res.bytes_read += int(d["nbytes"].sum())
                old_rows = codec.decode(src.array, d["loc"], d["count"])
                if work.delete_upto is not None:
                    keep = pc.greater(old_rows.column(cfg.exp_column), work.delete_upto)
                    kept = old_rows.filter(keep)
                    res.deleted += old_rows.num_rows - kept.num_rows
                    old_rows = kept
                parts.append(old_rows)
            if hi > lo:
                parts.append(new_rows.slice(lo, hi - lo).cast(codec.physical_schema))
                res.inserted += hi - lo
            if not parts:
                continue
            merged = sort_by_key_exp(pa.concat_tables(parts), cfg.key_column, cfg.exp_column)
            if merged.num_rows == 0:
                continue
            bounds = key_runs(merged, cfg.key_column)
            buf, starts = codec.encode(merged, bounds)
            write_all(fd, buf, offset)
            crash_point("rebuild.chunk_written")
            out_descs.append(descriptors(merged, cfg.exp_column, bounds, buf, starts, offset))
            out_keys.extend(keycodec.encode(merged.column(cfg.key_column).take(pa.array(bounds[:-1]))))
            offset += buf.size
        os.fsync(fd)
    finally:
        os.close(fd)
        if src is not None:
            src.close()
    fsync_dir(ctx.data_dir)
    crash_point("rebuild.file_synced")
    descs = np.concatenate(out_descs) if out_descs else np.zeros(0, directory.DESC)
    directory.replace_all(ctx.txn, db, out_keys, np.arange(len(out_keys), dtype=np.int64), descs)
    res.buckets_written = int(descs.size)
    res.bytes_written = offset
    if old.generation:
        ctx.garbage.append([rebuild_file(i, old.generation), ctx.txn_id])
    lo_exp, hi_exp = exp_range(descs)
    res.state = SubIndexState(
        records=int(descs["count"].sum()), bytes=offset, buckets=int(descs.size),
        min_exp=lo_exp, max_exp=hi_exp, generation=gen,
    )
    return res
