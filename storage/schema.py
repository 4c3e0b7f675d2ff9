"""The archive's record schema: which Arrow types can be stored, and how the schema may grow.

A record has a search key (int64 or string), ``ts`` and ``exp`` (int64) and any payload columns
of fixed-width types (integers, floats, bool, temporal, decimal, fixed-size binary) or
variable-width types (string, binary). The first load sets the schema; a later load may add
nullable columns, appended after the existing ones, and nothing else: a batch that lacks a
column or gives one another type is refused. So every schema the archive had is a prefix of
the newest, and a ``SchemaHistory`` needs only each version's column count. Records written
under an older version read as null in the columns added since (``widen``). Column names
starting with ``__ebb`` are reserved for ebb's hidden columns (``block_format.INS_SLOT``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pyarrow as pa

from .config import RESERVED_PREFIX
from .errors import CorruptionError, SchemaError


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
    _check_names(names)
    fields = []
    for f in input_schema:
        t = _stored_type(f)
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


def _check_names(names: list[str]) -> None:
    if len(set(names)) != len(names):
        raise SchemaError("duplicate column names: " + ", ".join(sorted({n for n in names if names.count(n) > 1})))
    reserved = [n for n in names if n.startswith(RESERVED_PREFIX)]
    if reserved:
        raise SchemaError(f"column name {reserved[0]!r} is reserved: names starting with {RESERVED_PREFIX!r} "
                          "are ebb's hidden columns; rename it")


def _stored_type(f: pa.Field) -> pa.DataType:
    try:
        return _storable(f.type)
    except SchemaError as e:
        raise SchemaError(f"column {f.name!r}: {e}") from None


def grown_schema(stored: pa.Schema, input_schema: pa.Schema) -> pa.Schema:
    """The archive schema after a load of a batch with ``input_schema``: ``stored`` with the
    batch's new columns appended (nullable, in the batch's order). SchemaError, naming each
    column and its types, if the batch lacks a stored column or gives one a type it cannot be
    cast to (a column is never dropped or retyped)."""
    _check_names(input_schema.names)
    problems = _mismatches(input_schema, stored)
    if problems:
        raise SchemaError("schema does not match the archive's: " + "; ".join(problems))
    added = [pa.field(f.name, _stored_type(f), nullable=True) for f in input_schema if f.name not in stored.names]
    return pa.schema(list(stored) + added) if added else stored


def _mismatches(have: pa.Schema, want: pa.Schema) -> list[str]:
    """One line for each column of ``want`` that ``have`` lacks or types incompatibly."""
    out = []
    for f in want:
        i = have.get_field_index(f.name)
        if i < 0:
            out.append(f"column {f.name!r} ({f.type}) is missing from the batch (a column cannot be dropped: "
                       "send it, null where unknown)")
        elif not _compatible(have.field(i).type, f.type):
            out.append(f"column {f.name!r} is {f.type} in the archive but {have.field(i).type} in the batch "
                       "(a column's type cannot change)")
    return out


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Casts a batch to the archive schema, or raises SchemaError naming the mismatch."""
    problems = _mismatches(table.schema, schema)
    extra = [n for n in table.schema.names if n not in schema.names]
    if extra:
        problems.append("unexpected columns: " + ", ".join(extra))
    if problems:
        raise SchemaError("schema does not match the archive's: " + "; ".join(problems))
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


def widen(batch: pa.RecordBatch | pa.Table, schema: pa.Schema) -> pa.RecordBatch | pa.Table:
    """``batch`` (written under an older version of ``schema``: a subset of its columns) with
    every column of ``schema``, those it lacks all null."""
    if batch.num_columns == len(schema):
        return batch
    n, have = batch.num_rows, batch.schema
    cols = [batch.column(i) if (i := have.get_field_index(f.name)) >= 0 else pa.nulls(n, f.type) for f in schema]
    kind = pa.RecordBatch if isinstance(batch, pa.RecordBatch) else pa.Table
    return kind.from_arrays(cols, schema=schema)


@dataclass(frozen=True)
class SchemaVersion:
    """One version of the archive schema: the first ``columns`` columns of the newest, current
    from update ``seq`` at ``time`` (None for the first schema of an archive written before
    schema histories were kept: it came with the first load)."""

    columns: int
    seq: int | None
    time: int | None


@dataclass(frozen=True)
class SchemaHistory:
    """The archive schema (the newest version) and every version it had, oldest first: version
    v is the first ``versions[v].columns`` columns of ``schema``. Each run records the version
    it was written under (``RunDescriptor.schema``)."""

    schema: pa.Schema
    versions: tuple[SchemaVersion, ...]

    @staticmethod
    def first(schema: pa.Schema, seq: int | None, time: int | None) -> "SchemaHistory":
        return SchemaHistory(schema, (SchemaVersion(len(schema), seq, time),))

    @property
    def current(self) -> int:
        """The newest version (new runs are written under it)."""
        return len(self.versions) - 1

    def columns(self, version: int) -> int:
        """How many (leading) columns of ``schema`` version ``version`` had; CorruptionError
        for a version this history does not hold (a run's descriptor names it)."""
        if not 0 <= version < len(self.versions):
            raise CorruptionError(f"a run was written under schema version {version}, the archive's schema history "
                                  f"holds versions 0..{self.current}: its metadata is damaged")
        return self.versions[version].columns

    def grown(self, schema: pa.Schema, seq: int, time: int) -> "SchemaHistory":
        """This history with ``schema`` (``grown_schema``) as a new version from update ``seq``
        at ``time``; itself if ``schema`` adds no column."""
        if len(schema) == len(self.schema):
            return self
        return SchemaHistory(schema, self.versions + (SchemaVersion(len(schema), seq, time),))

    def describe(self) -> list[dict]:
        """Each version: the columns it added (all of them for version 0), the update that
        brought it (seq and time; None if not recorded) and its column count."""
        names = self.schema.names
        out, before = [], 0
        for v, sv in enumerate(self.versions):
            out.append({"version": v, "added": names[before:sv.columns], "update": sv.seq, "time": sv.time,
                        "columns": sv.columns})
            before = sv.columns
        return out

    def to_json(self) -> bytes:
        return json.dumps([[v.columns, v.seq, v.time] for v in self.versions], separators=(",", ":")).encode()

    @staticmethod
    def from_json(schema: pa.Schema, data: bytes | None) -> "SchemaHistory":
        """The history stored with ``schema`` (None: an archive from before schema histories,
        whose one version is its first schema); CorruptionError if it does not fit ``schema``."""
        if data is None:
            return SchemaHistory.first(schema, None, None)
        try:
            versions = tuple(SchemaVersion(int(c), s, t) for c, s, t in json.loads(data))
        except (ValueError, TypeError) as e:
            raise CorruptionError(f"the archive's schema history cannot be parsed ({e}): its metadata is damaged") from None
        counts = [v.columns for v in versions]
        if not counts or counts[-1] != len(schema) or counts[0] < 3 or counts != sorted(set(counts)):
            raise CorruptionError(f"the archive's schema history (column counts {counts}) does not fit its schema of "
                                  f"{len(schema)} columns: its metadata is damaged")
        return SchemaHistory(schema, versions)
