"""The Spark data source: a DataFrame over an archive holds exactly a library scan's rows (and the
oracle's), is split into one partition per read task of storage's plan (here one per non-empty
sub-index), and a key filter is answered by probes that read only the probed keys' blocks: shown
by the ReadStats each partition writes to ``metrics_dir`` (which sub-index, blocks and bytes)."""

from __future__ import annotations

import glob
import json
from collections import Counter
import os
import sys

import numpy as np
import pytest
from pyspark.errors import AnalysisException

from ebb.query.reader import ArchiveReader
from ebb.query.spark_source import EbbDataSource, _refuse_overwrite
from ebb.storage.archive import Archive, open_readonly
from ebb.storage.errors import ReadError, UsageError

from support import SCHEMA, Oracle, config, random_rows, rows_multiset, table_of

RARE = 10_000  # a key loaded once, so it lives in exactly one sub-index


@pytest.fixture(scope="module")
def session():
    """A local[2] session for this module (or the one a previous module left running: a JVM
    holds one SparkContext, so only a session this fixture created is stopped here)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    from ebb.query.spark_source import register

    existed = SparkContext._active_spark_context is not None
    s = (SparkSession.builder.master("local[2]").appName("ebb-spark-source-test")
         .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    s.sparkContext.setLogLevel("ERROR")
    register(s)
    yield s
    if not existed:
        s.stop()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A 2x3 round-robin Rebuild archive (6 sub-indices) after a bulk load and 4 updates."""
    path = str(tmp_path_factory.mktemp("spark") / "arc")
    rng = np.random.default_rng(23)
    oracle = Oracle()
    with Archive.create(path, config(G=2, E=3, max_lifetime=18, block_bytes=1024)) as arc:
        rows = random_rows(rng, 3000, 1, 16, 18, 200, "b")
        arc.load(table_of(rows, SCHEMA), 16)
        oracle.load(rows, 16)
        for T in (18, 20, 22, 24):
            rows = random_rows(rng, 600, T - 1, T, 18, 200, f"u{T}-")
            if T == 20:
                rows.append({"key": RARE, "ts": 20, "exp": 27, "payload": "rare"})
            arc.load(table_of(rows, SCHEMA), T)
            oracle.load(rows, T)
    return path, oracle, 24


def _df(session, path, **opts):
    r = session.read.format("ebb")
    for k, v in opts.items():
        r = r.option(k, str(v))
    return r.load(path)


def _rows(df) -> Counter:
    return rows_multiset([r.asDict() for r in df.collect()])


def _metrics(d) -> list[dict]:
    return [json.load(open(f)) for f in sorted(glob.glob(os.path.join(str(d), "*.json")))]


@pytest.fixture(scope="module")
def full_scan(session, built, tmp_path_factory):
    """One DataFrame scan with metrics: its rows, partition count and per-partition ReadStats."""
    d = tmp_path_factory.mktemp("scan-metrics")
    df = _df(session, built[0], metrics_dir=d)
    return _rows(df), df.rdd.getNumPartitions(), _metrics(d), df.schema


def test_dataframe_equals_a_library_scan_and_is_split_by_subindex(built, full_scan):
    path, oracle, last = built
    rows, partitions, m, schema = full_scan
    with ArchiveReader(path) as lib:
        lib_rows = rows_multiset(lib.scan_table())
        assert [f.name for f in schema.fields] == lib.result_schema().names
        nonempty = sum(1 for s in lib.archive.state().subindices if s.records)
    assert nonempty == 6
    assert partitions == nonempty > 1
    assert rows == lib_rows == oracle.scan(last)
    assert sorted(x["subindex"] for x in m) == [1, 2, 3, 4, 5, 6]  # each partition read its own sub-index
    assert all(x["subindices_read"] == [x["subindex"]] and x["kind"] == "scan" and x["update_seq"] == 5 for x in m)
    assert sum(x["rows"] for x in m) == sum(oracle.scan(last).values())


def test_bad_options_and_an_empty_archive_are_ebb_errors(tmp_path):
    """What the source refuses is an ebb error (Spark passes it on with its class and message)."""
    with pytest.raises(UsageError, match="needs a path"):
        EbbDataSource({})
    with pytest.raises(UsageError, match="option as_of must be an integer number of chronons, got 'soon'"):
        EbbDataSource({"path": str(tmp_path), "as_of": "soon"})
    for bad in ("0", "-1", "nan", "a minute"):
        with pytest.raises(UsageError, match=f"option lease_seconds must be a positive number of seconds, got '{bad}'"):
            EbbDataSource({"path": str(tmp_path), "lease_seconds": bad})
    assert EbbDataSource({"path": str(tmp_path), "lease_seconds": "2.5"}).lease_seconds == 2.5
    with pytest.raises(UsageError, match="only appends updates"):
        _refuse_overwrite(True)
    Archive.create(str(tmp_path / "empty"), config()).close()
    with pytest.raises(ReadError, match="is empty: nothing has been loaded, so it has no schema yet"):
        EbbDataSource({"path": str(tmp_path / "empty")}).schema()


def test_as_of_option(session, built):
    path, oracle, last = built
    for t in (last + 1, last + 7):
        assert _rows(_df(session, path, as_of=t)) == oracle.scan(t)
    with pytest.raises(AnalysisException, match=r"ReadError: as_of \d+ is before \d+, the oldest instant this archive can still read"):
        _df(session, path, as_of=last - 2).collect()


