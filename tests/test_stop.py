"""Clean stops: SIGTERM (or Ctrl-C) to `ebb run` finishes the tick whose commit is under way or
abandons the one still computing, says which in one line, and exits 0; the next start resumes
at the first tick not committed, and nothing is lost or loaded twice. `ebb serve` stops the same
way. In process, a signal sent at a chosen point shows each case; then a real `ebb run --follow`
gets SIGTERM at random moments, five times over, and its archive is checked against the landed
readings tick by tick."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest

from ebb.indexer.jobspec import load_job
from ebb.indexer.scheduler import Scheduler
from ebb.indexer.stopping import StopOnSignals, Stopped
from ebb.indexer.synthetic import land
from ebb.storage.archive import Archive, open_readonly

from support import SCHEMA, config, ebb, random_rows, table_of

DELTA, GRACE, S = 2, 1, 12
SECONDS = 400  # event time the landed readings cover
JOB = """
[job]
time_unit = "s"
origin = "{origin}"
grace = {grace}

[[source]]
name = "readings"
path = "landing"
time_column = "event_time"
key = "sensor"
lifetime_column = "life"

[query]
kind = "lifetime"
source = "readings"
max_lifetime = {S}

[archive]
path = "archive"
layout = "doubly"
mode = "norebuild"
interval = {delta}
start = 0
"""
STOP_LINE = re.compile(r"^ebb: stopped by SIGTERM (?:(?P<how>between ticks|after tick|during tick|before the first tick)"
                       r".*; the next start resumes at tick (?P<resume>\d+) T=\d+.*|while starting; nothing was run)$")


def make_job(d, origin_s: int, seed: int = 5) -> tuple[str, list[tuple[int, int, int]]]:
    """A job over readings landed now for event times 1..SECONDS (3 sensors a second, each valid
    3 to S seconds: longer than a tick, so none expires in its own update); returns the job file
    and the readings as (sensor, ts, exp)."""
    rng = np.random.default_rng(seed)
    origin = dt.datetime.fromtimestamp(origin_s, dt.timezone.utc)
    (d / "job.toml").write_text(JOB.format(origin=origin.strftime("%Y-%m-%dT%H:%M:%SZ"), grace=GRACE, S=S, delta=DELTA))
    readings = []
    for first in range(1, SECONDS + 1, 20):
        t = np.repeat(np.arange(first, first + 20), 3)
        sensor = rng.integers(0, 50, len(t))
        life = rng.integers(3, S + 1, len(t))
        readings += [(int(k), int(a), int(a + b)) for k, a, b in zip(sensor, t, life)]
        stamps = pa.array((t * 1_000_000 + origin_s * 1_000_000), pa.timestamp("us", tz="UTC"))
        land(pa.table({"sensor": pa.array(sensor, pa.int64()), "event_time": stamps,
                       "life": pa.array(life, pa.int64())}), str(d / "landing"), f"r{first:05d}.parquet")
    return str(d / "job.toml"), readings


def updates(archive: str) -> list[dict]:
    arc = open_readonly(archive)
    try:
        return arc.updates()
    finally:
        arc.close()


def check_against_readings(archive: str, readings: list[tuple[int, int, int]]) -> int:
    """Every committed tick inserted exactly the readings of its interval, ticks are consecutive
    from the bulk load on, and a scan as of the last equals the readings valid then. Returns the
    number of ticks committed."""
    log = updates(archive)
    assert [u["time"] for u in log] == [DELTA * j for j in range(len(log))]
    for u in log:
        T = u["time"]
        lo = T - S if T == 0 else T - DELTA
        assert u["inserted"] == sum(lo < ts <= T for _, ts, _ in readings), u
        assert u["dropped_expired"] == 0, u
    if log:
        T = log[-1]["time"]
        r = ebb("scan", archive, "--format", "jsonl")
        assert r.returncode == 0, r.stderr
        got = Counter((x["sensor"], x["ts"], x["exp"]) for x in map(json.loads, r.stdout.splitlines()))
        assert got == Counter(x for x in readings if x[1] <= T < x[2])
    return len(log)


# -- each case, in process: the signal sent at a chosen point --------------------------------------
def test_a_stop_finishes_a_commit_under_way_and_abandons_a_computing_tick(spark, tmp_path, monkeypatch):
    job_file, readings = make_job(tmp_path, origin_s=1_700_000_000)
    archive = str(tmp_path / "archive")
    with Scheduler(load_job(job_file), say=lambda m: None) as s:
        with StopOnSignals() as stop:
            s.stop = stop
            assert s.run(ticks=1) == 1  # the bulk load
            real_load = s.archive.load

            def load_signalled(*args, **kw):  # SIGTERM arrives as the commit starts
                os.kill(os.getpid(), signal.SIGTERM)
                return real_load(*args, **kw)

            monkeypatch.setattr(s.archive, "load", load_signalled)
            with pytest.raises(Stopped) as e:
                s.run(ticks=3)
            assert s.progress().last_slot == 1  # tick 1 committed, tick 2 never started
            assert s.stop_message(e.value.signame) == (
                f"ebb: stopped by SIGTERM after tick 1 {s.when(2)}, whose commit was under way and finished; "
                f"the next start resumes at tick 2 {s.when(4)}")
            monkeypatch.setattr(s.archive, "load", real_load)
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # put back

        with StopOnSignals() as stop:
            s.stop = stop
            real_discover = s._discover

            def discover_signalled(*args):  # SIGTERM while the tick reads its input
                os.kill(os.getpid(), signal.SIGTERM)
                return real_discover(*args)

            monkeypatch.setattr(s, "_discover", discover_signalled)
            with pytest.raises(Stopped) as e:
                s.run(ticks=1)
            assert s.progress().last_slot == 1
            assert s.stop_message("SIGTERM") == (
                f"ebb: stopped by SIGTERM during tick 2 {s.when(4)}: abandoned before its commit (nothing of it "
                f"committed); the next start resumes at tick 2 {s.when(4)}")
            monkeypatch.setattr(s, "_discover", real_discover)

        with StopOnSignals() as stop:  # Ctrl-C while following waits for the next tick
            s.stop = stop
            s.clock = lambda: (1_700_000_000 + 2 * DELTA + GRACE) * 10**9  # tick 2 is due, tick 3 not yet
            s.sleep = lambda seconds: os.kill(os.getpid(), signal.SIGINT)
            with pytest.raises(Stopped) as e:
                s.run(follow=True)
            assert e.value.signame == "SIGINT" and s.progress().last_slot == 2
            assert s.stop_message("SIGINT") == (
                f"ebb: stopped by SIGINT between ticks, after tick 2 {s.when(4)}; the next start resumes at tick 3 "
                f"{s.when(6)}")
    assert check_against_readings(archive, readings) == 3


def _group_alive(pgid: int) -> bool:
    """Whether any process of process group ``pgid`` still runs."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


