"""The Spark session the indexer runs in: local[*] unless told otherwise, Arrow enabled."""

from __future__ import annotations

import os


def session(master: str | None = None, conf: dict[str, str] | None = None, app: str = "ebb"):
    """Creates (or returns) the SparkSession. ``master`` and ``conf`` pass through, so the same
    job runs on a cluster (``--master spark://host:7077 --conf spark.executor.memory=4g``)."""
    from pyspark.sql import SparkSession

    local = master is None or master.startswith("local")
    if local:
        # a local driver needs no network beyond loopback
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    b = SparkSession.builder.appName(app).master(master or "local[*]")
    defaults = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.shuffle.partitions": "8",
        "spark.sql.adaptive.enabled": "true",
    }
    if local:
        defaults["spark.driver.bindAddress"] = "127.0.0.1"
        defaults["spark.driver.host"] = "127.0.0.1"
    for k, v in {**defaults, **(conf or {})}.items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
