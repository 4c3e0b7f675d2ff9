"""Encodes runs of records into buckets and decodes buckets back into Arrow, vectorised.

A bucket is one contiguous byte range holding ``count`` records of one key, sorted by ``exp``.
Its layout is column-grouped (PAX): a fixed section of ``count * F`` bytes, then a var section::

    bucket      := fixed_section var_section
    fixed_section := for each column c: [validity: count x u8 if c is nullable]
                                        values: count x width(c)   (var columns: u32 lengths)
    var_section   := for each var column c: the bytes of its count values, in row order

so a bucket's size is the sum of its records' sizes (F + their var bytes). Many buckets are
encoded or decoded in one call: nothing here loops over records in Python.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from .ranges import gather, scatter
from .schema import ColumnSpec, INS_SLOT, column_specs


def _column_array(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    return col


def _validity_bytes(a: pa.Array) -> np.ndarray:
    if a.null_count == 0:
        return np.ones(len(a), dtype=np.uint8)
    return a.is_valid().to_numpy(zero_copy_only=False).astype(np.uint8)


def _fixed_value_bytes(a: pa.Array, spec: ColumnSpec) -> np.ndarray:
    n = len(a)
    if pa.types.is_boolean(spec.type):
        return a.fill_null(False).to_numpy(zero_copy_only=False).astype(np.uint8)
    buf = a.buffers()[1]
    if buf is None or n == 0:
        return np.zeros(n * spec.width, dtype=np.uint8)
    return np.frombuffer(buf, dtype=np.uint8, count=n * spec.width, offset=a.offset * spec.width)


def _var_parts(a: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(offsets as int64 absolute into data, data bytes) of a string/binary array."""
    n = len(a)
    bufs = a.buffers()
    odt = np.int64 if pa.types.is_large_string(a.type) or pa.types.is_large_binary(a.type) else np.int32
    offsets = np.frombuffer(bufs[1], dtype=odt, count=n + 1, offset=a.offset * np.dtype(odt).itemsize)
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    return offsets.astype(np.int64), data


