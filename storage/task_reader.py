"""Executes a ReadTask: reads its blocks, checks them, and yields the records it asks for.

I/O follows the access pattern. Keyed tasks (probes, key ranges) decode their blocks in place in
a memory map with read-ahead off and touch only the pages of the metadata, the key column and the
rows asked for, each checked by its page sum (``page_check``). So that a cold cache serves them in
a few parallel reads rather than a fault per page, each such stretch is asked for in one request
before it is touched, and ``prefetch_heads`` asks for the first stretch of every block of a
read's tasks (one per sub-index) before any is executed. Scans read runs of adjacent blocks
in large sequential requests, and check each block's checksum before decoding it. Decoded columns
are views of the bytes read or mapped, so the only copies are the reads themselves and the filter
of rows that are not valid at ``as_of``.
"""

from __future__ import annotations

from typing import Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa

from .arrow_np import from_np, to_np
from .block_format import decode_block, older_physical
from .disk_format import METADATA_GUESS_BYTES, PAGE_BYTES, BlockEntry, visible_columns
from .errors import CorruptionError
from .files import OpenFiles
from .page_check import decode_in_place, in_range, key_rows
from .point_probe import ColumnLayout, probe_task
from .read_plan import ReadTask
from .schema import widen
from .tuning import SPAN_BYTES


def spans(entries: Sequence[BlockEntry], limit: int = SPAN_BYTES) -> list[tuple[int, int]]:
    """[start, stop) index ranges of ``entries`` that are adjacent in the file (or apart by less
    than a page: the zeros before a block that starts on a page, read and skipped), each at most
    ``limit`` bytes (or one block)."""
    out, a = [], 0
    n = len(entries)
    for b in range(1, n + 1):
        gap = entries[b].offset - (entries[b - 1].offset + entries[b - 1].length) if b < n else -1
        if not 0 <= gap < PAGE_BYTES \
                or entries[b].offset + entries[b].length - entries[a].offset > limit:
            out.append((a, b))
            a = b
    return out


def read_block_bytes(source, entries: Sequence[BlockEntry], what: str) -> Iterator[tuple[BlockEntry, pa.Buffer]]:
    """(entry, bytes) of each block of a run file (a ``files.OpenFiles`` source), in file order,
    not yet checked. Adjacent blocks are read together, up to SPAN_BYTES at a time."""
    for a, b in spans(entries):
        start, last = entries[a].offset, entries[b - 1]
        buf = source.read(start, last.offset + last.length - start, what)
        for e in entries[a:b]:
            yield e, buf.slice(e.offset - start, e.length)


def read_blocks(source, entries: Sequence[BlockEntry], schema: pa.Schema, what: str) -> Iterator[tuple[BlockEntry, pa.RecordBatch]]:
    """(entry, records) of each block of a run file, checked, in file order."""
    for e, data in read_block_bytes(source, entries, what):
        yield e, decode_block(data, schema, e.offset, e.rows, e.checksum, what)


def execute(task: ReadTask, files: OpenFiles, schema: pa.Schema, key: str, ts: str, exp: str,
            what: str) -> Iterator[pa.RecordBatch]:
    """The records of ``task`` valid at its ``as_of`` (and in its key ranges), as batches of the
    archive schema; ``schema`` is the physical (stored) schema of the newest archive schema. A
    run written under an older one is decoded with its own columns and its rows get nulls in
    the others. CorruptionError naming ``what`` if a block is damaged."""
    wanted = None
    if task.columns is not None:  # the run lacks columns added since it was written
        wanted = pa.schema(list(schema)[:visible_columns(len(schema))])
        schema = older_physical(schema, task.columns)
    visible = list(range(visible_columns(len(schema))))  # every column but the hidden ones
    where = f"{what}, run {task.file}"
    if task.batch is not None and wanted is None and ColumnLayout.of(schema, key, ts, exp) is not None:
        yield from probe_task(task, files, schema, key, ts, exp, what).to_batches()
        return
    if task.keyed:
        blocks = _keyed(task, files, schema, key, where)
    else:
        blocks = read_blocks(files.source(task.file, sequential=True), task.blocks, schema, where)
    t = task.as_of
    for e, batch in blocks:
        if e.min_exp <= t or e.max_ts > t:  # some records of the block are not valid at t
            batch = _valid(batch, ts, exp, t, task.keyed)
        if batch.num_rows:
            yield batch.select(visible) if wanted is None else widen(batch.select(visible), wanted)


