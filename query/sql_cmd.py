"""``ebb sql``: one SQL query, run by DuckDB, over the records an archive holds valid at an instant.

The archive is the view ``records``: the scan's record batches, registered with DuckDB as an
Arrow stream that reads block by block as the query pulls it, so an aggregate over a large
archive never holds it in memory. The result is written as ``ebb scan`` writes records
(``output.write``). DuckDB is an optional extra (``pip install 'ebb[sql]'``), imported only when
the command runs: ``ebb --help`` imports this module, and ``ebb probe`` must start fast.

``register`` adds the command to the ``ebb`` parser (``tools/cli.py``).
"""

from __future__ import annotations

import argparse
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Iterator

from ..storage.errors import UsageError
from .output import add_output_options

if TYPE_CHECKING:
    import pyarrow as pa

INSTALL_HINT = "ebb sql needs DuckDB, an optional extra: pip install 'ebb[sql]' (or pip install duckdb)"

DESCRIPTION = """\
Run one SQL query (DuckDB's dialect) over the records valid at a time. The archive is the table
`records`, with the archive's columns; only records with ts <= AS_OF < exp are in it. AS_OF
defaults to the time of the last update and may not be earlier unless the archive keeps history
(`ebb init --retain`).

`records` is streamed from the archive as the query reads it, once: a query that reads it twice
(a self-join, two subqueries) fails; read it once into a materialized CTE instead:
  WITH r AS MATERIALIZED (SELECT * FROM records) SELECT ... FROM r a JOIN r b ON ...

examples:
  ebb sql /data/arc "SELECT site, count(*) AS n, avg(value) FROM records GROUP BY site ORDER BY site"
  ebb sql /data/arc "SELECT * FROM records WHERE value > 25" --as-of 840 --format csv --out hot.csv

Needs DuckDB: pip install 'ebb[sql]'.
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    c = subparsers.add_parser("sql", help="a SQL query (DuckDB) over the records valid at a time",
                              description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("path", help="archive directory, or the data directory of one made with --data-dir, read through the metadata published there")
    c.add_argument("query", help="the query; the archive is the table `records`")
    c.add_argument("--as-of", type=int, metavar="T", help="time of validity (default: last update time)")
    add_output_options(c)
    c.set_defaults(handler=run)


def _duckdb() -> ModuleType:
    try:
        import duckdb
    except ImportError:
        raise UsageError(INSTALL_HINT) from None
    return duckdb


def _remembering(batches: Iterator[pa.RecordBatch], failures: list[BaseException]) -> Iterator[pa.RecordBatch]:
    """``batches``, keeping the error that ends them: it reaches DuckDB as a message only, and
    the command reports it with its own class (a corrupt block exits 6, not as a query error)."""
    try:
        yield from batches
    except Exception as e:
        failures.append(e)
        raise


def run(a: argparse.Namespace) -> int:
    duckdb = _duckdb()
    import pyarrow as pa

    from .output import write
    from .reader import ArchiveReader

    # the command's own snapshot: the schema registered is that of the version the scan reads
    with ArchiveReader(a.path, readonly=True) as r, r.snapshot() as snap:
        if snap.schema is None:
            print("(the archive is empty: nothing has been loaded)", file=sys.stderr)
            return 0
        failures: list[BaseException] = []
        batches = _remembering(r.scan_batches(a.as_of, snapshot=snap), failures)
        con = duckdb.connect()
        try:
            con.register("records", pa.RecordBatchReader.from_batches(snap.schema, batches))
            relation = con.sql(a.query)
            if relation is None:  # a statement with no result (SET, CREATE ...): nothing to print
                return 0
            # to_arrow_reader from DuckDB 1.5 on, which deprecates fetch_record_batch (its name before)
            result = (relation.to_arrow_reader if hasattr(relation, "to_arrow_reader") else relation.fetch_record_batch)()
            n = write(result, result.schema, a.format, a.out)
        except Exception as e:
            if failures:  # the archive failed, not the query
                raise failures[0] from None
            if isinstance(e, (duckdb.ProgrammingError, duckdb.DataError)):  # parse, bind, cast ...: the query is wrong
                raise UsageError(f"the query: {e}") from None
            raise
        finally:
            con.close()  # before the snapshot closes: DuckDB lets go of the stream
    if a.out or a.format == "table":
        print(f"{n} rows", file=sys.stderr)
    return 0
