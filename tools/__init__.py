"""ebb.tools: command-line tools beside the archive itself.

``bench_cmd`` is ``ebb bench WORKLOAD``: it reproduces the experiments of Golab's thesis
(section 4.4) on ebb's wave and doubly partitioned layouts and compares ebb with SQLite, DuckDB,
LMDB, RocksDB and Parquet on the same records and schedule (see docs/benchmarks.md).
"""
