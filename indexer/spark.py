"""The Spark session the indexer runs in: local[*] unless told otherwise, Arrow enabled.

Quiet by default: the JVM that PySpark launches inherits this process's stdout and stderr, and
prints its start-up warnings and log4j lines there. Unless ``verbose``, both are pointed at a
temporary file while the JVM starts (it keeps them), so a user sees ebb's lines only; the file
is read back for the message if Spark fails to start. PySpark's own loggers of analysis errors
are switched off too: ebb reports those errors as one line.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from typing import Iterator

from ..storage.errors import EbbError

JAVA_NEEDED = "Spark needs Java 17 or newer"


class SparkUnavailable(EbbError):
    """Spark (its JVM) could not start (exit code 1)."""


def _java_problem() -> str | None:
    """Why no JVM can start, if that can be told without starting one."""
    home = os.environ.get("JAVA_HOME")
    if home:
        if not os.access(os.path.join(home, "bin", "java"), os.X_OK):
            return f"{JAVA_NEEDED}, and JAVA_HOME={home} has no bin/java; point JAVA_HOME at a Java 17 installation"
        return None
    if shutil.which("java") is None:
        return (f"{JAVA_NEEDED}, and there is no `java` on PATH (and JAVA_HOME is not set); install Java 17 "
                "(e.g. apt-get install openjdk-17-jre-headless) or set JAVA_HOME")
    return None


@contextmanager
def _jvm_output_to(log) -> Iterator[None]:
    """Points file descriptors 1 and 2 at ``log`` for processes started meanwhile."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)


def _last_lines(log, n: int = 3) -> str:
    log.flush()
    log.seek(0)
    lines = [x.strip() for x in log.read().decode(errors="replace").splitlines() if x.strip()]
    return " | ".join(lines[-n:])


def session(master: str | None = None, conf: dict[str, str] | None = None, app: str = "ebb", verbose: bool = False):
    """Creates (or returns) the SparkSession. ``master`` and ``conf`` pass through, so the same
    job runs on a cluster (``--master spark://host:7077 --conf spark.executor.memory=4g``).
    Raises ``SparkUnavailable`` (one line, saying what is needed) if the JVM cannot start."""
    from pyspark.sql import SparkSession

    problem = _java_problem()
    if problem:
        raise SparkUnavailable(problem)
    local = master is None or master.startswith("local")
    if local:
        # a local driver needs no network beyond loopback
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        # local workers run this interpreter (PySpark's default is `python3` on PATH, which may be
        # another environment's, without ebb: a venv's ebb run by its full path)
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    b = SparkSession.builder.appName(app).master(master or "local[*]")
    defaults = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.shuffle.partitions": "8",
        "spark.sql.adaptive.enabled": "true",
        # Parquet nanosecond timestamps (pandas' default) as bigint, which events.read turns into
        # timestamps; without it Spark refuses the file (PARQUET_TYPE_ILLEGAL)
        "spark.sql.legacy.parquet.nanosAsLong": "true",
    }
    if local:
        defaults["spark.driver.bindAddress"] = "127.0.0.1"
        defaults["spark.driver.host"] = "127.0.0.1"
    for k, v in {**defaults, **(conf or {})}.items():
        b = b.config(k, v)
    if verbose:
        spark = b.getOrCreate()
        spark.sparkContext.setLogLevel("WARN")
        return spark
    with tempfile.TemporaryFile(prefix="ebb-spark-", suffix=".log") as log:
        try:
            with _jvm_output_to(log):
                spark = b.getOrCreate()
        except Exception as e:
            detail = _last_lines(log) or " ".join(str(e).split())[:300]
            raise SparkUnavailable(f"Spark did not start ({JAVA_NEEDED}; run with --verbose to see its output): "
                                   f"{detail}") from e
    spark.sparkContext.setLogLevel("ERROR")
    # PySpark also logs every analysis error it raises, as JSON on stderr; ebb reports them itself
    from pyspark.logger import PySparkLogger

    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        PySparkLogger.getLogger(name).disabled = True
    return spark


def arrow_schema(struct):  # -> pyarrow.Schema (imported lazily, as pyspark is)
    """The Arrow schema of a Spark ``StructType``, timestamps in UTC, on every PySpark ebb allows:
    4.1 takes ``timestamp_utc`` (UTC by default), later releases ``timezone`` (none by default)."""
    import inspect

    from pyspark.sql.pandas.types import to_arrow_schema

    if "timezone" in inspect.signature(to_arrow_schema).parameters:
        return to_arrow_schema(struct, timezone="UTC")
    return to_arrow_schema(struct, timestamp_utc=True)
