"""The archive's record schema: which Arrow types can be stored and how each is laid out.

A record has a search key (int64 or string), ``ts`` and ``exp`` (int64) and any payload columns
of fixed-width types (integers, floats, bool, temporal, decimal, fixed-size binary) or
variable-width types (string, binary). The schema is fixed at the first load. Column names
starting with ``__ebb`` are reserved for ebb's hidden columns (``block_format.INS_SLOT``).
"""

from __future__ import annotations

import pyarrow as pa

from .config import RESERVED_PREFIX
from .errors import SchemaError


def _storable(t: pa.DataType) -> pa.DataType:
    """Normalises an input type to the stored type, or raises SchemaError."""
    if pa.types.is_dictionary(t):
        return _storable(t.value_type)
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()
    if pa.types.is_string(t) or pa.types.is_binary(t):
        return t
    if pa.types.is_boolean(t):
        return t
    if pa.types.is_null(t) or pa.types.is_nested(t) or pa.types.is_union(t):
        raise SchemaError(f"column type {t} is not supported (use scalar payload columns)")
    try:
        t.bit_width
    except ValueError:
        raise SchemaError(f"column type {t} is not supported") from None
    if t.bit_width % 8:
        raise SchemaError(f"column type {t} is not supported")
    return t


def archive_schema(input_schema: pa.Schema, key: str, ts: str, exp: str) -> pa.Schema:
    """The stored schema for a first batch: types normalised, key/ts/exp checked, key/ts/exp
    non-nullable. Raises SchemaError naming the problem."""
    names = input_schema.names
    for role, col in (("key", key), ("ts", ts), ("exp", exp)):
        if col not in names:
            raise SchemaError(f"the {role} column {col!r} is missing (columns: {', '.join(names)})")
    if len(set(names)) != len(names):
        raise SchemaError("duplicate column names: " + ", ".join(sorted({n for n in names if names.count(n) > 1})))
    reserved = [n for n in names if n.startswith(RESERVED_PREFIX)]
    if reserved:
        raise SchemaError(f"column name {reserved[0]!r} is reserved: names starting with {RESERVED_PREFIX!r} "
                          "are ebb's hidden columns; rename it")
    fields = []
    for f in input_schema:
        try:
            t = _storable(f.type)
        except SchemaError as e:
            raise SchemaError(f"column {f.name!r}: {e}") from None
        if f.name in (ts, exp) and not pa.types.is_integer(t):
            raise SchemaError(f"the {f.name!r} column must be int64 chronons, got {f.type}")
        if f.name in (ts, exp):
            t = pa.int64()
        if f.name == key:
            if pa.types.is_integer(t):
                t = pa.int64()
            elif not pa.types.is_string(t):
                raise SchemaError(f"the key column {key!r} must be int64 or string, got {f.type}")
        fields.append(pa.field(f.name, t, nullable=f.name not in (key, ts, exp)))
    return pa.schema(fields)


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Casts a batch to the archive schema, or raises SchemaError naming the mismatch."""
    have = {f.name: f.type for f in table.schema}
    want = {f.name: f.type for f in schema}
    missing = [n for n in want if n not in have]
    extra = [n for n in have if n not in want]
    wrong = [
        f"{n} ({have[n]} instead of {want[n]})"
        for n in want
        if n in have and not _compatible(have[n], want[n])
    ]
    if missing or extra or wrong:
        parts = []
        if missing:
            parts.append("missing columns: " + ", ".join(missing))
        if extra:
            parts.append("unexpected columns: " + ", ".join(extra))
        if wrong:
            parts.append("wrong types: " + ", ".join(wrong))
        raise SchemaError("schema does not match the archive's: " + "; ".join(parts))
    cols = []
    for f in schema:
        c = table.column(f.name)
        if c.type != f.type:
            c = c.cast(f.type)
        cols.append(c)
    return pa.Table.from_arrays(cols, schema=schema)


def _compatible(have: pa.DataType, want: pa.DataType) -> bool:
    try:
        got = _storable(have)
    except SchemaError:
        return False
    if got == want:
        return True
    # integer chronons or keys of a narrower integer type are accepted and widened
    return pa.types.is_integer(got) and want == pa.int64()
