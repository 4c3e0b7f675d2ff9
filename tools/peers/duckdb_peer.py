"""DuckDB peer: one table with ART indices on ``key`` and ``exp``, loaded from Arrow.

Each update is one transaction: ``DELETE WHERE exp <= T`` then ``INSERT ... SELECT`` from the
Arrow batch (zero-copy registration, no per-record Python). A probe filters on key (DuckDB uses
the ART index for a point predicate); a scan streams the whole table back as Arrow batches.
"""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.compute as pc

from ..store import ReadResult, Store

DB = "records.duckdb"


class DuckDBStore(Store):
    name = "duckdb"

    def __init__(self, path, workload):
        super().__init__(path, workload)
        self.con = None

    def open(self) -> None:
        import duckdb

        self.con = duckdb.connect(os.path.join(self.path, DB))

    def create(self) -> None:
        self.open()
        self.con.execute("CREATE TABLE r (key BIGINT NOT NULL, ts BIGINT NOT NULL, exp BIGINT NOT NULL, "
                         "seq BIGINT NOT NULL, payload BLOB NOT NULL)")
        self.con.execute("CREATE INDEX r_key ON r(key)")
        self.con.execute("CREATE INDEX r_exp ON r(exp)")

    def close(self) -> None:
        if self.con is not None:
            self.con.close()
            self.con = None

    def load(self, table: pa.Table, at: int) -> dict[str, int]:
        con = self.con
        con.execute("BEGIN TRANSACTION")
        try:
            deleted = con.execute("DELETE FROM r WHERE exp <= ?", [at]).fetchone()[0]
            con.register("batch", table)
            con.execute("INSERT INTO r SELECT key, ts, exp, seq, payload FROM batch")
            con.unregister("batch")
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        return {"inserted": table.num_rows, "deleted": int(deleted)}

    def _read(self, sql: str, params: list) -> ReadResult:
        reader = self.con.sql(sql, params=params).to_arrow_reader(1 << 16)
        rows = seq = 0
        for batch in reader:
            rows += batch.num_rows
            if batch.num_rows:
                seq += int(pc.sum(batch.column("seq")).as_py())
        return ReadResult(rows, seq)

    def probe(self, key: int, at: int) -> ReadResult:
        return self._read("SELECT key, ts, exp, seq, payload FROM r WHERE key = ? AND ts <= ? AND exp > ?", [key, at, at])

    def scan(self, at: int) -> ReadResult:
        return self._read("SELECT key, ts, exp, seq, payload FROM r WHERE ts <= ? AND exp > ?", [at, at])
