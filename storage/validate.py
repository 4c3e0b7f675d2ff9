"""Checks an incoming batch against the bad-input policy (docs/spec.md section 5) before anything is written.

A batch is rejected whole: every problem is collected, each named with the number of offending
rows and the first of them, and ``RejectedBatch`` carries the combined message.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from . import keys as keycodec
from .config import ArchiveConfig
from .errors import RejectedBatch, SchemaError
from .manifest import ArchiveState
from .schema import SchemaHistory, archive_schema, conform, grown_schema
from .timemodel import MAX_TIME


def update_slot(config: ArchiveConfig, state: ArchiveState, at: int) -> int:
    """The slot j of an update at time ``at``, or RejectedBatch if ``at`` is not allowed."""
    tm = config.time
    if not -MAX_TIME <= at <= MAX_TIME:  # (a typo such as --at 9223372036854775810 would expire every record)
        raise RejectedBatch(f"update time {at} is outside ebb's time range (+-{MAX_TIME} chronons)")
    j = tm.update_slot(at)
    if j is None:
        raise RejectedBatch(
            f"update time {at} is not tau + j*Delta (tau={tm.tau}, Delta={tm.delta}); "
            f"the nearest update times are {tm.time_of((at - tm.tau) // tm.delta)} and {tm.time_of((at - tm.tau) // tm.delta + 1)}"
        )
    if state.last_slot is None:
        if j < 0:
            raise RejectedBatch(f"update time {at} is before the archive's start time tau={tm.tau}")
    elif j <= state.last_slot:
        raise RejectedBatch(
            f"update time {at} is not after the last update at {tm.time_of(state.last_slot)}; "
            f"the next update time is {tm.time_of(state.last_slot + 1)}"
        )
    return j


def _first_row(mask: np.ndarray, table: pa.Table, config: ArchiveConfig) -> str:
    i = int(np.flatnonzero(mask)[0])
    row = {c: table.column(c)[i].as_py() for c in (config.key_column, config.ts_column, config.exp_column)}
    return f"first at row {i}: " + ", ".join(f"{k}={v!r}" for k, v in row.items())


def conform_batch(table: pa.Table, config: ArchiveConfig, stored: SchemaHistory | None, seq: int,
                  at: int) -> tuple[pa.Table, SchemaHistory]:
    """The batch cast to the archive schema after update ``seq`` at ``at``, and that schema's
    history: derived from this batch on the first load; with the batch's new columns appended
    later (``schema.grown_schema``). SchemaError (a RejectedBatch) for a dropped or retyped
    column or a type that cannot be stored."""
    if stored is None:
        history = SchemaHistory.first(archive_schema(table.schema, config.key_column, config.ts_column,
                                                     config.exp_column), seq, at)
    else:
        history = stored.grown(grown_schema(stored.schema, table.schema), seq, at)
    return conform_to(table, history.schema), history


def conform_to(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """The batch cast to ``schema`` exactly (no column added); SchemaError if it does not fit."""
    try:
        return conform(table, schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise SchemaError(f"schema does not match the archive's: {e}") from None


def check_rows(table: pa.Table, config: ArchiveConfig, at: int) -> None:
    """Raises RejectedBatch listing every row-level problem of docs/spec.md section 5, plus
    times outside +-MAX_TIME (so no difference of times overflows) and strings that are not
    valid UTF-8 (they could never be read back)."""
    k, ts, exp = config.key_column, config.ts_column, config.exp_column
    problems: list[str] = []
    n = table.num_rows
    if n == 0:
        return
    for col in (k, ts, exp):
        nulls = table.column(col).null_count
        if nulls:
            mask = table.column(col).is_null().to_numpy(zero_copy_only=False)
            problems.append(f"{nulls} rows have a null {col} ({_first_row(mask, table, config)})")
    tsv = table.column(ts).fill_null(0).to_numpy()
    expv = table.column(exp).fill_null(0).to_numpy()
    present = ~(
        table.column(ts).is_null().to_numpy(zero_copy_only=False) | table.column(exp).is_null().to_numpy(zero_copy_only=False)
    )
    # compared, not np.abs: the absolute value of -2^63 overflows back to -2^63
    far = (tsv > MAX_TIME) | (tsv < -MAX_TIME) | (expv > MAX_TIME) | (expv < -MAX_TIME)
    checks = [
        (present & far, f"have {ts} or {exp} outside +-{MAX_TIME} chronons (ebb's time range)"),
        (present & ~far & (expv <= tsv), f"have {exp} <= {ts} (an empty validity interval)"),
        (present & (tsv > at), f"have {ts} after the update time {at}"),
    ]
    if not config.accept_overlong:
        checks.append(
            (present & ~far & (expv - tsv > config.max_lifetime),
             f"have a lifetime {exp} - {ts} over S={config.max_lifetime} (create the archive with --accept-overlong to store them)")
        )
    for mask, what in checks:
        c = int(np.count_nonzero(mask))
        if c:
            problems.append(f"{c} rows {what} ({_first_row(mask, table, config)})")
    for f in table.schema:
        if pa.types.is_string(f.type):
            bad = _invalid_utf8(table.column(f.name))
            if bad:
                problems.append(f"{bad} rows have a {f.name} that is not valid UTF-8")
    long_keys = keycodec.too_long(table.column(k))
    if long_keys:
        problems.append(f"{long_keys} rows have a key longer than {keycodec.MAX_STRING_KEY_BYTES} bytes")
    if problems:
        raise RejectedBatch("batch rejected, nothing was loaded: " + "; ".join(problems))


def _invalid_utf8(col: pa.ChunkedArray) -> int:
    """Number of values of a string column that are not valid UTF-8 (0 for a valid column,
    checked in C; the count is found only for a column that fails)."""
    try:
        for chunk in col.chunks:
            chunk.validate(full=True)
        return 0
    except pa.ArrowInvalid:
        return sum(1 for v in col.cast(pa.binary()).to_pylist() if v is not None and not _decodes(v))


def _decodes(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False