class BucketCodec:
    """Encoder and decoder of buckets for one archive schema (user columns + INS_SLOT)."""

    def __init__(self, schema: pa.Schema):
        self.schema = schema
        self.specs = column_specs(schema)
        self.physical_schema = pa.schema(
            [pa.field(s.name, s.type, nullable=s.nullable) for s in self.specs]
        )
        # per-column offset (in units of count) of validity and values inside the fixed section
        self._vpos: list[int] = []
        self._valpos: list[int] = []
        pos = 0
        for s in self.specs:
            self._vpos.append(pos)
            pos += 1 if s.nullable else 0
            self._valpos.append(pos)
            pos += s.width
        self.fixed_row_bytes = pos  # F
        self.var_specs = [i for i, s in enumerate(self.specs) if s.var]

    # -- sizes ---------------------------------------------------------------------------------
    def row_sizes(self, table: pa.Table) -> np.ndarray:
        """Encoded size of each record of ``table`` (physical columns), as int64."""
        sizes = np.full(table.num_rows, self.fixed_row_bytes, dtype=np.int64)
        for i in self.var_specs:
            off, _ = _var_parts(_column_array(table.column(self.specs[i].name)))
            sizes += np.diff(off)
        return sizes

    # -- encode --------------------------------------------------------------------------------
    def encode(self, table: pa.Table, bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Encodes ``table`` (physical schema, rows already grouped and ordered) into buckets
        ``[bounds[b], bounds[b+1])``. Returns (bytes, bucket byte offsets incl. the end)."""
        bounds = np.asarray(bounds, dtype=np.int64)
        counts = np.diff(bounds)
        nb = counts.size
        cols = [_column_array(table.column(s.name)) for s in self.specs]
        var_bytes = []  # per var column: bytes per bucket, and the column's parts
        bucket_sizes = counts * self.fixed_row_bytes
        for i in self.var_specs:
            off, data = _var_parts(cols[i])
            vb = off[bounds[1:]] - off[bounds[:-1]]
            var_bytes.append((i, off, data, vb))
            bucket_sizes = bucket_sizes + vb
        starts = np.zeros(nb + 1, dtype=np.int64)
        np.cumsum(bucket_sizes, out=starts[1:])
        out = np.empty(int(starts[-1]), dtype=np.uint8)
        base = starts[:-1]
        for i, s in enumerate(self.specs):
            a = cols[i]
            if s.nullable:
                scatter(out, base + counts * self._vpos[i], _validity_bytes(a), counts)
            if s.var:
                off = next(v[1] for v in var_bytes if v[0] == i)
                lengths = np.diff(off).astype("<u4").view(np.uint8)
                scatter(out, base + counts * self._valpos[i], lengths, counts * 4)
            else:
                scatter(out, base + counts * self._valpos[i], _fixed_value_bytes(a, s), counts * s.width)
        vpos = base + counts * self.fixed_row_bytes
        for i, off, data, vb in var_bytes:
            lo = int(off[0])
            scatter(out, vpos, data[lo : int(off[-1])], vb)
            vpos = vpos + vb
        return out, starts

    # -- decode --------------------------------------------------------------------------------
    def decode(self, src: np.ndarray, starts: np.ndarray, counts: np.ndarray, columns: list[str] | None = None) -> pa.Table:
        """Decodes the buckets at byte offsets ``starts`` of ``src`` (with ``counts`` records
        each) into one table in bucket order. ``columns`` limits the physical columns built."""
        starts = np.asarray(starts, dtype=np.int64)
        counts = np.asarray(counts, dtype=np.int64)
        n = int(counts.sum())
        bucket_of_row = None
        var_total = starts + counts * self.fixed_row_bytes  # where each bucket's var section begins
        lengths_of: dict[int, np.ndarray] = {}
        for i in self.var_specs:
            lengths_of[i] = gather(src, starts + counts * self._valpos[i], counts * 4).view("<u4").astype(np.int64)
        arrays, fields = [], []
        want = set(columns) if columns is not None else None
        var_cursor = var_total
        for i, s in enumerate(self.specs):
            if s.var:
                lens = lengths_of[i]
                if bucket_of_row is None:
                    bucket_of_row = np.repeat(np.arange(counts.size), counts)
                per_bucket = np.bincount(bucket_of_row, weights=lens, minlength=counts.size).astype(np.int64) if n else np.zeros(counts.size, np.int64)
                data_starts = var_cursor
                var_cursor = var_cursor + per_bucket
            if want is not None and s.name not in want:
                continue
            validity = None
            null_count = 0
            if s.nullable:
                vb = gather(src, starts + counts * self._vpos[i], counts)
                null_count = int(n - np.count_nonzero(vb))
                if null_count:
                    validity = pa.py_buffer(np.packbits(vb.astype(bool), bitorder="little"))
            if s.var:
                offsets = np.zeros(n + 1, dtype=np.int64)
                np.cumsum(lens, out=offsets[1:])
                data = gather(src, data_starts, per_bucket)
                big = offsets[-1] >= 2**31
                t = (pa.large_string() if pa.types.is_string(s.type) else pa.large_binary()) if big else s.type
                odt = np.int64 if big else np.int32
                arr = pa.Array.from_buffers(t, n, [validity, pa.py_buffer(offsets.astype(odt)), pa.py_buffer(data)], null_count=null_count)
            else:
                vals = gather(src, starts + counts * self._valpos[i], counts * s.width)
                if pa.types.is_boolean(s.type):
                    vals = np.packbits(vals.astype(bool), bitorder="little")
                arr = pa.Array.from_buffers(s.type, n, [validity, pa.py_buffer(vals)], null_count=null_count)
            arrays.append(arr)
            fields.append(pa.field(s.name, arr.type, nullable=s.nullable))
        return pa.Table.from_arrays(arrays, schema=pa.schema(fields))

    def user_columns(self) -> list[str]:
        return [s.name for s in self.specs if s.name != INS_SLOT]
