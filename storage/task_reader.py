"""Executes a ReadTask: reads its blocks, checks them, and yields the records it asks for.

I/O follows the access pattern: keyed tasks (probes, key ranges) read exactly their blocks with
read-ahead off; scans read runs of adjacent blocks in large sequential requests. Every block's
checksum is checked before it is decoded, and decoded columns are views of the bytes read, so
the only copies are the reads themselves and the filter of rows that are not asked for.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .block_format import decode_block
from .files import OpenFiles, read_exact
from .read_plan import ReadTask

SPAN_BYTES = 8 << 20  # largest single read of adjacent blocks


def spans(blocks: np.ndarray, limit: int = SPAN_BYTES) -> list[tuple[int, int]]:
    """[start, stop) index ranges of ``blocks`` that are adjacent in the file, each at most
    ``limit`` bytes (or one block)."""
    off = blocks["offset"].astype(np.int64)
    end = off + blocks["length"].astype(np.int64)
    out, a = [], 0
    for b in range(1, blocks.size + 1):
        if b == blocks.size or off[b] != end[b - 1] or end[b] - off[a] > limit:
            out.append((a, b))
            a = b
    return out


def read_blocks(fd: int, blocks: np.ndarray, schema: pa.Schema, what: str) -> Iterator[tuple[np.void, pa.RecordBatch]]:
    """(entry, records) of each of ``blocks`` of an open run file, checked, in file order;
    adjacent blocks are read together, up to SPAN_BYTES at a time."""
    for a, b in spans(blocks):
        start = int(blocks["offset"][a])
        buf = read_exact(fd, start, int(blocks["offset"][b - 1] + blocks["length"][b - 1]) - start, what)
        for e in blocks[a:b]:
            yield e, decode_block(buf.slice(int(e["offset"]) - start, int(e["length"])), schema, e, what)


def execute(task: ReadTask, files: OpenFiles, schema: pa.Schema, key: str, ts: str, exp: str,
            what: str) -> Iterator[pa.RecordBatch]:
    """The records of ``task`` valid at its ``as_of`` (and in its key ranges), as batches of the
    archive schema; ``schema`` is the physical (stored) schema. CorruptionError naming ``what``
    if a block is damaged."""
    fd = files.fd(task.file, sequential=not task.keyed)
    out_schema = pa.schema(list(schema)[:-1])
    ncols = len(out_schema)
    for e, batch in read_blocks(fd, task.blocks, schema, f"{what}, run {task.file}"):
        if task.keyed:
            batch = _keys(batch, key, task.key_ranges)
        if int(e["min_exp"]) <= task.as_of or int(e["max_ts"]) > task.as_of:
            t = task.as_of
            batch = batch.filter(pc.and_(pc.less_equal(batch.column(ts), t), pc.greater(batch.column(exp), t)))
        if batch.num_rows:
            yield pa.RecordBatch.from_arrays(batch.columns[:ncols], schema=out_schema)


def _keys(batch: pa.RecordBatch, key: str, ranges: tuple) -> pa.RecordBatch:
    """The rows of a block (sorted by key) whose key lies in one of ``ranges``."""
    col = batch.column(key)
    if len(ranges) == 1:
        lo, hi = ranges[0]
        if pa.types.is_integer(col.type):
            v = col.to_numpy()
            a = 0 if lo is None else int(np.searchsorted(v, lo, "left"))
            b = v.size if hi is None else int(np.searchsorted(v, hi, "right"))
            return batch.slice(a, max(b - a, 0))
        mask = pa.array(np.ones(len(col), bool))
        if lo is not None:
            mask = pc.and_(mask, pc.greater_equal(col, lo))
        if hi is not None:
            mask = pc.and_(mask, pc.less_equal(col, hi))
        return batch.filter(mask)
    if all(lo == hi and lo is not None for lo, hi in ranges):
        return batch.filter(pc.is_in(col, value_set=pa.array([lo for lo, _ in ranges], col.type)))
    mask = None
    for lo, hi in ranges:
        m = pa.array(np.ones(len(col), bool))
        if lo is not None:
            m = pc.and_(m, pc.greater_equal(col, lo))
        if hi is not None:
            m = pc.and_(m, pc.less_equal(col, hi))
        mask = m if mask is None else pc.or_(mask, m)
    return batch.filter(mask)
