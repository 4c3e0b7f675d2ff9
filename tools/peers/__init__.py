"""The stores a user would otherwise pick for expiring records, driven through the same schedule
as ebb (``tools.store.Store``): SQLite, DuckDB, LMDB, RocksDB (rocksdict) and a Parquet dataset
partitioned by expiration slot. Each module imports its library only when the store is built."""

from __future__ import annotations

from ..store import Store
from ..workloads import Workload


def make_peer(name: str, path: str, workload: Workload) -> Store:
    """The peer store called ``name`` rooted at ``path``."""
    if workload.payload_columns != 1:
        raise ValueError(f"the peers store one payload column; workload {workload.name} splits it "
                         f"over {workload.payload_columns} (run it with --no-peers)")
    if name == "sqlite":
        from .sqlite_peer import SQLiteStore as cls
    elif name == "duckdb":
        from .duckdb_peer import DuckDBStore as cls
    elif name == "lmdb":
        from .lmdb_peer import LMDBStore as cls
    elif name == "rocksdb":
        from .rocksdb_peer import RocksDBStore as cls
    elif name == "parquet":
        from .parquet_peer import ParquetStore as cls
    else:
        raise ValueError(f"unknown peer {name!r}")
    return cls(path, workload)