def test_key_equality_reads_only_the_probed_blocks(session, built, full_scan, tmp_path):
    path, oracle, last = built
    from pyspark.sql.functions import col

    probe_dir = tmp_path / "probe"
    scan_m = full_scan[2]

    df = _df(session, path, metrics_dir=probe_dir).filter(col("key") == RARE)
    assert df.rdd.getNumPartitions() == 1  # only the one sub-index whose block directory holds the key
    assert _rows(df) == oracle.probe(RARE, last) and sum(oracle.probe(RARE, last).values()) == 1
    m = _metrics(probe_dir)
    assert len(m) == 1 and m[0]["kind"] == "probe"
    with ArchiveReader(path) as lib:
        lib.probe(RARE)
        assert m[0]["blocks_read"] == lib.io.blocks_read == 1
        assert m[0]["bytes_read"] == lib.io.bytes_read
    assert m[0]["subindices_read"] == [m[0]["subindex"]]
    assert sum(x["blocks_read"] for x in scan_m) > 100 * m[0]["blocks_read"]
    assert sum(x["bytes_read"] for x in scan_m) > 100 * m[0]["bytes_read"]


def test_in_and_range_filters_are_probes(session, built, tmp_path):
    path, oracle, last = built
    from pyspark.sql.functions import col

    keys = [3, 50, 199, RARE, 123456]
    df = _df(session, path, metrics_dir=tmp_path / "in").filter(col("key").isin(keys))
    expected = sum((oracle.probe(k, last) for k in keys), start=Counter())
    assert _rows(df) == expected
    with ArchiveReader(path) as lib:
        for k in keys:
            lib.probe(k)
        assert sum(x["blocks_read"] for x in _metrics(tmp_path / "in")) == lib.io.blocks_read

    # an IN list of many keys: one task a run, each run's blocks searched by the native batch probe
    many = list(range(0, 200, 2)) + [123456]
    df = _df(session, path, metrics_dir=tmp_path / "many").filter(col("key").isin(many))
    assert _rows(df) == sum((oracle.probe(k, last) for k in many), start=Counter())
    with open_readonly(path) as arc, arc.snapshot() as snap:
        runs = sum(len(sub.runs) for sub in snap.state.subindices)
    assert len(_metrics(tmp_path / "many")) <= runs

    t = last + 2
    df = _df(session, path, metrics_dir=tmp_path / "rng", as_of=t).filter((col("key") > 20) & (col("key") <= 35))
    assert _rows(df) == oracle.probe_range(21, 35, t)
    m = _metrics(tmp_path / "rng")
    assert all(x["kind"] == "probe_range" for x in m)
    with ArchiveReader(path) as lib:
        lib.probe_range(21, 35, t)
        assert sum(x["blocks_read"] for x in m) == lib.io.blocks_read
        assert sum(x["bytes_read"] for x in m) == lib.io.bytes_read
        full = ArchiveReader(path)
        full.scan_table(t)
        assert lib.io.blocks_read * 5 < full.io.blocks_read  # 15 of 200 keys
        full.close()

    # a filter on another column is left to Spark and still correct
    df = _df(session, path, as_of=t).filter((col("key") >= 190) & (col("exp") > t + 5))
    want = rows_multiset([r for r in oracle.valid(t) if r["key"] >= 190 and r["exp"] > t + 5])
    assert _rows(df) == want
    # contradictory filters: nothing to read at all
    assert _df(session, path).filter((col("key") == 3) & (col("key") == 4)).count() == 0


def _update(path, rng, T) -> list[dict]:
    rows = random_rows(rng, 400, T - 1, T, 18, 200, f"late{T}-")
    with Archive(path) as arc:
        arc.load(table_of(rows, SCHEMA), T)
    return rows


def test_a_dataframe_reads_its_planned_version_across_updates(session, built, tmp_path):
    """A DataFrame is one committed version: its plan's lease keeps that version's blocks while
    5 Rebuild updates replace every run it reads, and collecting it again returns exactly the
    planned version's rows; a new DataFrame reads the new version."""
    import shutil

    path, oracle, last = built
    copy = str(tmp_path / "copy")
    shutil.copytree(path, copy)
    df = _df(session, copy)
    assert _rows(df) == oracle.scan(last)  # planned (and leased) on update 5
    later = Oracle()
    later.records = list(oracle.records)
    rng = np.random.default_rng(5)
    for T in range(26, 36, 2):
        later.load(_update(copy, rng, T), T)
    assert _rows(df) == oracle.scan(last)
    assert _rows(_df(session, copy)) == later.scan(34)


def test_an_action_running_while_updates_commit_returns_its_planned_version(session, built, tmp_path):
    """Updates commit while the tasks of one action are still reading (each task sleeps): the
    action neither fails nor mixes versions; it returns exactly the rows of the version it was
    planned on, whichever that was."""
    import shutil
    import threading

    path, oracle, last = built
    copy, metrics = str(tmp_path / "copy"), tmp_path / "m"
    shutil.copytree(path, copy)
    versions = {5: oracle.scan(last)}
    state = Oracle()
    state.records = list(oracle.records)

    def slowly(batches):  # each task waits before it reads: the action spans the updates
        import time

        time.sleep(1.5)
        yield from batches

    df = _df(session, copy, metrics_dir=metrics).mapInArrow(slowly, _df(session, copy).schema)
    got = {}
    action = threading.Thread(target=lambda: got.setdefault("rows", _rows(df)))
    action.start()
    rng = np.random.default_rng(9)
    for _ in range(200):  # until the first task has read: the action is planned and under way
        if _metrics(metrics) or not action.is_alive():
            break
        action.join(0.05)
    for seq, T in enumerate(range(26, 36, 2), start=6):
        state.load(_update(copy, rng, T), T)
        versions[seq] = state.scan(T)
    assert action.is_alive()  # the updates committed while the action was reading
    action.join(120)
    planned = {m["update_seq"] for m in _metrics(metrics)}
    assert len(planned) == 1
    assert got["rows"] == versions[planned.pop()]
