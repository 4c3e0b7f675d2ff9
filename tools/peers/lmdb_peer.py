"""LMDB peer: one B+-tree keyed by (key, exp, seq), plus a secondary B+-tree keyed by
(exp, key, seq) that finds expired records for deletion.

Keys are 24 bytes, big-endian with the sign bit flipped, so byte order is numeric order; the
primary value is ``ts`` (8 bytes) followed by the payload. Each update is one write transaction
(durable at commit: LMDB fsyncs). Deletion walks the secondary tree from its start while
exp <= T, deleting the same records from the primary. A probe is a range scan of the primary
over one key's prefix; a scan walks the whole primary tree. Keys and values are built and
parsed with numpy; the per-record calls are the binding's (``putmulti``, cursor iteration).
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa

from ..store import ReadResult, Store

_FLIP = np.uint64(1 << 63)
_KEY = np.dtype([("a", ">u8"), ("b", ">u8"), ("c", ">u8")])


def _encode(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> list[bytes]:
    """24-byte order-preserving keys for int64 triples."""
    arr = np.empty(a.size, dtype=_KEY)
    arr["a"] = a.astype(np.int64).view(np.uint64) ^ _FLIP
    arr["b"] = b.astype(np.int64).view(np.uint64) ^ _FLIP
    arr["c"] = c.astype(np.int64).view(np.uint64) ^ _FLIP
    buf = arr.tobytes()
    return [buf[i:i + 24] for i in range(0, len(buf), 24)]


def _decode(keys: list[bytes]) -> np.ndarray:
    """(m, 3) int64 array of the triples in ``keys``."""
    if not keys:
        return np.zeros((0, 3), dtype=np.int64)
    raw = np.frombuffer(b"".join(keys), dtype=">u8").reshape(-1, 3)
    return (raw.astype(np.uint64) ^ _FLIP).view(np.int64)


class LMDBStore(Store):
    name = "lmdb"

    def __init__(self, path, workload):
        super().__init__(path, workload)
        self.env = None

    def open(self) -> None:
        import lmdb

        self.env = lmdb.open(os.path.join(self.path, "lmdb"), map_size=1 << 40, max_dbs=2, subdir=True)
        self.primary = self.env.open_db(b"records")
        self.by_exp = self.env.open_db(b"by_exp")

    def create(self) -> None:
        self.open()

    def close(self) -> None:
        if self.env is not None:
            self.env.close()  # unmaps the file
            self.env = None

    def load(self, table: pa.Table, at: int) -> dict[str, int]:
        key, ts, exp, seq = (table.column(c).to_numpy() for c in ("key", "ts", "exp", "seq"))
        order = np.lexsort((seq, exp, key))
        pkeys = _encode(key[order], exp[order], seq[order])
        tsb = ts[order].astype("<i8").tobytes()
        payload = table.column("payload").take(pa.array(order)).to_pylist()
        values = [tsb[8 * i:8 * i + 8] + p for i, p in enumerate(payload)]
        xorder = np.lexsort((seq, key, exp))
        xkeys = _encode(exp[xorder], key[xorder], seq[xorder])
        limit = (int(at) ^ (1 << 63)).to_bytes(8, "big")
        deleted = 0
        with self.env.begin(write=True) as txn:
            cur = txn.cursor(db=self.by_exp)
            expired: list[bytes] = []
            if cur.first():
                while True:
                    k = cur.key()
                    if not k or k[:8] > limit:  # past the last record with exp <= at
                        break
                    expired.append(k)
                    cur.delete()  # moves to the next record
            if expired:
                trip = _decode(expired)  # (exp, key, seq)
                for k in _encode(trip[:, 1], trip[:, 0], trip[:, 2]):
                    txn.delete(k, db=self.primary)
                deleted = len(expired)
            txn.cursor(db=self.primary).putmulti(zip(pkeys, values))
            txn.cursor(db=self.by_exp).putmulti(((k, b"") for k in xkeys))
        return {"inserted": table.num_rows, "deleted": deleted}

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
        with self.env.begin(buffers=False) as txn:
            cur = txn.cursor(db=self.primary)
            if cur.set_range(prefix):
                for k, v in cur:
                    if k[:8] != prefix:
                        break
                    items.append((k, v))
        return self._result(items, at)

    def scan(self, at: int) -> ReadResult:
        rows = seq = 0
        with self.env.begin(buffers=False) as txn:
            cur = txn.cursor(db=self.primary)
            batch: list[tuple[bytes, bytes]] = []
            for item in cur.iternext():
                batch.append(item)
                if len(batch) == 65536:
                    r = self._result(batch, at)
                    rows, seq, batch = rows + r.rows, seq + r.seq_sum, []
            r = self._result(batch, at)
        return ReadResult(rows + r.rows, seq + r.seq_sum)
