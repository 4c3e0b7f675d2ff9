"""Spark writes into an archive (``df.write.format("ebb")``, ``df.writeStream.format("ebb")``):
after every write the archive answers as the oracle does; a write repeated at the same ``at``,
an overwrite and a DataFrame failing validation are refused with the archive unchanged; a task
that fails and is retried adds its rows once; a Spark driver killed (SIGKILL, with its JVM and
Python workers) at random moments of a sequence of writes leaves the archive as it was before or
after the write under way, and ``ebb verify`` passes; a restarted streaming query that runs a
committed micro-batch again loads it once.

Run as a script, this file is the child process of the kill test."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pyarrow.parquet as pq
import pytest
from pyspark.errors import AnalysisException, PythonException

from ebb.storage.archive import Archive
from ebb.storage.errors import ArchiveError

from support import SCHEMA, Oracle, archive_answers, config, ebb, random_rows, table_of

TAU, DELTA = 16, 2
KEYS = 60
PROBES, RANGES = tuple(range(0, KEYS, 7)), ((5, 20), (40, 80))
SPARK_SCHEMA = "key long, ts long, exp long, payload string"


def rows_at(T: int) -> list[dict]:
    """The results of the update at T (deterministic, so a child process and the test agree)."""
    return random_rows(np.random.default_rng(T), 400, 1 if T == TAU else T - DELTA + 1, T, 16, KEYS, f"u{T}-")


def frame(spark, rows: list[dict], partitions: int = 3):
    return spark.createDataFrame(table_of(rows, SCHEMA)).repartition(partitions)


def write(df, path, at: int, mode: str = "append") -> None:
    df.write.format("ebb").option("at", at).mode(mode).save(str(path))


def oracle_until(last: int) -> Oracle:
    o = Oracle()
    for T in range(TAU, last + 1, DELTA):
        o.load(rows_at(T), T)
    return o


def assert_answers(path, oracle: Oracle, t: int) -> None:
    got = archive_answers(str(path), t, PROBES, RANGES)
    assert got["scan"] == oracle.scan(t)
    assert got["probes"] == {k: oracle.probe(k, t) for k in PROBES}
    assert got["ranges"] == {r: oracle.probe_range(*r, t) for r in RANGES}


def last_update(path) -> int | None:
    with Archive(str(path)) as arc:
        state, tm = arc.state(), arc.config.time
    return None if state.last_slot is None else tm.time_of(state.last_slot)


def update_seq(path) -> int:
    with Archive(str(path)) as arc:
        return arc.state().update_seq


def verify_clean(path) -> None:
    """``ebb verify`` passes and finds no file left by a write."""
    v = ebb("verify", path)
    assert v.returncode == 0, v.stdout + v.stderr
    assert "left by" not in v.stdout, v.stdout


@pytest.fixture(scope="module")
def session(spark):
    from ebb.query.spark_source import register

    register(spark)
    return spark


@pytest.mark.parametrize("mode", ["norebuild", "rebuild"])
def test_every_write_of_a_sequence_gives_the_oracle_answers(session, tmp_path, mode):
    path = tmp_path / "arc"
    Archive.create(str(path), config(mode=mode)).close()
    oracle = Oracle()
    for T in range(TAU, TAU + 6 * DELTA, DELTA):
        rows = rows_at(T)
        write(frame(session, rows, 1 + T % 3), path, T)
        oracle.load(rows, T)
        assert_answers(path, oracle, T)
        assert_answers(path, oracle, T + 1)
    assert update_seq(path) == 6
    assert [f for f in os.listdir(path / "data") if not f.endswith(".run")] == []  # nothing staged is left
    verify_clean(path)
    df = session.read.format("ebb").load(str(path))  # and Spark reads back what it wrote
    assert df.count() == sum(oracle.scan(T).values())


def test_a_write_repeated_at_the_same_at_loads_nothing_twice(session, tmp_path):
    path = tmp_path / "arc"
    Archive.create(str(path), config(mode="norebuild")).close()
    for T in (TAU, TAU + DELTA):
        write(frame(session, rows_at(T)), path, T)
    for T in (TAU + DELTA, TAU):  # the job retried, and an older one
        with pytest.raises(AnalysisException, match=f"RejectedBatch: update time {T} is not after the last update at {TAU + DELTA}"):
            write(frame(session, rows_at(T)), path, T)
    assert update_seq(path) == 2
    assert_answers(path, oracle_until(TAU + DELTA), TAU + DELTA)
    verify_clean(path)


def test_overwrite_and_a_missing_archive_are_refused(session, tmp_path):
    path = tmp_path / "arc"
    Archive.create(str(path), config()).close()
    write(frame(session, rows_at(TAU)), path, TAU)
    with pytest.raises(AnalysisException, match=r"UsageError: an ebb archive only appends updates: write with mode\('append'\)"):
        write(frame(session, rows_at(TAU + DELTA)), path, TAU + DELTA, mode="overwrite")
    with pytest.raises(AnalysisException, match="option at .* is required"):
        frame(session, rows_at(TAU + DELTA)).write.format("ebb").mode("append").save(str(path))
    with pytest.raises(AnalysisException, match="ArchiveError: .* is not an ebb archive .*create one with `ebb init`"):
        write(frame(session, rows_at(TAU)), tmp_path / "none", TAU)
    assert update_seq(path) == 1
    assert_answers(path, oracle_until(TAU), TAU)


@pytest.mark.parametrize("mode", ["norebuild", "rebuild"])
def test_a_dataframe_failing_validation_leaves_the_archive_unchanged(session, tmp_path, mode):
    path = tmp_path / "arc"
    Archive.create(str(path), config(mode=mode)).close()
    write(frame(session, rows_at(TAU)), path, TAU)
    T = TAU + DELTA
    bad = rows_at(T) + [{"key": 1, "ts": T - 1, "exp": T - 1, "payload": "empty"}]
    rejected = r"EBB-ERROR RejectedBatch: batch rejected, nothing was loaded: 1 rows have exp <= ts"
    with pytest.raises(PythonException, match=rejected):
        write(frame(session, bad, 3), path, T)
    no_exp = frame(session, rows_at(T)).drop("exp")
    with pytest.raises(AnalysisException, match="SchemaError: schema does not match the archive's: column 'exp'"):
        write(no_exp, path, T)
    assert update_seq(path) == 1
    assert_answers(path, oracle_until(TAU), TAU)
    v = ebb("verify", path)  # a task that was still writing when the job failed may leave a file
    assert v.returncode == 0, v.stdout
    write(frame(session, rows_at(T)), path, T)  # the next good write commits, and its recovery cleans up
    assert_answers(path, oracle_until(T), T)
    verify_clean(path)


@pytest.mark.parametrize("mode", ["norebuild", "rebuild"])
def test_a_commit_refuses_if_the_archive_moved_or_a_file_its_tasks_wrote_is_gone(tmp_path, mode):
    """The write's steps called in this process, another writer acting between tasks and commit."""
    from pyspark.sql.pandas.types import from_arrow_schema

    from ebb.indexer import spark_writer

    path = str(tmp_path / "arc")
    struct = from_arrow_schema(SCHEMA)

    def tasks(T: int):
        pu = spark_writer.plan(path, struct, T)
        return pu, [spark_writer.write_task(pu, iter(table_of(rows_at(T), SCHEMA).to_batches()))]

    with Archive.create(path, config(mode=mode)) as arc:
        arc.load(table_of(rows_at(TAU), SCHEMA), TAU)
        data = arc.data_dir
    T = TAU + DELTA
    pu, out = tasks(T)
    with Archive(path) as arc:  # another writer loads the update meanwhile
        arc.load(table_of(rows_at(T), SCHEMA), T)
    with pytest.raises(ArchiveError, match=r"the archive changed \(update 2 committed\) while this write ran"):
        spark_writer.commit(path, pu, out)
    pu, out = tasks(T + DELTA)
    os.remove(os.path.join(data, out[0].staged or out[0].results[0].run_name))  # as another writer's recovery would
    with pytest.raises(ArchiveError, match="files this write's tasks wrote were removed"):
        spark_writer.commit(path, pu, out)
    assert update_seq(path) == 2
    assert_answers(path, oracle_until(T), T)
    spark_writer.commit(path, *tasks(T + DELTA))
    assert_answers(path, oracle_until(T + DELTA), T + DELTA)
    verify_clean(path)


