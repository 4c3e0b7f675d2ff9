"""Shared fixtures: one local Spark session for the whole test run (starting one costs ~10 s), one a
test process when the run is spread over several (the README's ``-n 2``, pytest-xdist).

Every test that uses it is marked ``spark``: ``pytest -m "not spark"`` runs the rest (CI's run
of the tests of reads with the native point probe off does, as Spark jobs do not probe through it).

Tests marked ``system`` kill ``ebb run`` or a Spark driver at chosen or random moments and start
it again, a new JVM each time (about 6 minutes together): they run when EBB_SYSTEM_TESTS=1 is set
(CI sets it in a step of its own, after the README's test command)."""

from __future__ import annotations

import os

import pytest

# Every Spark driver the tests start (their session, and each `ebb run` or `ebb explain` they start
# as a process) lives seconds on a few hundred rows, and the optimising JIT compiler's work never
# pays back: the quick compiler alone and the serial collector take a driver's start and first
# query from about 35 to 19 CPU seconds. The suite runs two at once on two cores, so that is its
# bound. Users' drivers are untouched (CI's soak runs outside pytest); SPARK_SUBMIT_OPTS is read
# by spark-submit, which PySpark starts the driver with.
os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")


@pytest.fixture(scope="session")
def spark():
    from ebb.indexer.spark import session

    s = session("local[2]", {"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"})
    yield s
    s.stop()


@pytest.fixture(autouse=True)
def no_user_calibration(tmp_path_factory, monkeypatch):
    """`layout = "auto"` follows the layout advisor once a calibration exists in the user's config
    directory (indexer/advisor/auto.py); tests see none unless they write one."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("config")))


def pytest_collection_modifyitems(items) -> None:
    skip_system = pytest.mark.skip(reason="set EBB_SYSTEM_TESTS=1 to kill and restart whole processes")
    for item in items:
        if item.get_closest_marker("system") is not None and os.environ.get("EBB_SYSTEM_TESTS") != "1":
            item.add_marker(skip_system)
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.spark)
