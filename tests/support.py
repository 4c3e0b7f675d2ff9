"""Test helpers: a brute-force oracle over a plain Python list, and archive builders."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter

import numpy as np
import pyarrow as pa

from ebb.storage.config import ArchiveConfig
from ebb.query.reader import ArchiveReader


def config(**kw) -> ArchiveConfig:
    base = dict(layout="doubly", partitioning="round-robin", split="insertion", G=2, E=2, n_wave=4,
                mode="rebuild", tau=16, delta=2, max_lifetime=16)
    base.update(kw)
    return ArchiveConfig(**base)


class Oracle:
    """docs/spec.md section 2 applied to a plain list of dict records."""

    def __init__(self, key="key", ts="ts", exp="exp"):
        self.records: list[dict] = []
        self.k, self.ts, self.exp = key, ts, exp

    def load(self, rows: list[dict], at: int) -> None:
        self.records = [r for r in self.records if r[self.exp] > at]
        self.records += [r for r in rows if r[self.exp] > at]

    def valid(self, t: int) -> list[dict]:
        return [r for r in self.records if r[self.ts] <= t < r[self.exp]]

    def probe(self, key, t: int) -> Counter:
        return rows_multiset([r for r in self.valid(t) if r[self.k] == key])

    def probe_range(self, lo, hi, t: int) -> Counter:
        return rows_multiset([r for r in self.valid(t) if lo <= r[self.k] <= hi])

    def scan(self, t: int) -> Counter:
        return rows_multiset(self.valid(t))


def rows_multiset(rows) -> Counter:
    if isinstance(rows, pa.Table):
        rows = rows.to_pylist()
    return Counter(tuple(sorted(r.items())) for r in rows)


def table_of(rows: list[dict], schema: pa.Schema) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=schema)


def random_rows(rng: np.random.Generator, n: int, ts_lo: int, ts_hi: int, max_life: int, keys: int, tag: str = "") -> list[dict]:
    ts = rng.integers(ts_lo, ts_hi + 1, n)
    life = rng.integers(1, max_life + 1, n)
    key = rng.integers(0, keys, n)
    return [{"key": int(k), "ts": int(t), "exp": int(t + l), "payload": f"{tag}{i}"} for i, (k, t, l) in enumerate(zip(key, ts, life))]


SCHEMA = pa.schema([("key", pa.int64()), ("ts", pa.int64()), ("exp", pa.int64()), ("payload", pa.string())])


def archive_answers(path_or_archive, t: int, probe_keys=(), ranges=()) -> dict:
    """Scan, probes and range probes of an archive at ``t``, as multisets."""
    with ArchiveReader(path_or_archive) as r:
        return {
            "scan": rows_multiset(r.scan_table(as_of=t)),
            "probes": {k: rows_multiset(r.probe(k, as_of=t)) for k in probe_keys},
            "ranges": {rg: rows_multiset(r.probe_range(rg[0], rg[1], as_of=t)) for rg in ranges},
        }


def ebb(*args, env=None, check=False) -> subprocess.CompletedProcess:
    """Runs the ebb CLI in a separate process."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "ebb.tools.cli", *map(str, args)], capture_output=True, text=True,
                          env=full_env, check=check)
