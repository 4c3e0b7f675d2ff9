"""Search keys: their types, the limit on string keys, and keys given on the command line.

Keys are int64 or UTF-8 strings of at most MAX_STRING_KEY_BYTES bytes. Inside a block, records
are ordered by key in Arrow's order (numeric, or bytewise UTF-8, which is code-point order).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from .errors import ReadError, UsageError

MAX_STRING_KEY_BYTES = 510


def is_int_key(t: pa.DataType) -> bool:
    return pa.types.is_integer(t)


def search_key(key):
    """``key`` as the Python int or str that searches compare: a numpy or Arrow scalar (a key taken
    from an array or a data frame) becomes the value it holds, so that it takes the path its value
    would (the native probe takes only ``int`` and ``str``); anything else is returned as it is."""
    t = type(key)
    if t is int or t is str:
        return key
    if isinstance(key, np.integer):
        return int(key)
    if isinstance(key, np.str_):
        return str(key)
    if isinstance(key, pa.Scalar):
        return key.as_py()
    return key


def comparable(value, key_type: pa.DataType) -> bool:
    """Whether ``value`` (a search key, ``search_key``) compares with keys of ``key_type``: a
    number, not a bool nor NaN, for integer keys (one the column cannot hold, such as 1.5 or
    2**63, equals none of its keys); a str for string keys."""
    if is_int_key(key_type):
        return isinstance(value, (int, float, np.floating)) and not isinstance(value, bool) and value == value
    return isinstance(value, str)


def check_range_bounds(lo, hi, key_type: pa.DataType) -> None:
    """ReadError unless each bound of a key range (None: open) is ``comparable`` with keys of
    ``key_type`` (else the plan's comparisons would fail in Python's terms)."""
    for side, value in (("lower", lo), ("upper", hi)):
        if value is not None and not comparable(value, key_type):
            raise ReadError(f"the range's {side} bound {value!r} is not of the key column's type, {key_type}")


def int_keys(keys) -> np.ndarray:
    """Probe keys of an integer key column (a sequence or array) as int64, on the terms of one
    key's probe: whole numbers probe their integer, and numbers no int64 equals (1.5, 2**63) are
    dropped; ReadError for a null (None, NaN) or a value that is not a number."""
    arr = np.asarray(keys)
    if arr.ndim == 1 and arr.dtype == object:  # Arrow or numpy scalars, or ints beyond int64
        values = [search_key(k) for k in arr.tolist()]
        if any(v is None or v != v for v in values):
            raise ReadError("probe keys cannot be null")
        if not all(comparable(v, pa.int64()) for v in values):
            raise TypeError
        ints = [v for v in values if type(v) is int and -(1 << 63) <= v < (1 << 63)]
        arr = np.concatenate([np.array(ints, np.int64), _whole(np.array([v for v in values if type(v) is not int], float))])
    if arr.ndim != 1 or arr.size and arr.dtype.kind not in "iuf":
        raise TypeError
    if arr.dtype.kind == "f":  # an integer column with nulls, from pandas
        if np.isnan(arr).any():
            raise ReadError("probe keys cannot be null (NaN)")
        return _whole(arr)
    if arr.dtype.kind == "u" and arr.size and arr.max() > np.iinfo(np.int64).max:
        arr = arr[arr <= np.iinfo(np.int64).max]
    return arr.astype(np.int64, copy=False)


def _whole(x: np.ndarray) -> np.ndarray:
    """The values of float array ``x`` that are int64 integers, as int64."""
    return x[(x == np.floor(x)) & (x >= -2.0 ** 63) & (x < 2.0 ** 63)].astype(np.int64)


def parse(text: str, key_type: pa.DataType):
    """A key given on the command line, as a value of the archive's key type."""
    if is_int_key(key_type):
        try:
            return int(text)
        except ValueError:
            raise UsageError(f"the archive's keys are integers; {text!r} is not one") from None
    return text


def too_long(arr: pa.Array | pa.ChunkedArray) -> int:
    """Number of string keys longer than MAX_STRING_KEY_BYTES."""
    if is_int_key(arr.type):
        return 0
    import pyarrow.compute as pc  # here, not at the top: a one-shot `ebb probe` never needs it

    return int(pc.sum(pc.fill_null(pc.greater(pc.binary_length(arr), MAX_STRING_KEY_BYTES), False)).as_py() or 0)
