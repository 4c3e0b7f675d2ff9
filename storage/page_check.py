"""Keyed reads of a block that touch, and check, only the pages holding the asked-for rows.

A probe wants a few rows of a block of a few hundred KiB. Instead of reading and hashing the
whole block, it decodes the block in place (a zero-copy view of the run file's memory map, see
``files.MappedSource``) and checks the page sums (``checksum.page_sum``) of exactly the pages it
is about to use: the IPC metadata first, then the whole key column, then, for the rows whose key
was asked for, the same rows of every column it returns. No byte is used before its page is
checked, so a damaged page is a CorruptionError, never a wrong row.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from .arrow_np import to_np
from .checksum import page_sum
from .disk_format import IPC_PREFIX_BYTES, PAGE_BYTES, page_count
from .errors import CorruptionError


class PageCheck:
    """The page sums of one block, checked on demand (each page once)."""

    def __init__(self, view: pa.Buffer, sums: np.ndarray, where: str, prefetch=None):
        """``prefetch(start, stop)``, if given, asks for block bytes [start, stop) to be read in
        one request before a check touches their pages one by one (a cold cache)."""
        self.view, self.where, self._prefetch = view, where, prefetch
        self._mv = memoryview(view)  # slicing a memoryview is much cheaper than slicing a pa.Buffer
        self._sums = sums.tolist()
        self._checked: set[int] = set()
        if len(self._sums) != page_count(view.size):
            raise CorruptionError(f"{where} has {len(self._sums)} page sums for {view.size} bytes")

    def span(self, start: int, stop: int) -> None:
        """Checks the pages holding block bytes [start, stop)."""
        if start >= stop:
            return
        if start < 0 or stop > self.view.size:
            raise CorruptionError(f"{self.where}: bytes {start}-{stop} lie outside the block")
        mv, sums, checked = self._mv, self._sums, self._checked
        first, last = start // PAGE_BYTES, (stop - 1) // PAGE_BYTES
        if last > first and self._prefetch is not None:
            self._prefetch(start, stop)
        for p in range(first, last + 1):
            if p not in checked:
                if page_sum(mv[p * PAGE_BYTES:(p + 1) * PAGE_BYTES]) != sums[p]:
                    raise CorruptionError(f"{self.where}: page {p} fails its checksum")
                checked.add(p)

    def rows(self, arr: pa.Array, a: int, b: int) -> None:
        """Checks the bytes of rows [a, b) of ``arr``, a column of the block decoded in place."""
        if b > a:
            self._rows(arr.type, arr.buffers(), a, b)

    def rows_of(self, columns: list[pa.Array], a: int, b: int) -> None:
        """``rows`` of each of ``columns`` (in block order), after asking in one request for the
        block bytes from these rows in the first column to these rows in the last: on a cold
        cache one read for the rows, not one per column."""
        if b <= a:
            return
        if self._prefetch is not None and len(columns) > 1:
            first, last = columns[0], columns[-1]
            lo = first.buffers()[1].address + _width(first.type) * a
            hi = last.buffers()[1].address + _width(last.type) * (b + 1)
            if hi > lo:
                self._prefetch(lo - self.view.address, hi - self.view.address)
        for arr in columns:
            self._rows(arr.type, arr.buffers(), a, b)

    def _rows(self, t: pa.DataType, bufs: list, a: int, b: int) -> None:
        # each span is also checked against its buffer's size: the IPC reader does not, and bytes
        # that match their sums may still be malformed (a writer's bug); reading past a buffer
        # would return another column's bytes as values
        base = self.view.address
        if bufs[0] is not None:  # validity bitmap
            at = bufs[0].address - base
            self._within(bufs[0], (b + 7) // 8)
            self.span(at + a // 8, at + (b + 7) // 8)
        values = bufs[1].address - base
        if t.id == _BOOL:
            self._within(bufs[1], (b + 7) // 8)
            self.span(values + a // 8, values + (b + 7) // 8)
        elif t.id in _VARIABLE:
            self._within(bufs[1], 4 * (b + 1))
            self.span(values + 4 * a, values + 4 * (b + 1))
            offsets = np.frombuffer(bufs[1], np.int32, b + 1 - a, 4 * a)
            lo, hi = int(offsets[0]), int(offsets[-1])
            if lo < 0 or hi < lo or b > a + 1 and (offsets[1:] < offsets[:-1]).any():
                raise CorruptionError(f"{self.where}: string offsets {lo}-{hi} are malformed")
            if hi > lo:
                self._within(bufs[2], hi)
                data = bufs[2].address - base
                self.span(data + lo, data + hi)
        else:
            width = t.bit_width // 8
            self._within(bufs[1], width * b)
            self.span(values + width * a, values + width * b)

    def _within(self, buf: pa.Buffer | None, stop: int) -> None:
        """CorruptionError unless ``buf`` holds at least ``stop`` bytes."""
        if buf is None or buf.size < stop:
            raise CorruptionError(f"{self.where}: a column's buffer is shorter than its rows")


_BOOL = pa.bool_().id
_VARIABLE = {pa.string().id, pa.binary().id}


def _width(t: pa.DataType) -> int:
    """Bytes a row takes in a column's values (offsets for variable-width types; 0 for bits)."""
    return 4 if t.id in _VARIABLE else 0 if t.id == _BOOL else t.bit_width // 8


