"""Writes query results in the formats the CLI offers: table, jsonl, csv, parquet.

Given the archive's clock (``timefmt.Clock``), the table shows its time columns as timestamps and
CSV and JSON lines add a ``<column>_time`` timestamp beside each, keeping the chronons; Parquet
always holds exactly the stored columns.

pyarrow.csv and pyarrow.parquet are imported only for their formats: ``ebb probe`` should start
in well under a second."""

from __future__ import annotations

import argparse
import json
import sys
from typing import IO, TYPE_CHECKING, Iterable, Iterator

from ..storage.errors import UsageError

if TYPE_CHECKING:
    import pyarrow as pa

    from .timefmt import Clock

FORMATS = ("table", "jsonl", "csv", "parquet")
_MAX_CELL = 40


def add_output_options(parser: argparse.ArgumentParser) -> None:
    """``--format`` and ``--out``, the same for every command that prints records (probe, scan, sql)."""
    parser.add_argument("--format", choices=FORMATS, default="table", help="output format (default: table)")
    parser.add_argument("--out", metavar="FILE", help="write to FILE instead of stdout (required for parquet)")


def _cell(v) -> str:
    s = "" if v is None else str(v)
    return s if len(s) <= _MAX_CELL else s[: _MAX_CELL - 1] + "…"


def check_output(fmt: str, out: str | None) -> None:
    """UsageError for a format and destination that cannot go together (before any work)."""
    if fmt not in FORMATS:
        raise UsageError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if fmt == "parquet" and not out:
        raise UsageError("--format parquet needs --out FILE (Parquet is not written to a terminal)")


def _with_times(batches: Iterable[pa.RecordBatch], schema: pa.Schema, clock: Clock,
                columns: list[str]) -> tuple[Iterator[pa.RecordBatch], pa.Schema]:
    """``batches`` with a ``<column>_time`` timestamp column after the last one for each of
    ``columns`` (int64 chronons; skipped if a column of that name exists). For CSV: Arrow
    builds the strings, which makes pyarrow import pandas, so table and JSON lines (the formats
    of quick answers) format in Python instead (``_write_text``)."""
    import pyarrow as pa

    cols = [c for c in columns if c in schema.names and f"{c}_time" not in schema.names]
    out_schema = schema
    for c in cols:
        out_schema = out_schema.append(pa.field(f"{c}_time", pa.string()))

    def convert() -> Iterator[pa.RecordBatch]:
        for b in batches:
            stamped = [clock.stamps(b.column(b.schema.get_field_index(c))) for c in cols]
            yield pa.RecordBatch.from_arrays([*b.columns, *stamped], schema=out_schema)

    return convert(), out_schema


def write(batches: Iterable[pa.RecordBatch], schema: pa.Schema, fmt: str, out: str | None,
          clock: Clock | None = None, time_columns: list[str] = ()) -> int:
    """Writes ``batches`` to ``out`` (a path) or stdout; returns the number of rows written. With
    a ``clock``, ``time_columns`` are shown as timestamps (module docstring)."""
    check_output(fmt, out)
    times = [c for c in time_columns if c in schema.names] if clock is not None else []
    if times and fmt == "csv":
        batches, schema = _with_times(batches, schema, clock, times)
    if fmt == "parquet":
        import pyarrow.parquet as pq

        rows = 0
        with pq.ParquetWriter(out, schema) as w:
            for b in batches:
                w.write_batch(b)
                rows += b.num_rows
        return rows
    if fmt == "csv":
        import pyarrow.csv as pacsv

        _check_csv(schema)
        sink = out if out else sys.stdout.buffer
        rows = 0
        with pacsv.CSVWriter(sink, schema) as w:
            for b in batches:
                w.write_batch(b)
                rows += b.num_rows
        return rows
    stream: IO[str] = open(out, "w") if out else sys.stdout
    try:
        return _write_text(batches, schema, fmt, stream, clock if times else None, times)
    finally:
        if out:
            stream.close()


def _check_csv(schema: pa.Schema) -> None:
    """UsageError naming the first column CSV cannot hold, before anything is written: pyarrow
    writes a cell as its cast to a string, which some types (intervals, lists, structs) lack."""
    import pyarrow as pa

    for f in schema:
        try:
            pa.array([], f.type).cast(pa.string())
        except pa.ArrowNotImplementedError:
            raise UsageError(f"--format csv cannot write column {f.name!r} ({f.type}); "
                             "use --format jsonl or --format parquet") from None


def _write_text(batches, schema: pa.Schema, fmt: str, stream: IO[str], clock: Clock | None = None,
                times: list[str] = ()) -> int:
    """Table or JSON lines; with a ``clock``, the ``times`` columns as timestamps: in place of
    the chronons in the table, beside them (``<column>_time``) in JSON lines."""
    stamp = (lambda v: v if v is None else clock.stamp(v)) if clock is not None else None
    rows = 0
    widths = None
    for b in batches:
        if fmt == "jsonl":
            records = b.to_pylist()
            if stamp is not None:
                extra = [c for c in times if f"{c}_time" not in schema.names]
                records = [{**r, **{f"{c}_time": stamp(r[c]) for c in extra}} for r in records]
            stream.write("".join(json.dumps(r, default=str) + "\n" for r in records))
        else:
            cols = [[_cell(stamp(v) if stamp is not None and f.name in times else v) for v in b.column(i).to_pylist()]
                    for i, f in enumerate(schema)]
            if widths is None:
                widths = [max([len(f.name)] + [len(v) for v in c]) for f, c in zip(schema, cols)]
                stream.write("  ".join(f.name.ljust(w) for f, w in zip(schema, widths)).rstrip() + "\n")
                stream.write("  ".join("-" * w for w in widths) + "\n")
            for r in range(b.num_rows):
                stream.write("  ".join(c[r].ljust(w) for c, w in zip(cols, widths)).rstrip() + "\n")
        rows += b.num_rows
    if fmt == "table" and widths is None:
        stream.write("  ".join(f.name for f in schema) + "\n(no records)\n")
    return rows
