"""ebb.indexer: producing windowed results and feeding them to the archive.

``scheduler`` is ``ebb run``: each tick's results computed with Spark (``landing``, ``events``,
``queries``, ``tick``) and loaded through storage's one write sequence, on the driver
(``Archive.load``) or by Spark tasks (``executor_load``); ``spark_writer`` loads a DataFrame
(``df.write.format("ebb")``) the same way. ``commands`` holds the ``run``, ``explain`` and
``demo`` subcommands; ``advisor`` is the layout advisor (``ebb advise``, ``layout = "auto"``).
``synthetic`` generates realistic expiring records (sensor readings whose lifetime is their
polling period) for the demo and for tests.
"""
