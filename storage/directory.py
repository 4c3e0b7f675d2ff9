"""A sub-index's directory: an LMDB B+-tree from search key to the key's buckets.

The value of a key is a packed array of bucket descriptors (``DESC``), 40 bytes each: the
bucket's byte offset in the sub-index's file, its size, record count, CRC-32 of its bytes and
its smallest and largest ``exp``. Rebuild keeps one bucket per key; NoRebuild one or more.
"""

from __future__ import annotations

from dataclasses import dataclass

import lmdb
import numpy as np

DESC = np.dtype(
    [("loc", "<u8"), ("nbytes", "<u8"), ("count", "<u4"), ("crc", "<u4"), ("min_exp", "<i8"), ("max_exp", "<i8")]
)


@dataclass
class Entries:
    """Directory entries as arrays: ``keys`` sorted, and per bucket its key's index."""

    keys: list[bytes]
    bucket_key: np.ndarray  # int64 index into keys, one per bucket
    descs: np.ndarray  # DESC, one per bucket, grouped by key in key order

    @staticmethod
    def empty() -> "Entries":
        return Entries([], np.zeros(0, np.int64), np.zeros(0, DESC))

    def per_key_counts(self) -> np.ndarray:
        return np.bincount(self.bucket_key, minlength=len(self.keys)).astype(np.int64)


def _entries(keys: list[bytes], values: list[bytes]) -> Entries:
    if not keys:
        return Entries.empty()
    nb = np.fromiter(map(len, values), dtype=np.int64, count=len(values)) // DESC.itemsize
    descs = np.frombuffer(b"".join(values), dtype=DESC).copy()
    return Entries(keys, np.repeat(np.arange(len(keys), dtype=np.int64), nb), descs)


def load_all(txn: lmdb.Transaction, db) -> Entries:
    """Every entry of the directory, in key order."""
    items = list(txn.cursor(db).iternext(keys=True, values=True))
    return _entries([k for k, _ in items], [v for _, v in items])


def load_keys(txn: lmdb.Transaction, db, keys: list[bytes]) -> Entries:
    """The entries of ``keys`` (sorted, distinct) that exist."""
    items = txn.cursor(db).getmulti(keys)
    return _entries([k for k, _ in items], [v for _, v in items])


def load_range(txn: lmdb.Transaction, db, lo: bytes, hi: bytes) -> Entries:
    """The entries with lo <= key <= hi."""
    cur = txn.cursor(db)
    keys, values = [], []
    if cur.set_range(lo):
        for k, v in cur.iternext(keys=True, values=True):
            if k > hi:
                break
            keys.append(k)
            values.append(v)
    return _entries(keys, values)


def replace_all(txn: lmdb.Transaction, db, keys: list[bytes], bucket_key: np.ndarray, descs: np.ndarray) -> None:
    """Replaces the whole directory (Rebuild). ``keys`` sorted; one or more buckets per key."""
    txn.drop(db, delete=False)
    if keys:
        txn.cursor(db).putmulti(zip(keys, _values(len(keys), bucket_key, descs)), append=True)


def put_keys(txn: lmdb.Transaction, db, keys: list[bytes], bucket_key: np.ndarray, descs: np.ndarray) -> None:
    """Sets the bucket lists of ``keys`` (sorted, distinct); a key with no bucket is deleted."""
    counts = np.bincount(bucket_key, minlength=len(keys))
    vals = _values(len(keys), bucket_key, descs)
    live = [(k, v) for k, v, c in zip(keys, vals, counts.tolist()) if c]
    dead = [k for k, c in zip(keys, counts.tolist()) if not c]
    cur = txn.cursor(db)
    if live:
        cur.putmulti(live)
    for k in dead:
        cur.delete(k) if cur.set_key(k) else None


def _values(nkeys: int, bucket_key: np.ndarray, descs: np.ndarray) -> list[bytes]:
    """Packed descriptor arrays per key (buckets must be grouped by key in key order)."""
    if descs.size == 0:
        return [b""] * nkeys
    counts = np.bincount(bucket_key, minlength=nkeys)
    blob = descs.tobytes()
    if (counts == 1).all():
        return descs.view(f"V{DESC.itemsize}").tolist()
    ends = (np.cumsum(counts) * DESC.itemsize).tolist()
    starts = [0] + ends[:-1]
    return [blob[s:e] for s, e in zip(starts, ends)]
