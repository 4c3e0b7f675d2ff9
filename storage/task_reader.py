"""Executes a ReadTask: reads its blocks, checks them, and yields the records it asks for.

I/O follows the access pattern: keyed tasks (probes, key ranges) read exactly their blocks with
read-ahead off; scans read runs of adjacent blocks in large sequential requests. Every block's
checksum is checked before it is decoded, and decoded columns are views of the bytes read, so
the only copies are the reads themselves and the filter of rows that are not asked for.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np
import pyarrow as pa

from .arrow_np import to_np
from .block_format import decode_block
from .files import OpenFiles
from .read_plan import ReadTask
from .run_descriptor import BlockEntry

SPAN_BYTES = 8 << 20  # largest single read of adjacent blocks


def spans(entries: Sequence[BlockEntry], limit: int = SPAN_BYTES) -> list[tuple[int, int]]:
    """[start, stop) index ranges of ``entries`` that are adjacent in the file, each at most
    ``limit`` bytes (or one block)."""
    out, a = [], 0
    n = len(entries)
    for b in range(1, n + 1):
        if b == n or entries[b].offset != entries[b - 1].offset + entries[b - 1].length \
                or entries[b].offset + entries[b].length - entries[a].offset > limit:
            out.append((a, b))
            a = b
    return out


def read_blocks(source, entries: Sequence[BlockEntry], schema: pa.Schema, what: str) -> Iterator[tuple[BlockEntry, pa.RecordBatch]]:
    """(entry, records) of each block of a run file (a ``files.OpenFiles`` source), checked,
    in file order. Adjacent blocks are read together, up to SPAN_BYTES at a time."""
    for a, b in spans(entries):
        start, last = entries[a].offset, entries[b - 1]
        buf = source.read(start, last.offset + last.length - start, what)
        for e in entries[a:b]:
            yield e, decode_block(buf.slice(e.offset - start, e.length), schema, e.offset, e.rows, e.checksum, what)


def execute(task: ReadTask, files: OpenFiles, schema: pa.Schema, key: str, ts: str, exp: str,
            what: str) -> Iterator[pa.RecordBatch]:
    """The records of ``task`` valid at its ``as_of`` (and in its key ranges), as batches of the
    archive schema; ``schema`` is the physical (stored) schema. CorruptionError naming ``what``
    if a block is damaged."""
    source = files.source(task.file, sequential=not task.keyed)
    visible = list(range(len(schema) - 1))  # every column but the hidden insertion slot
    t = task.as_of
    for e, batch in read_blocks(source, task.blocks, schema, f"{what}, run {task.file}"):
        if task.keyed:
            batch = _keys(batch, key, task.key_ranges)
        if e.min_exp <= t or e.max_ts > t:  # some records of the block are not valid at t
            import pyarrow.compute as pc  # only when needed: a one-shot probe of valid blocks never is
            batch = batch.filter(pc.and_(pc.less_equal(batch.column(ts), t), pc.greater(batch.column(exp), t)))
        if batch.num_rows:
            yield batch.select(visible)


def _keys(batch: pa.RecordBatch, key: str, ranges: tuple) -> pa.RecordBatch:
    """The rows of a block (sorted by key) whose key lies in one of ``ranges``."""
    col = batch.column(key)
    if len(ranges) == 1 and pa.types.is_integer(col.type):  # a slice: the block is sorted by key
        lo, hi = ranges[0]
        v = to_np(col)
        a = 0 if lo is None else int(np.searchsorted(v, lo, "left"))
        b = v.size if hi is None else int(np.searchsorted(v, hi, "right"))
        return batch.slice(a, max(b - a, 0))
    import pyarrow.compute as pc

    if all(lo == hi and lo is not None for lo, hi in ranges):
        return batch.filter(pc.is_in(col, value_set=pa.array([lo for lo, _ in ranges], col.type)))
    mask = pa.array(np.zeros(len(col), bool))
    for lo, hi in ranges:
        m = pa.array(np.ones(len(col), bool))
        if lo is not None:
            m = pc.and_(m, pc.greater_equal(col, lo))
        if hi is not None:
            m = pc.and_(m, pc.less_equal(col, hi))
        mask = pc.or_(mask, m)
    return batch.filter(mask)
