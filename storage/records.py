"""Record-level operations shared by both maintenance modes, all vectorised with Arrow.

Records are ordered by (key, exp) inside a sub-index; a key's run of records is what Rebuild
stores as one bucket and NoRebuild splits into fixed-size buckets.
"""

from __future__ import annotations

import zlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .directory import DESC


def sort_by_key_exp(table: pa.Table, key: str, exp: str) -> pa.Table:
    if table.num_rows <= 1:
        return table
    return table.take(pc.sort_indices(table, [(key, "ascending"), (exp, "ascending")]))


def key_runs(table: pa.Table, key: str) -> np.ndarray:
    """Start index of each run of equal keys, plus the end: [0, s1, s2, ..., num_rows]."""
    n = table.num_rows
    if n == 0:
        return np.zeros(1, dtype=np.int64)
    col = table.column(key)
    if n == 1:
        return np.array([0, 1], dtype=np.int64)
    change = pc.not_equal(col.slice(1), col.slice(0, n - 1))
    starts = np.flatnonzero(np.asarray(change.to_numpy(zero_copy_only=False))) + 1
    return np.concatenate([[0], starts, [n]]).astype(np.int64)


def descriptors(table: pa.Table, exp: str, bounds: np.ndarray, buf: np.ndarray, starts: np.ndarray, base: int) -> np.ndarray:
    """DESC entries of freshly encoded buckets: byte offset ``base + starts[b]``, size, count,
    CRC-32 and the exp range (rows are sorted by exp within each bucket)."""
    nb = bounds.size - 1
    d = np.zeros(nb, dtype=DESC)
    if nb == 0:
        return d
    e = table.column(exp).to_numpy()
    d["loc"] = base + starts[:-1]
    d["nbytes"] = np.diff(starts)
    d["count"] = np.diff(bounds)
    d["min_exp"] = e[bounds[:-1]]
    d["max_exp"] = e[bounds[1:] - 1]
    d["crc"] = crc32_many(buf, starts)
    return d


def crc32_many(buf: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """CRC-32 of each range [starts[b], starts[b+1]) of buf (one C call per bucket)."""
    mv = memoryview(buf)
    s = starts.tolist()
    return np.fromiter((zlib.crc32(mv[a:b]) for a, b in zip(s[:-1], s[1:])), dtype=np.uint32, count=len(s) - 1)


def with_ins_slot(table: pa.Table, k_ins: np.ndarray) -> pa.Table:
    from .schema import INS_SLOT

    return table.append_column(pa.field(INS_SLOT, pa.int32(), nullable=False), pa.array(k_ins.astype(np.int32)))
