"""Writes query results in the formats the CLI offers: table, jsonl, csv, parquet.

pyarrow.csv and pyarrow.parquet are imported only for their formats: ``ebb probe`` should start
in well under a second."""

from __future__ import annotations

import argparse
import json
import sys
from typing import IO, TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    import pyarrow as pa

FORMATS = ("table", "jsonl", "csv", "parquet")
_MAX_CELL = 40


def add_output_options(parser: argparse.ArgumentParser) -> None:
    """``--format`` and ``--out``, the same for every command that prints records (probe, scan, sql)."""
    parser.add_argument("--format", choices=FORMATS, default="table", help="output format (default: table)")
    parser.add_argument("--out", metavar="FILE", help="write to FILE instead of stdout (required for parquet)")


def _cell(v) -> str:
    s = "" if v is None else str(v)
    return s if len(s) <= _MAX_CELL else s[: _MAX_CELL - 1] + "…"


def write(batches: Iterable[pa.RecordBatch], schema: pa.Schema, fmt: str, out: str | None) -> int:
    """Writes ``batches`` to ``out`` (a path) or stdout; returns the number of rows written."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if fmt == "parquet":
        import pyarrow.parquet as pq

        if not out:
            raise ValueError("--format parquet needs --out FILE")
        rows = 0
        with pq.ParquetWriter(out, schema) as w:
            for b in batches:
                w.write_batch(b)
                rows += b.num_rows
        return rows
    if fmt == "csv":
        import pyarrow.csv as pacsv

        sink = out if out else sys.stdout.buffer
        rows = 0
        with pacsv.CSVWriter(sink, schema) as w:
            for b in batches:
                w.write_batch(b)
                rows += b.num_rows
        return rows
    stream: IO[str] = open(out, "w") if out else sys.stdout
    try:
        return _write_text(batches, schema, fmt, stream)
    finally:
        if out:
            stream.close()


def _write_text(batches, schema: pa.Schema, fmt: str, stream: IO[str]) -> int:
    rows = 0
    widths = None
    for b in batches:
        if fmt == "jsonl":
            stream.write("".join(json.dumps(r, default=str) + "\n" for r in b.to_pylist()))
        else:
            cols = [[_cell(v) for v in b.column(i).to_pylist()] for i in range(b.num_columns)]
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