@pytest.mark.system
def test_a_killed_driver_leaves_each_write_undone_or_done_and_a_retried_task_adds_rows_once(tmp_path):
    path, marks = tmp_path / "arc", tmp_path / "marks"
    marks.mkdir()
    Archive.create(str(path), config(mode="rebuild", G=2, E=3)).close()
    end = TAU + 8 * DELTA
    rnd = random.Random(26)
    for _ in range(2):
        # killed at a random moment of its 2nd to 4th write (one takes about 0.5 s here)
        T = _killed_child(path, end, rnd.randint(2, 4), rnd.uniform(0.0, 0.6))
        last = last_update(path)
        assert last in (T - DELTA, T)  # the write under way: not done, or done
        assert_answers(path, oracle_until(last), last)
        v = ebb("verify", path)
        assert v.returncode == 0, v.stdout
    # the rest, with the first attempt of one task of every write failing after staging records
    r = _child("finish", path, end, marks)
    assert r.returncode == 0, r.stderr[-3000:]
    assert os.listdir(marks), "no task failed: nothing was retried"
    assert last_update(path) == end
    assert_answers(path, oracle_until(end), end)
    verify_clean(path)


def test_each_micro_batch_is_one_update_and_a_rerun_batch_loads_once(session, tmp_path):
    path, src, ckpt = tmp_path / "arc", tmp_path / "landing", tmp_path / "ckpt"
    src.mkdir()
    Archive.create(str(path), config(mode="norebuild")).close()

    def land(b: int) -> None:  # micro-batch b: the update at TAU + b * DELTA
        f = src / f"b{b:03d}.parquet"
        pq.write_table(table_of(rows_at(TAU + b * DELTA), SCHEMA), f)
        os.utime(f, (1e9 + b, 1e9 + b))  # the file source takes the oldest first

    def run() -> str:
        q = (session.readStream.schema(SPARK_SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(src))
             .writeStream.format("ebb").option("checkpointLocation", str(ckpt)).trigger(availableNow=True)
             .start(str(path)))
        q.awaitTermination()
        assert q.exception() is None
        return q.id

    for b in range(3):
        land(b)
    qid = run()
    T = TAU + 2 * DELTA
    assert last_update(path) == T and update_seq(path) == 3
    assert_answers(path, oracle_until(T), T)
    with Archive(str(path)) as arc:
        assert json.loads(arc.checkpoint(f"spark-stream:{qid}")) == {"batch": 2, "at": T}
    for f in ("2", ".2.crc"):  # as if the driver died after the archive's commit, before Spark's
        os.remove(ckpt / "commits" / f)
    assert run() == qid
    assert update_seq(path) == 3  # batch 2 ran again and was recognised
    assert_answers(path, oracle_until(T), T)
    for b in (3, 4):
        land(b)
    run()
    T = TAU + 4 * DELTA
    assert last_update(path) == T and update_seq(path) == 5
    assert_answers(path, oracle_until(T), T)
    verify_clean(path)