def _valid(batch: pa.RecordBatch, ts: str, exp: str, t: int, few: bool) -> pa.RecordBatch:
    """The rows of ``batch`` with ts <= t < exp. ``few``: the handful of rows a keyed read
    found, filtered with numpy (Arrow's compute kernels cost tens of microseconds a call);
    scanned blocks go through Arrow's filter."""
    if few:
        ok = (to_np(batch.column(ts)) <= t) & (to_np(batch.column(exp)) > t)
        return batch if ok.all() else batch.take(from_np(np.flatnonzero(ok)))
    import pyarrow.compute as pc  # only when needed: a one-shot probe never is

    return batch.filter(pc.and_(pc.less_equal(batch.column(ts), t), pc.greater(batch.column(exp), t)))


def prefetch_heads(tasks: Sequence[ReadTask], files: OpenFiles, schema: pa.Schema, key: str) -> None:
    """Starts reading, for every block that keyed ``tasks`` search in place, the bytes the
    search touches first (the IPC metadata and, when only fixed-width columns come before it,
    the key column), each in one request. Called for all of a read's tasks before executing
    any, a cold cache reads the blocks of all sub-indices in parallel, not one after another;
    a warm one pays a system call a block."""
    head = _head_bytes(schema, key)
    for task in tasks:
        if not task.keyed or not any(task.page_sums):
            continue
        try:
            source = files.mapped(task.file)
        except (CorruptionError, OSError):
            continue  # only a hint: the task's read reports the problem, in its reader's terms
        for e, sums in zip(task.blocks, task.page_sums):
            if sums:
                source.prefetch(e.offset, min(e.length, head(e.rows)))


def _head_bytes(schema: pa.Schema, key: str) -> Callable[[int], int]:
    """rows -> about how many leading bytes of a block hold its IPC metadata and its key
    column: the columns up to the key, each with a validity bitmap and padding (just the
    metadata if a variable-width column comes first, whose size the rows do not tell)."""
    per_row, columns = 0.0, 0
    for f in schema:
        t = f.type
        if pa.types.is_string(t) or pa.types.is_binary(t):
            return lambda rows: METADATA_GUESS_BYTES
        per_row += 0.125 + (0.125 if pa.types.is_boolean(t) else t.bit_width // 8)
        columns += 1
        if f.name == key:
            break
    return lambda rows: METADATA_GUESS_BYTES + int(per_row * rows) + 16 * columns


def _keyed(task: ReadTask, files: OpenFiles, schema: pa.Schema, key: str, where: str) -> Iterator[tuple[BlockEntry, pa.RecordBatch]]:
    """(entry, rows asked for) of each block of a keyed task, in order. Blocks with page sums
    are decoded in the run file's memory map, checking (and on a cold cache reading) only the
    pages used; the others (wholly asked for), and blocks that turn out to be mostly asked for,
    are read and checked whole."""
    sums = task.page_sums or (b"",) * len(task.blocks)
    whole: list[BlockEntry] = []
    for i, e in enumerate(task.blocks):
        if not sums[i]:
            whole.append(e)
            if i + 1 < len(sums) and not sums[i + 1]:
                continue
            for entry, batch in read_blocks(files.source(task.file, sequential=False), whole, schema, where):
                yield entry, _keys(batch, key, task.key_ranges)
            whole = []
            continue
        block = f"{where}, block at byte {e.offset}"
        source = files.mapped(task.file)
        batch, check = decode_in_place(source.view(e.offset, e.length, block), np.frombuffer(sums[i], "<u4"), schema,
                                       block, lambda a, z, at=e.offset: source.prefetch(at + a, z - a))
        if batch.num_rows != e.rows:
            raise CorruptionError(f"{block} holds {batch.num_rows} rows, its descriptor says {e.rows}")
        rows = key_rows(batch, check, key, task.key_ranges)
        if 4 * sum(b - a for a, b in rows) > e.rows:  # most of the block is asked for: one read, one hash
            data = files.source(task.file, sequential=False).read(e.offset, e.length, block)
            yield e, _keys(decode_block(data, schema, e.offset, e.rows, e.checksum, where), key, task.key_ranges)
            continue
        columns = batch.columns[:visible_columns(batch.num_columns)]  # every column but the hidden ones
        for a, b in rows:
            check.rows_of(columns, a, b)
            yield e, batch.slice(a, b - a)


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
        mask = pc.or_(mask, in_range(col, lo, hi))
    return batch.filter(mask)
