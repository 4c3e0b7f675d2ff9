"""The manifest: the archive's configuration, schema and current state, kept in LMDB.

Everything a reader needs to interpret the bucket files lives in the ``meta`` database and
changes only inside an update's write transaction, so the transaction commit is the single
point at which an update becomes visible (docs/format.md, "Commit protocol").
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import lmdb
import numpy as np
import pyarrow as pa

from .layout import Layout
from .schema import schema_from_bytes, schema_to_bytes
from .timemodel import TimeModel

FORMAT_VERSION = 1

META_DB = b"meta"
UPDATES_DB = b"updates"

FREE = np.dtype([("slot", "<u8"), ("txn", "<u8")])  # a free NoRebuild slot and the txn that freed it


@dataclass(frozen=True)
class ArchiveConfig:
    """What ``ebb init`` fixes for the life of an archive."""

    layout: str  # "doubly" | "wave"
    partitioning: str  # doubly: round-robin | chronological | random
    split: str  # wave: insertion | expiration
    G: int
    E: int
    n_wave: int
    mode: str  # "rebuild" | "norebuild"
    tau: int
    delta: int
    max_lifetime: int  # S, rounded up to a multiple of delta
    key_column: str = "key"
    ts_column: str = "ts"
    exp_column: str = "exp"
    accept_overlong: bool = False
    bucket_capacity: int | None = None  # NoRebuild slot size in bytes; None = size at first load
    seed: int = 0
    time_unit: str | None = None  # informational: what one chronon is

    @property
    def time(self) -> TimeModel:
        return TimeModel(self.tau, self.delta, self.max_lifetime)

    @property
    def layout_obj(self) -> Layout:
        return Layout(
            kind=self.layout, p=self.time.p, G=self.G, E=self.E, partitioning=self.partitioning,
            split=self.split, n_wave=self.n_wave, seed=self.seed,
        )

    @property
    def n(self) -> int:
        return self.layout_obj.n

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @staticmethod
    def from_json(data: bytes) -> "ArchiveConfig":
        return ArchiveConfig(**json.loads(data))


@dataclass
class SubIndexState:
    """Size and files of one sub-index in the committed state."""

    records: int = 0
    bytes: int = 0
    buckets: int = 0
    min_exp: int | None = None
    max_exp: int | None = None
    generation: int = 0  # Rebuild: the current file is I{i}-{generation}.rb (0 = no file yet)
    slots: int = 0  # NoRebuild: high-water mark of the slot file, in slots


@dataclass
class ArchiveState:
    """The mutable part of the manifest, rewritten by every update."""

    last_slot: int | None = None  # slot of the last update; None before the first load
    update_seq: int = 0  # number of committed updates
    bucket_capacity: int | None = None  # NoRebuild slot size, once known
    late_rows: int = 0
    subindices: list[SubIndexState] = field(default_factory=list)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @staticmethod
    def from_json(data: bytes) -> "ArchiveState":
        d = json.loads(data)
        d["subindices"] = [SubIndexState(**s) for s in d["subindices"]]
        return ArchiveState(**d)


def read_config(txn: lmdb.Transaction, meta) -> ArchiveConfig:
    return ArchiveConfig.from_json(txn.get(b"config", db=meta))


def read_state(txn: lmdb.Transaction, meta) -> ArchiveState:
    return ArchiveState.from_json(txn.get(b"state", db=meta))


def write_state(txn: lmdb.Transaction, meta, state: ArchiveState) -> None:
    txn.put(b"state", state.to_json(), db=meta)


def read_schema(txn: lmdb.Transaction, meta) -> pa.Schema | None:
    raw = txn.get(b"schema", db=meta)
    return schema_from_bytes(raw) if raw else None


def write_schema(txn: lmdb.Transaction, meta, schema: pa.Schema) -> None:
    txn.put(b"schema", schema_to_bytes(schema), db=meta)


def read_free(txn: lmdb.Transaction, meta, i: int) -> np.ndarray:
    raw = txn.get(b"free.%04d" % i, db=meta)
    return np.frombuffer(raw, dtype=FREE).copy() if raw else np.zeros(0, FREE)


def write_free(txn: lmdb.Transaction, meta, i: int, free: np.ndarray) -> None:
    txn.put(b"free.%04d" % i, np.ascontiguousarray(free, dtype=FREE).tobytes(), db=meta)


def read_garbage(txn: lmdb.Transaction, meta) -> list[list]:
    """Files replaced by committed updates, as [name, txn that replaced them]."""
    raw = txn.get(b"garbage", db=meta)
    return json.loads(raw) if raw else []


def write_garbage(txn: lmdb.Transaction, meta, garbage: list[list]) -> None:
    txn.put(b"garbage", json.dumps(garbage).encode(), db=meta)


def read_checkpoint(txn: lmdb.Transaction, meta, name: str) -> bytes | None:
    """A producer's progress record (e.g. the scheduler's), committed with its last update."""
    return txn.get(b"ext/" + name.encode(), db=meta)


def write_checkpoint(txn: lmdb.Transaction, meta, name: str, value: bytes) -> None:
    txn.put(b"ext/" + name.encode(), value, db=meta)


def append_update_record(txn: lmdb.Transaction, updates, seq: int, record: dict) -> None:
    txn.put(seq.to_bytes(8, "big"), json.dumps(record).encode(), db=updates)


def read_update_records(txn: lmdb.Transaction, updates, last: int | None = None) -> list[dict]:
    """The update log, oldest first (the last ``last`` records if given)."""
    cur = txn.cursor(updates)
    out = []
    if last is not None:
        if not cur.last():
            return []
        for _, v in cur.iterprev(keys=True, values=True):
            out.append(json.loads(v))
            if len(out) >= last:
                break
        return out[::-1]
    return [json.loads(v) for _, v in cur.iternext(keys=True, values=True)]
