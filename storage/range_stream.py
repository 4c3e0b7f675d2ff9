"""The order of probe and range results, (key, exp, ts), and a key range read as one stream in it.

Inside each section of a run, records are sorted by (key, exp) (docs/format.md: a Rebuild run is
one section, a NoRebuild run has one per expiration slot), so a range read is a k-way merge of
those sorted streams (``ReadTask.sections``). It is merged chunk by chunk with Arrow and numpy,
never row by row: every stream holds the rows it has read and not yet emitted, at least one
block's worth; the *bound* is the smallest (key, exp) of the last such row among streams with
blocks left to read. No row yet to be read sorts below the bound, so every held row below it,
from every stream, is emitted (sorted by (key, exp, ts)), and the streams whose rows reached the
bound read their next block. Each round reads at least one block, so a read takes at most as
many rounds as it has blocks and sections.

Memory is bounded by the plan's shape, not by the result: one block per stream (its section's
blocks ending in the same (key, exp), in the rare case that one (key, exp) spans blocks), plus
the chunk being sorted and the output gathered up to ``RANGE_OUT_BYTES``.
"""

from __future__ import annotations

from typing import Iterable, Iterator

import numpy as np
import pyarrow as pa

from .arrow_np import from_np, to_np
from .tuning import RANGE_OUT_BYTES


def ordered(batches: list[pa.RecordBatch], schema: pa.Schema, key: str, exp: str, ts: str) -> pa.Table:
    """The rows of ``batches`` as one table ordered by (key, exp, ts) (docs/spec.md: the order of
    probe and range results), in memory of its own: keyed reads view mapped run files in place,
    and a table the caller keeps must not change when an update later reclaims those blocks
    (a punched page reads as zeros). Keyed reads return a few rows, so integer keys are ordered
    with numpy on the batches' columns directly."""
    table = pa.Table.from_batches(batches, schema=schema)
    if table.num_rows < 2:
        return table.take(np.arange(table.num_rows))
    if pa.types.is_integer(schema.field(key).type):
        order = np.lexsort([np.concatenate([to_np(b.column(c)) for b in batches]) for c in (ts, exp, key)])
        return table.take(from_np(order))
    return table.sort_by([(key, "ascending"), (exp, "ascending"), (ts, "ascending")])


def merged(streams: Iterable[Iterator[pa.RecordBatch]], schema: pa.Schema, key: str, exp: str,
           ts: str) -> Iterator[pa.RecordBatch]:
    """The rows of ``streams``, each sorted by (key, exp) and read lazily (a block at a time),
    as batches ordered by (key, exp, ts), in memory of their own (``ordered``)."""
    held = [s for s in (_Stream(b, key, exp) for b in streams) if s.read()]
    out: list[pa.RecordBatch] = []
    size = 0
    while held:
        reading = [s for s in held if s.more is not None]
        bound = min(s.last for s in reading) if reading else None  # None: nothing left to read, emit all
        parts = [s.take_below(bound) for s in held if bound is None or s.first < bound]
        chunk = [b for t in parts for b in t.to_batches() if b.num_rows]
        if chunk:
            sorted_chunk = ordered(chunk, schema, key, exp, ts)
            out += sorted_chunk.to_batches()
            size += sorted_chunk.nbytes
        for s in reading:
            if s.last == bound:  # its held rows all sort at the bound: the next block may hold more of them
                s.read()
        held = [s for s in held if s.rows.num_rows]
        if size >= RANGE_OUT_BYTES or not held:
            yield from out
            out, size = [], 0


class _Stream:
    """One sorted stream: ``rows`` read and not yet emitted (sorted by (key, exp)), the (key, exp)
    of the first and last of them, and ``more``, its batches still to read (None once read to
    the end). Integer keys and exps are also held as numpy, where a round's cut is two binary
    searches: a round touches every stream with rows below its bound."""

    __slots__ = ("more", "rows", "first", "last", "key", "exp", "keys", "exps")

    def __init__(self, batches: Iterator[pa.RecordBatch], key: str, exp: str):
        self.more: Iterator[pa.RecordBatch] | None = batches
        self.rows: pa.Table | None = None
        self.key, self.exp = key, exp

    def read(self) -> bool:
        """Appends the stream's next non-empty batch to ``rows``; False (and ``more`` None) if it
        has none left."""
        for batch in self.more:
            if batch.num_rows:
                table = pa.Table.from_batches([batch])
                self.rows = table if self.rows is None else pa.concat_tables([self.rows, table])
                keys = table.column(self.key)
                self.keys = to_np(self.rows.column(self.key)) if pa.types.is_integer(keys.type) else None
                self.exps = to_np(self.rows.column(self.exp))
                self._ends()
                return True
        self.more = None
        return False

    def take_below(self, bound: tuple | None) -> pa.Table:
        """Removes and returns the held rows whose (key, exp) sorts below ``bound`` (None: all)."""
        n = self.rows.num_rows if bound is None else self._below(bound)
        taken, self.rows = self.rows.slice(0, n), self.rows.slice(n)
        self.exps = self.exps[n:]
        if self.keys is not None:
            self.keys = self.keys[n:]
        if self.rows.num_rows:
            self._ends()
        return taken

    def _below(self, bound: tuple) -> int:
        """How many held rows sort below ``bound``: those of a smaller key, then those of the
        bound's key with a smaller exp (both sorted)."""
        k, e = bound
        if self.keys is not None:
            a, b = int(self.keys.searchsorted(k, "left")), int(self.keys.searchsorted(k, "right"))
        else:
            import pyarrow.compute as pc  # string keys only

            keys = self.rows.column(self.key)
            a = pc.sum(pc.less(keys, k)).as_py() or 0
            b = a + (pc.sum(pc.equal(keys, k)).as_py() or 0)
        return a + int(self.exps[a:b].searchsorted(e, "left"))

    def _ends(self) -> None:
        if self.keys is not None:
            self.first, self.last = (int(self.keys[0]), int(self.exps[0])), (int(self.keys[-1]), int(self.exps[-1]))
        else:
            keys = self.rows.column(self.key)
            self.first, self.last = (keys[0].as_py(), int(self.exps[0])), (keys[-1].as_py(), int(self.exps[-1]))
