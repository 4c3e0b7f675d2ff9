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


def check_range_bounds(lo, hi, key_type: pa.DataType) -> None:
    """ReadError unless each bound of a key range (None: open) compares with keys of ``key_type``:
    a number (not a bool) for integer keys, a str for string keys (else the plan's comparisons
    would fail in Python's terms)."""
    for side, value in (("lower", lo), ("upper", hi)):
        if value is None:
            continue
        if is_int_key(key_type):
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
        else:
            ok = isinstance(value, str)
        if not ok:
            raise ReadError(f"the range's {side} bound {value!r} is not of the key column's type, {key_type}")


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
