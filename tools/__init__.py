"""ebb.tools: the ``ebb`` command and the benchmarks.

``cli`` is the ``ebb`` entry point (the console script ``ebb = ebb.tools.cli:main``): it builds
the parser from every layer's command modules, runs the command chosen and maps errors to exit
codes. ``bench_cmd`` is ``ebb bench WORKLOAD``: it reproduces the experiments of Golab's thesis
(section 4.4) on ebb's wave and doubly partitioned layouts and compares ebb with SQLite, DuckDB,
LMDB, RocksDB and Parquet on the same records and schedule (see docs/benchmarks.md); ``ebb bench
soak`` is ``soak``. ``library_bench`` (``python -m ebb.tools.library_bench``) compares the same
stores at the library level, every figure from plain timed calls of each store's public API.
``scaleout`` and ``migration_bench`` are ``ebb bench-scaleout`` and ``ebb bench-migration``.
"""