# -- the real thing: SIGTERM at random moments ------------------------------------------------------
@pytest.mark.system
def test_sigterm_at_random_moments_exits_0_and_loses_nothing(tmp_path):
    origin = int(time.time()) - 5  # a few ticks are due at once, then one every 2 s
    job_file, readings = make_job(tmp_path, origin)
    archive = str(tmp_path / "archive")
    rng = np.random.default_rng(int(os.environ.get("EBB_STOP_SEED", "27")))
    # Spark takes 5-30 s to start on a busy machine, and the first tick as long again: the stops
    # come at random moments after a milestone of the run (its first line, when ebb handles the
    # signal; Spark ready; a tick done), so that they fall while Spark starts, while a tick
    # computes and, once ticks run, while one computes, commits or waits for the next
    delays = [("started", 0.5), ("ready", float(rng.uniform(0, 5)))] + [("ticked", float(x)) for x in rng.uniform(0, 6, 3)]
    resumed, hows = 0, []
    for after, delay in delays:
        p = subprocess.Popen([sys.executable, "-m", "ebb.tools.cli", "run", job_file, "--follow"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        lines: list[str] = []
        milestones = {"started": threading.Event(), "ready": threading.Event(), "ticked": threading.Event()}

        def read(stream=p.stdout, lines=lines, milestones=milestones) -> None:
            for line in stream:
                lines.append(line)
                milestones["started"].set()
                if line.startswith("spark ") and " ready " in line:
                    milestones["ready"].set()
                if re.match(r"tick \d+ T=\d+: (?!computing)", line):
                    milestones["ticked"].set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            assert milestones[after].wait(300), "".join(lines)
            time.sleep(delay)
            p.send_signal(signal.SIGTERM)
            p.wait(timeout=120)
            reader.join(10)
            out, err = "".join(lines), p.stderr.read()
            # nothing it started outlives it: Spark's JVM exits once its `ebb run` has (a stop while
            # the JVM started left it running for good, holding its heap)
            deadline = time.monotonic() + 20
            while _group_alive(p.pid) and time.monotonic() < deadline:
                time.sleep(0.2)
            orphaned = _group_alive(p.pid)
        finally:
            if p.poll() is None or _group_alive(p.pid):
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        why = f"{delay:.1f} s after {after}\nstdout:\n{out}\nstderr:\n{err}"
        assert p.returncode == 0, why
        assert not orphaned, "a process of the stopped `ebb run` is still running: " + why
        err_lines = err.strip().splitlines()
        assert len(err_lines) == 1, why  # the one line, nothing else
        m = STOP_LINE.match(err_lines[0])
        assert m, why
        ticks = [int(t) for t in re.findall(r"^tick (\d+) T=\d+: (?!computing)", out, re.M)]  # each tick's last line
        assert ticks == list(range(resumed, resumed + len(ticks))), why  # resumed where the last stop left
        committed = len(updates(archive)) if os.path.exists(os.path.join(archive, "EBB")) else 0
        if m["resume"] is not None:
            assert int(m["resume"]) == committed, why
            hows.append(m["how"])
        resumed = committed
    assert check_against_readings(archive, readings) == resumed > 0
    print("stops:", list(zip(delays, hows)))
    # and the next start resumes there
    r = ebb("run", job_file, "--ticks", 1)
    assert r.returncode == 0 and f"tick {resumed} T={DELTA * resumed}:" in r.stdout, r.stdout + r.stderr
    assert check_against_readings(archive, readings) == resumed + 1


def test_serve_stops_on_sigterm_and_sigint_with_exit_0(tmp_path):
    path = str(tmp_path / "arc")
    with Archive.create(path, config()) as arc:
        arc.load(table_of(random_rows(np.random.default_rng(1), 50, 1, 16, 16, 10), SCHEMA), 16)
    for sig in (signal.SIGTERM, signal.SIGINT):
        p = subprocess.Popen([sys.executable, "-m", "ebb.tools.cli", "serve", path, "--port", "0"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert "serving" in p.stdout.readline()
        p.send_signal(sig)
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        assert err.strip().splitlines() == [f"ebb: server stopped by {sig.name} (the running calls finished)"], err
