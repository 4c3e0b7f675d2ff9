"""Ticks loaded by Spark executors (indexer/executor_load.py): the same answers as the
single-process path and a brute-force oracle at every tick, on Spark local[2] and on a standalone cluster (a master and
two workers started from the PySpark distribution, bound to 127.0.0.1); an executor JVM killed
with SIGKILL in mid-update; the driver killed at each point of the commit protocol."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from ebb.indexer.jobspec import load_job
from ebb.indexer.scheduler import Scheduler
from ebb.storage.archive import Archive

from jobs import join_job, land_join_inputs
from support import Oracle, archive_answers, ebb

TICKS = 5
T_END = 40 + (TICKS - 1) * 5
PROBES = (0, 3, 7)
RANGES = ((2, 9), (11, 40))


def _landing(tmp_path, seed=5, users=40, rate=60):
    landing = tmp_path / "landing"
    land_join_inputs(landing, np.random.default_rng(seed), T_END, users, rate)
    return landing


def _job(tmp_path, name, landing, mode, data_dir=None):
    p = tmp_path / f"{name}.toml"
    text = join_job(landing, tmp_path / name, mode, archive_extra="block_bytes = 2048")
    if data_dir:
        text += f'data_dir = "{data_dir}"\n'
    p.write_text(text)
    return p


def _next_tick(s: Scheduler) -> dict:
    last = s.progress().last_slot
    return s.run_tick(0 if last is None else last + 1)


def _answers(arc, T):
    return {t: archive_answers(arc, t, PROBES, RANGES) for t in (T, T + 3, T + 11)}


def _oracle_of_driver_loads(monkeypatch) -> Oracle:
    """A brute-force oracle fed every batch of results that an in-process ``Archive.load`` (the
    single-process path) is given from now on."""
    oracle, load = Oracle(key="user"), Archive.load

    def load_and_remember(arc, table, at, *a, **k):
        oracle.load(table.to_pylist(), at)
        return load(arc, table, at, *a, **k)

    monkeypatch.setattr(Archive, "load", load_and_remember)
    return oracle


def _oracle_answers(oracle: Oracle, T: int) -> dict:
    """``_answers`` computed by the oracle."""
    return {t: {"scan": oracle.scan(t), "probes": {k: oracle.probe(k, t) for k in PROBES},
                "ranges": {rg: oracle.probe_range(*rg, t) for rg in RANGES}} for t in (T, T + 3, T + 11)}


@pytest.mark.parametrize("mode", ["rebuild", "norebuild"])
def test_executors_give_the_single_process_answers_at_every_tick(spark, tmp_path, mode, monkeypatch):
    landing = _landing(tmp_path, rate=300)
    single = Scheduler(load_job(str(_job(tmp_path, "single", landing, mode))), say=lambda m: None)
    parted = Scheduler(load_job(str(_job(tmp_path, "parted", landing, mode, tmp_path / "shared"))),
                       say=lambda m: None, load_on="executors", part_bytes=12000)
    oracle = _oracle_of_driver_loads(monkeypatch)
    parts = []
    with single, parted:
        for _ in range(TICKS):
            want = _next_tick(single)
            rec = _next_tick(parted)
            T = rec["time"]
            got = _answers(parted.archive, T)
            assert got == _answers(single.archive, T) == _oracle_answers(oracle, T)
            for k in ("input_rows", "inserted", "deleted", "dropped_expired"):
                assert rec[k] == want[k], k
            assert rec["parts"] >= 1 and rec["tasks_seconds"] > 0
            parts.append(rec["parts"])
        assert max(parts) > 1, parts  # a tick was cut into several parts
        assert os.listdir(tmp_path / "shared")  # the runs live in data_dir, the metadata in path
        if mode == "rebuild":  # several tasks wrote one sub-index: disjoint key-range runs
            assert max(len(s.runs) for s in parted.archive.state().subindices) > 1
    assert ebb("verify", tmp_path / "parted").returncode == 0


def _run(job, *extra, crash=None, env=None, timeout=600):
    e = dict(os.environ, **(env or {}))
    if crash:
        e["EBB_CRASH_AT"] = crash
    return subprocess.run([sys.executable, "-m", "ebb.tools.cli", "run", str(job), "--until", str(T_END),
                           "--load-on", "executors", "--part-mib", "0.003", *extra],
                          env=e, capture_output=True, text=True, timeout=timeout)


def _committed(path):
    with Archive(str(path), readonly=True) as a:
        return [u["slot"] for u in a.updates()]


@pytest.mark.system
def test_driver_killed_at_each_commit_point_resumes_exactly_once(spark, tmp_path):
    landing = _landing(tmp_path)
    with Scheduler(load_job(str(_job(tmp_path, "reference", landing, "rebuild"))), say=lambda m: None) as s:
        s.run(until=T_END)
        want = _answers(s.archive, T_END)
    job = _job(tmp_path, "crashy", landing, "rebuild", tmp_path / "crashy-data")
    done = 0
    for point in ("partitioned.results_in:2", "update.before_commit:2", "update.after_commit:2"):
        r = _run(job, "--master", "local[2]", crash=point)
        assert r.returncode == -9, (point, r.stderr[-2000:])
        slots = _committed(tmp_path / "crashy")
        assert slots == list(range(len(slots)))  # in order, none twice
        assert len(slots) == done + (2 if point.startswith("update.after_commit") else 1)
        done = len(slots)
        v = ebb("verify", tmp_path / "crashy")
        assert v.returncode == 0, v.stdout
        if point.startswith("partitioned"):  # the tasks' runs were written, never committed
            assert "left by an interrupted update" in v.stdout
    r = _run(job, "--master", "local[2]")
    assert r.returncode == 0, r.stderr[-2000:]
    assert _committed(tmp_path / "crashy") == list(range(TICKS))
    assert _answers(Archive(str(tmp_path / "crashy"), readonly=True), T_END) == want
    assert "left by" not in ebb("verify", tmp_path / "crashy").stdout


# -- a real standalone cluster ---------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A Spark standalone master and two one-core workers on 127.0.0.1, stopped afterwards."""
    import pyspark

    home = os.path.dirname(pyspark.__file__)
    work = tmp_path_factory.mktemp("cluster")
    env = dict(os.environ, SPARK_HOME=home, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
               SPARK_WORKER_DIR=str(work / "work"), SPARK_LOG_DIR=str(work / "logs"),
               SPARK_DAEMON_JAVA_OPTS=os.environ["SPARK_SUBMIT_OPTS"])  # the JVM options of tests/conftest.py
    port, ui = _free_port(), _free_port()
    cls = os.path.join(home, "bin", "spark-class")
    procs = [subprocess.Popen([cls, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                               "--webui-port", str(ui)], env=env, stdout=open(work / "master.log", "w"),
                              stderr=subprocess.STDOUT, start_new_session=True)]
    master = f"spark://127.0.0.1:{port}"
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.5)
    for w in range(2):
        procs.append(subprocess.Popen(
            [cls, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", "1", "--memory", "1g",
             "--webui-port", str(_free_port()), master],
            env=env, stdout=open(work / f"worker{w}.log", "w"), stderr=subprocess.STDOUT, start_new_session=True))
    time.sleep(8)  # the workers register with the master
    yield master, env
    for p in procs:
        os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)


