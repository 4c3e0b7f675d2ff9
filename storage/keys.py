"""Search keys as directory keys: an order-preserving byte encoding for LMDB.

int64 keys become 8 big-endian bytes with the sign bit flipped, so byte order is numeric order.
String keys become b"\\x01" + UTF-8 (LMDB rejects empty keys, the prefix makes "" storable and
keeps byte order). LMDB keys are limited to 511 bytes, so string keys are limited to 510.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

MAX_STRING_KEY_BYTES = 510
_SIGN = np.uint64(1 << 63)
_PREFIX = b"\x01"


def is_int_key(t: pa.DataType) -> bool:
    return pa.types.is_integer(t)


def encode_arrow(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Directory keys of an Arrow key column (no nulls) as an Arrow binary array, so that key
    sets can be sorted, deduplicated and matched with Arrow compute instead of Python."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if is_int_key(arr.type):
        v = np.asarray(arr.to_numpy(zero_copy_only=False), dtype=np.int64)
        be = (v.view(np.uint64) ^ _SIGN).astype(">u8")
        return pa.Array.from_buffers(pa.binary(8), len(v), [None, pa.py_buffer(be)]).cast(pa.binary())
    return pc.binary_join_element_wise(pa.scalar(_PREFIX, pa.binary()), arr.cast(pa.binary()), pa.scalar(b"", pa.binary()))


def encode(arr: pa.Array | pa.ChunkedArray) -> list[bytes]:
    """Directory keys of an Arrow key column (no nulls), in the column's order."""
    return encode_arrow(arr).to_pylist()


def sorted_unique(keys: pa.Array) -> pa.Array:
    """Distinct encoded keys in LMDB order (Arrow orders binary values bytewise, like LMDB)."""
    u = pc.unique(keys)
    return u.take(pc.sort_indices(u))


def decode(keys: list[bytes], key_type: pa.DataType) -> pa.Array:
    """Inverse of ``encode``."""
    if is_int_key(key_type):
        if not keys:
            return pa.array([], pa.int64())
        u = np.frombuffer(b"".join(keys), dtype=">u8").astype(np.uint64) ^ _SIGN
        return pa.array(u.view(np.int64))
    raw = pa.array(keys, pa.binary())
    return pc.binary_slice(raw, 1, 1 << 30).cast(pa.string())  # an explicit stop: pyarrow 26 fails without one


def encode_one(value, key_type: pa.DataType) -> bytes:
    return encode(pa.array([value], key_type))[0]


def parse(text: str, key_type: pa.DataType):
    """A key given on the command line, as a value of the archive's key type."""
    if is_int_key(key_type):
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"the archive's keys are integers; {text!r} is not one") from None
    return text


def too_long(arr: pa.Array | pa.ChunkedArray) -> int:
    """Number of string keys longer than MAX_STRING_KEY_BYTES."""
    if is_int_key(arr.type):
        return 0
    return int(pc.sum(pc.fill_null(pc.greater(pc.binary_length(arr), MAX_STRING_KEY_BYTES), False)).as_py() or 0)
