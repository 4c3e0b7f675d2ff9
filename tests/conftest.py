"""Shared fixtures: one local Spark session for the whole test run (starting one costs ~10 s).

Every test that uses it is marked ``spark``: ``pytest -m "not spark"`` runs the rest (CI's run
with the native point probe off does, as the Spark jobs do not probe through it)."""

from __future__ import annotations

import pytest


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
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.spark)