def decode_in_place(view: pa.Buffer, sums: np.ndarray, schema: pa.Schema, where: str,
                    prefetch=None) -> tuple[pa.RecordBatch, PageCheck]:
    """The block in ``view`` decoded zero-copy after checking its metadata pages, and the
    checker for the rest; no column value has been checked yet."""
    check = PageCheck(view, sums, where, prefetch)
    check.span(0, IPC_PREFIX_BYTES)
    meta = int.from_bytes(check._mv[4:IPC_PREFIX_BYTES], "little", signed=True)
    if not 0 < meta <= view.size - IPC_PREFIX_BYTES:
        raise CorruptionError(f"{where}: metadata length {meta} does not fit the block")
    check.span(0, IPC_PREFIX_BYTES + meta)
    try:
        batch = pa.ipc.read_record_batch(view, schema)
    except (pa.ArrowInvalid, pa.ArrowIOError, ValueError) as e:
        raise CorruptionError(f"{where} cannot be decoded ({e})") from None
    return batch, check


def key_rows(batch: pa.RecordBatch, check: PageCheck, key: str, ranges: tuple) -> list[tuple[int, int]]:
    """[a, b) row intervals of the block (sorted by key) whose key lies in one of ``ranges``
    ((lo, hi) pairs, None open), after checking the key column."""
    col = batch.column(key)
    check.rows(col, 0, len(col))
    if pa.types.is_integer(col.type):
        v = to_np(col)
        out = [(0 if lo is None else int(np.searchsorted(v, lo, "left")),
                v.size if hi is None else int(np.searchsorted(v, hi, "right"))) for lo, hi in ranges]
    else:
        out = []
        for lo, hi in ranges:
            idx = np.flatnonzero(in_range(col, lo, hi).to_numpy(zero_copy_only=False))
            out.append((int(idx[0]), int(idx[-1]) + 1) if idx.size else (0, 0))
    return [(a, b) for a, b in out if b > a]


def in_range(col: pa.Array, lo, hi) -> pa.BooleanArray:
    """Mask of the values of ``col`` with lo <= value <= hi (None: open on that side)."""
    import pyarrow.compute as pc  # keyed reads of string keys only

    m = pa.array(np.ones(len(col), bool))
    if lo is not None:
        m = pc.and_(m, pc.greater_equal(col, lo))
    if hi is not None:
        m = pc.and_(m, pc.less_equal(col, hi))
    return m
