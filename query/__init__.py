"""ebb.query: reading the archive (probes and scans that never return expired data).

``reader`` is the Python API; ``output`` writes results as tables, JSON lines, CSV or Parquet;
``cli`` is the ``ebb`` command, a thin layer over the storage and query libraries.
"""
