"""Zero-copy moves between Arrow arrays and numpy, and empty tables, that do not import pandas.

pyarrow's own ``to_numpy``, ``pa.array(ndarray)`` and ``Schema.empty_table`` load pandas on
first use (0.2-0.3 s), which would dominate a one-shot ``ebb probe``. The moves work on
fixed-width columns without nulls, which is what ebb's key, ts, exp and slot columns are.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa


_DTYPES = {pa.int64().id: np.dtype(np.int64), pa.int32().id: np.dtype(np.int32)}


def to_np(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The values of a fixed-width, null-free Arrow array as numpy (a view for one chunk)."""
    if isinstance(arr, pa.ChunkedArray):
        parts = [to_np(c) for c in arr.chunks]
        return parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else np.zeros(0, arr.type.to_pandas_dtype())
    dtype = _DTYPES.get(arr.type.id) or np.dtype(arr.type.to_pandas_dtype())
    return np.frombuffer(arr.buffers()[1], dtype=dtype, count=len(arr), offset=arr.offset * dtype.itemsize)


def from_np(values: np.ndarray) -> pa.Array:
    """An Arrow array viewing a numpy array of a fixed-width type."""
    values = np.ascontiguousarray(values)
    return pa.Array.from_buffers(pa.from_numpy_dtype(values.dtype), len(values), [None, pa.py_buffer(values)])


def empty_table(schema: pa.Schema) -> pa.Table:
    """A table of ``schema`` with no rows (and no chunks)."""
    return pa.Table.from_batches([], schema)
