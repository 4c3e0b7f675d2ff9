"""Blocks: the unit of data on disk, of checksums and of reads.

A block is one Arrow IPC encapsulated record-batch message (the IPC stream format's message,
without the schema, which the archive's metadata holds) of a few hundred KiB: the records of
the archive schema plus the hidden columns (``disk_format.physical_schema``: the int64
insertion slot), sorted by (key, exp). Decoding is zero-copy: the columns are views of the bytes
read. Each block's XXH3-64 is kept in its run's descriptor and checked before a single value is
decoded.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Iterator

import numpy as np
import pyarrow as pa

from .checksum import block_checksum, page_sums
from .disk_format import INS_SLOT_COLUMN, BlockEntry, physical_schema
from .errors import CorruptionError

INS_SLOT = INS_SLOT_COLUMN  # defined in disk_format (as physical_schema is); others import both from here


@lru_cache(maxsize=64)
def older_physical(physical: pa.Schema, columns: int) -> pa.Schema:
    """The physical schema of blocks written when the archive schema had only its first
    ``columns`` columns (``physical``: the newest physical schema)."""
    return physical_schema(pa.schema(list(physical)[:columns]))


def row_sizes(table: pa.Table) -> np.ndarray:
    """Approximate encoded bytes of each row (fixed widths, plus offsets and bytes of
    string/binary values), used only to cut blocks to size."""
    import pyarrow.compute as pc  # the write path only; reads need not load it

    size = np.zeros(table.num_rows, np.int64)
    for col in table.columns:
        t = col.type
        if pa.types.is_string(t) or pa.types.is_binary(t):
            size += 4 + pc.fill_null(pc.binary_length(col), 0).to_numpy(zero_copy_only=False).astype(np.int64)
        elif pa.types.is_boolean(t):
            size += 1
        else:
            size += t.bit_width // 8
    return size


@dataclass
class EncodedBlock:
    """One block ready to be written, with its descriptor entry (``offset`` 0 until written:
    ``at``), whose fields it also answers for (``block.rows``)."""

    data: pa.Buffer
    entry: BlockEntry
    first_key: object
    last_key: object
    sums: np.ndarray  # uint32 sum of each page of ``page_bytes``

    def at(self, offset: int) -> BlockEntry:
        """Its descriptor entry once written at byte ``offset`` of its run file."""
        return self.entry._replace(offset=offset)

    def __getattr__(self, name: str):
        if name == "entry":  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self.entry, name)


def encode_blocks(table: pa.Table, key: str, ts: str, exp: str, block_bytes: int, page_bytes: int,
                  slots: np.ndarray | None = None) -> Iterator[EncodedBlock]:
    """Cuts ``table`` (physical schema, sorted by (slot, key, exp)) into blocks of about
    ``block_bytes``, with the sums of their pages of ``page_bytes``; a block never spans two
    values of ``slots`` (None: one section, slot -1)."""
    if table.num_rows == 0:
        return
    sizes = row_sizes(table)
    slot_all = np.full(table.num_rows, -1, np.int64) if slots is None else np.asarray(slots, np.int64)
    base = 0
    for batch in table.to_batches():
        m = batch.num_rows
        if m == 0:
            continue
        s, sl = sizes[base:base + m], slot_all[base:base + m]
        cum = np.cumsum(s) - s  # bytes before each row
        sec_start = np.flatnonzero(np.diff(sl, prepend=sl[0] - 1))
        sec_id = np.cumsum(np.diff(sl, prepend=sl[0] - 1) != 0) - 1
        rel = cum - cum[sec_start][sec_id]
        nth = rel // block_bytes  # which block of its section a row falls in
        cut = np.flatnonzero((np.diff(sec_id, prepend=-1) != 0) | (np.diff(nth, prepend=-1) != 0))
        ends = np.append(cut[1:], m)
        ev = batch.column(exp).to_numpy()
        tv = batch.column(ts).to_numpy()
        kcol = batch.column(key)
        firsts = kcol.take(pa.array(cut)).to_pylist()
        lasts = kcol.take(pa.array(ends - 1)).to_pylist()
        mins, maxs = np.minimum.reduceat(ev, cut), np.maximum.reduceat(ev, cut)
        max_ts = np.maximum.reduceat(tv, cut)
        for b, (a, e) in enumerate(zip(cut.tolist(), ends.tolist())):
            data = batch.slice(a, e - a).serialize()
            entry = BlockEntry(offset=0, length=data.size, rows=e - a, min_exp=int(mins[b]), max_exp=int(maxs[b]),
                               max_ts=int(max_ts[b]), slot=int(sl[a]), checksum=block_checksum(data))
            yield EncodedBlock(data, entry, firsts[b], lasts[b], page_sums(data, page_bytes))
        base += m


def decode_block(data: pa.Buffer, schema: pa.Schema, offset: int, rows: int, checksum: int, what: str) -> pa.RecordBatch:
    """The records of the block at ``offset`` (``schema`` is the physical schema), after
    checking its checksum and row count against its descriptor; CorruptionError naming ``what``."""
    if block_checksum(data) != checksum:
        raise CorruptionError(f"{what}: block at byte {offset} fails its checksum")
    try:
        batch = pa.ipc.read_record_batch(data, schema)
        # buffers at least as long as the rows need (no value is read: this costs nothing): bytes that
        # match their checksum yet are malformed, as a writer's bug would leave, must not be read past
        batch.validate()
    except (pa.ArrowInvalid, pa.ArrowIOError, ValueError, EOFError) as e:  # EOFError: bytes end before the metadata
        raise CorruptionError(f"{what}: block at byte {offset} cannot be decoded ({e})") from None
    if batch.num_rows != rows:
        raise CorruptionError(f"{what}: block at byte {offset} holds {batch.num_rows} rows, its descriptor says {rows}")
    return batch