def _executor_pids() -> list[int]:
    out = subprocess.run(["pgrep", "-f", "CoarseGrainedExecutorBackend"], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


# About 3.5 minutes, most of it the cluster's JVMs on two cores: it would take CI's suite past its
# 15-minute budget, so it runs when asked (README, "Run the tests").
@pytest.mark.skipif(os.environ.get("EBB_CLUSTER_TESTS") != "1", reason="set EBB_CLUSTER_TESTS=1 to start a standalone Spark cluster")
def test_standalone_cluster_same_answers_and_survives_a_killed_executor(tmp_path, cluster, monkeypatch):
    master, env = cluster
    landing = _landing(tmp_path, seed=9, users=200, rate=2500)
    oracle = _oracle_of_driver_loads(monkeypatch)
    with Scheduler(load_job(str(_job(tmp_path, "single", landing, "rebuild"))), say=lambda m: None) as s:
        want = {}
        for _ in range(TICKS):
            rec = s.run_tick(s.progress().last_slot + 1 if s.archive else 0)
            want[rec["time"]] = _answers(s.archive, rec["time"])
            assert want[rec["time"]] == _oracle_answers(oracle, rec["time"])
    monkeypatch.undo()
    job = _job(tmp_path, "cluster", landing, "rebuild", tmp_path / "shared")
    extra = ["--master", master, "--conf", "spark.executor.cores=1", "--conf", "spark.cores.max=2",
             "--conf", f"spark.executor.extraJavaOptions={os.environ['SPARK_SUBMIT_OPTS']}"]
    # three runs, answers compared after each: ticks 0-2, tick 3 (an executor killed while writing), 4-6
    for last, kill in ((2, False), (3, True), (TICKS - 1, False)):
        T = 40 + last * 5
        cmd = [sys.executable, "-m", "ebb.tools.cli", "run", str(job), "--until", str(T), "--load-on", "executors",
               "--part-mib", "0.003", *extra]
        seen = set(os.listdir(tmp_path / "shared")) if os.path.isdir(tmp_path / "shared") else set()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        killed = False
        deadline = time.time() + 240
        while kill and not killed and time.time() < deadline and proc.poll() is None:
            fresh = [n for n in os.listdir(tmp_path / "shared") if n not in seen]
            pids = _executor_pids()
            if fresh and pids:  # a task of this tick is writing its run
                os.kill(pids[0], signal.SIGKILL)
                killed = True
            time.sleep(0.005)
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
        assert killed == kill, "no executor was caught writing"
        with Archive(str(tmp_path / "cluster"), readonly=True) as arc:
            assert _answers(arc, T) == want[T]
    assert _committed(tmp_path / "cluster") == list(range(TICKS))
    v = ebb("verify", tmp_path / "cluster")
    assert v.returncode == 0, v.stdout
