"""SQLite peer (stdlib ``sqlite3``): one table with B-tree indices on ``key`` and ``exp``.

Each update is one transaction: ``DELETE WHERE exp <= T`` (found through the exp index) then a
bulk ``INSERT`` through ``executemany``. WAL journal with ``synchronous=FULL``, so a committed
update is durable, as ebb's is. A probe uses the key index; a scan reads the whole table in rowid order.
"""

from __future__ import annotations

import os
import sqlite3

import pyarrow as pa

from ..store import ReadResult, Store

DB = "records.sqlite"


class SQLiteStore(Store):
    name = "sqlite"

    def __init__(self, path, workload):
        super().__init__(path, workload)
        self.con: sqlite3.Connection | None = None

    def open(self) -> None:
        self.con = sqlite3.connect(os.path.join(self.path, DB), isolation_level=None)
        self.con.execute("PRAGMA journal_mode=WAL")
        self.con.execute("PRAGMA synchronous=FULL")
        self.con.execute("PRAGMA cache_size=-65536")  # 64 MiB page cache of its own

    def create(self) -> None:
        self.open()
        self.con.execute("CREATE TABLE r (key INTEGER NOT NULL, ts INTEGER NOT NULL, exp INTEGER NOT NULL, "
                         "seq INTEGER NOT NULL, payload BLOB NOT NULL)")
        self.con.execute("CREATE INDEX r_key ON r(key)")
        self.con.execute("CREATE INDEX r_exp ON r(exp)")

    def close(self) -> None:
        if self.con is not None:
            self.con.close()
            self.con = None

    def load(self, table: pa.Table, at: int) -> dict[str, int]:
        cols = [table.column(c).to_numpy().tolist() for c in ("key", "ts", "exp", "seq")]
        payload = table.column("payload").to_pylist()
        cur = self.con.cursor()
        cur.execute("BEGIN")
        try:
            deleted = cur.execute("DELETE FROM r WHERE exp <= ?", (at,)).rowcount
            cur.executemany("INSERT INTO r VALUES (?, ?, ?, ?, ?)", zip(*cols, payload))
            cur.execute("COMMIT")
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        return {"inserted": table.num_rows, "deleted": deleted}

    def _read(self, sql: str, params: tuple) -> ReadResult:
        cur = self.con.execute(sql, params)
        rows = seq = 0
        while True:
            chunk = cur.fetchmany(65536)
            if not chunk:
                break
            rows += len(chunk)
            seq += sum(r[3] for r in chunk)
        return ReadResult(rows, seq)

    def probe(self, key: int, at: int) -> ReadResult:
        return self._read("SELECT key, ts, exp, seq, payload FROM r WHERE key = ? AND ts <= ? AND exp > ?", (key, at, at))

    def scan(self, at: int) -> ReadResult:
        # NOT INDEXED: without it the planner walks the exp index for "exp > ?" (which every row
        # satisfies) and reads the table in random order, 4x slower cold
        return self._read("SELECT key, ts, exp, seq, payload FROM r NOT INDEXED WHERE ts <= ? AND exp > ?", (at, at))