# -- child processes ---------------------------------------------------------------------------------
def _child(*args, **popen) -> subprocess.CompletedProcess | subprocess.Popen:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    cmd = [sys.executable, os.path.abspath(__file__), *map(str, args)]
    if popen:
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, **popen)
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def _killed_child(path, end: int, nth: int, delay: float) -> int:
    """Runs the kill child; ``delay`` seconds after its ``nth`` write started, SIGKILLs every
    process of its session (the driver, its JVM, the Python workers). Returns the time of the
    write then under way (the last one it started)."""
    p = _child("kill", path, end, start_new_session=True)
    started = []
    while len(started) < nth:
        line = p.stdout.readline()
        assert line, "the child ended before its write"
        if line.startswith("writing"):
            started.append(int(line.split()[1]))
    time.sleep(delay)
    for pid in _session(p.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    p.wait()
    deadline = time.monotonic() + 30
    while _session(p.pid) and time.monotonic() < deadline:  # nothing of it may still commit
        time.sleep(0.05)
    assert not _session(p.pid)
    rest = [int(line.split()[1]) for line in p.stdout.read().splitlines() if line.startswith("writing")]
    return (started + rest)[-1]


def _session(sid: int) -> list[int]:
    """The processes of session ``sid`` (the JVM's Python daemon has its own process group, not
    its own session)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid and fields[0] != "Z":
                out.append(int(d))
    return out


def _main(cmd: str, path: str, end: str, marks: str = "") -> None:
    """kill: the writes from the next update time to ``end``; finish: the same on local[2,2] (a
    failed task runs again), the first attempt of one task of each write failing."""
    from ebb.indexer.spark import session
    from ebb.query.spark_source import register

    # small Arrow batches: each task gets several, so a failing one has staged records already
    conf = {"spark.sql.shuffle.partitions": "2", "spark.sql.execution.arrow.maxRecordsPerBatch": "40"}
    spark = session("local[2,2]" if cmd == "finish" else "local[2]", conf)
    register(spark)

    def flaky(batches):
        from pyspark import TaskContext

        ctx = TaskContext.get()
        for n, b in enumerate(batches):
            if n == 2 and ctx.partitionId() == 0 and ctx.attemptNumber() == 0:
                open(os.path.join(marks, f"failed-{time.time()}"), "w").close()
                raise RuntimeError("injected task failure")
            yield b

    last = last_update(path)
    for T in range(TAU if last is None else last + DELTA, int(end) + 1, DELTA):
        df = frame(spark, rows_at(T))
        print("writing", T, flush=True)
        write(df.mapInArrow(flaky, SPARK_SCHEMA) if cmd == "finish" else df, path, T)
        print("done", T, flush=True)


if __name__ == "__main__":
    _main(*sys.argv[1:])
