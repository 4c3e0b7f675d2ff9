"""ebb.query: reading the archive (probes and scans that never return expired data).

``reader`` is the Python API; ``flight_server``, ``flight_client`` and ``flight_protocol`` serve
it over Arrow Flight; ``spark_source`` is the ``ebb`` Spark data source; ``output`` writes results
as tables, JSON lines, CSV or Parquet. The ``ebb`` subcommands of this layer live here too, each
module registering its own arguments (``archive_cmds``: init, load; ``read_cmds``: probe, scan,
stats, plan; ``admin_cmds``: verify, migrate; ``serve_cmd``: serve, health; ``sql_cmd``: sql);
the ``ebb`` entry point that gathers them is ``ebb.tools.cli``.
"""
