"""RocksDB peer (rocksdict, raw bytes mode): the LMDB peer's keying on an LSM tree.

The default column family holds (key, exp, seq) -> ts + payload; the ``by_exp`` column family
holds (exp, key, seq) -> empty, to find what expired. Each update is one ``WriteBatch`` written
with ``sync=True``: point deletes (tombstones) of every expired record in both families, then
the new records. Compaction later drops the tombstoned versions.

Why not TTL or a compaction filter: RocksDB's TTL mode (``AccessType.with_ttl``) gives the whole
database one TTL counted in wall-clock seconds from the write, whereas these records have
individual lifetimes in chronons, and an expired value stays readable until a compaction
happens to reach it, so reads would still need to filter; a compaction filter that drops
``exp <= T`` would be the natural fit, but rocksdict does not expose custom compaction filters.
Per-key ``delete_range`` (one range tombstone per key) would also fit with few keys, but not
the million-key workload, so explicit deletes through the expiration family are used throughout.
"""

from __future__ import annotations

import gc
import os

import numpy as np
import pyarrow as pa

from ..store import ReadResult, Store
from .lmdb_peer import _decode, _encode

_CF = "by_exp"


class RocksDBStore(Store):
    name = "rocksdb"

    def __init__(self, path, workload):
        super().__init__(path, workload)
        self.db = None
        self.cf = None

    def _options(self):
        import rocksdict

        o = rocksdict.Options(raw_mode=True)
        o.create_if_missing(True)
        o.increase_parallelism(2)
        return o

    def open(self) -> None:
        import rocksdict

        self.db = rocksdict.Rdict(os.path.join(self.path, "rocksdb"), self._options())
        self.cf = self.db.get_column_family(_CF)

    def create(self) -> None:
        import rocksdict

        self.db = rocksdict.Rdict(os.path.join(self.path, "rocksdb"), self._options())
        self.cf = self.db.create_column_family(_CF, self._options())

    def close(self) -> None:
        if self.db is not None:
            self.cf.close()
            self.db.close()
            self.cf = self.db = None
            gc.collect()  # drop the last handles so the DB's files are really closed

    def load(self, table: pa.Table, at: int) -> dict[str, int]:
        import rocksdict

        key, ts, exp, seq = (table.column(c).to_numpy() for c in ("key", "ts", "exp", "seq"))
        order = np.lexsort((seq, exp, key))
        pkeys = _encode(key[order], exp[order], seq[order])
        tsb = ts[order].astype("<i8").tobytes()
        payload = table.column("payload").take(pa.array(order)).to_pylist()
        xkeys = _encode(exp, key, seq)
        limit = (int(at) ^ (1 << 63)).to_bytes(8, "big")

        expired: list[bytes] = []
        it = self.cf.iter()
        it.seek_to_first()
        while it.valid():
            k = it.key()
            if k[:8] > limit:
                break
            expired.append(k)
            it.next()
        del it

        cfh = self.db.get_column_family_handle(_CF)
        wb = rocksdict.WriteBatch(raw_mode=True)
        if expired:
            trip = _decode(expired)  # (exp, key, seq)
            for xk, pk in zip(expired, _encode(trip[:, 1], trip[:, 0], trip[:, 2])):
                wb.delete(pk)
                wb.delete(xk, cfh)
        for i, (k, p) in enumerate(zip(pkeys, payload)):
            wb.put(k, tsb[8 * i:8 * i + 8] + p)
        for k in xkeys:
            wb.put(k, b"", cfh)
        wo = rocksdict.WriteOptions()
        wo.sync = True
        self.db.write(wb, wo)
        return {"inserted": table.num_rows, "deleted": len(expired)}

    def _result(self, items: list[tuple[bytes, bytes]], at: int) -> ReadResult:
        if not items:
            return ReadResult(0, 0)
        trip = _decode([k for k, _ in items])  # (key, exp, seq)
        ts = np.frombuffer(b"".join(v[:8] for _, v in items), dtype="<i8")
        valid = (ts <= at) & (trip[:, 1] > at)
        return ReadResult(int(valid.sum()), int(trip[valid, 2].sum()))

    def probe(self, key: int, at: int) -> ReadResult:
        prefix = (int(key) ^ (1 << 63)).to_bytes(8, "big")
        items = []
        for k, v in self.db.items(from_key=prefix):
            if k[:8] != prefix:
                break
            items.append((k, v))
        return self._result(items, at)

    def scan(self, at: int) -> ReadResult:
        rows = seq = 0
        batch: list[tuple[bytes, bytes]] = []
        for item in self.db.items():
            batch.append(item)
            if len(batch) == 65536:
                r = self._result(batch, at)
                rows, seq, batch = rows + r.rows, seq + r.seq_sum, []
        r = self._result(batch, at)
        return ReadResult(rows + r.rows, seq + r.seq_sum)
