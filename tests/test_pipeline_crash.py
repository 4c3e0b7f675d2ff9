"""Exactly-once across crashes: a real `ebb run` is killed (SIGKILL) just before and just after
a tick's commit, and re-run. Every tick is
committed exactly once and the final archive equals an undisturbed run's. (A kill earlier in a
tick leaves what a kill before the commit leaves; tests/test_crash.py kills `ebb load` at every
crash point and tests/test_executor_load.py kills the driver at the executor path's points.) Also: a running scheduler migrated between ticks."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from ebb.indexer.jobspec import load_job
from ebb.indexer.scheduler import Scheduler
from ebb.query.reader import ArchiveReader
from ebb.storage.archive import Archive

from jobs import join_job, land_join_inputs
from support import ebb, rows_multiset

TICKS = 7
T_END = 40 + (TICKS - 1) * 5


def write_job(tmp_path, name, landing):
    p = tmp_path / f"{name}.toml"
    p.write_text(join_job(landing, tmp_path / name))
    return p


def run_cli(job_path, crash=None):
    env = dict(os.environ)
    if crash:
        env["EBB_CRASH_AT"] = crash
    proc = subprocess.Popen([sys.executable, "-m", "ebb.tools.cli", "run", str(job_path), "--until", str(T_END)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=300)
    return proc.returncode, out, err


def committed(path):
    with Archive(str(path)) as a:
        slots = [u["slot"] for u in a.updates()]
        prog = json.loads(a.checkpoint("scheduler") or b"{}")
    return slots, prog


@pytest.fixture(scope="module")
def landed(spark, tmp_path_factory):
    """Landed files for TICKS ticks, and an undisturbed run's scans at a few times."""
    tmp_path = tmp_path_factory.mktemp("landed")
    landing = tmp_path / "landing"
    land_join_inputs(landing, np.random.default_rng(11), T_END, users=4, rate=30)
    ref_job = write_job(tmp_path, "reference", landing)
    with Scheduler(load_job(str(ref_job)), say=lambda m: None) as s:
        assert s.run(until=T_END) == TICKS
        expected = {t: rows_multiset(ArchiveReader(s.archive).scan_table(as_of=t)) for t in (T_END, T_END + 4, T_END + 9)}
    return landing, expected


@pytest.mark.system
def test_killed_runs_commit_every_tick_exactly_once(landed, tmp_path):
    landing, expected = landed
    job = write_job(tmp_path, "crashy", landing)
    path = tmp_path / "crashy"
    scenarios = ["update.before_commit:2", "update.after_commit:2"]
    done_before = 0
    for crash in scenarios:
        rc, out, err = run_cli(job, crash)
        assert rc == -9, (crash, rc, err[-2000:])
        slots, prog = committed(path)
        assert slots == list(range(len(slots))), slots  # in order, none twice
        assert prog.get("last_slot", -1) == len(slots) - 1  # progress committed with the data
        if crash.startswith("update.after_commit"):
            assert len(slots) == done_before + 2  # the second tick of this run was committed
        else:
            assert len(slots) == done_before + int(crash.split(":")[1]) - 1
        done_before = len(slots)
        v = ebb("verify", path)
        assert v.returncode == 0, v.stdout
    rc, out, err = run_cli(job)
    assert rc == 0, err[-2000:]
    slots, prog = committed(path)
    assert slots == list(range(TICKS)) and prog["last_slot"] == TICKS - 1
    with ArchiveReader(str(path)) as r:
        for t, want in expected.items():
            assert rows_multiset(r.scan_table(as_of=t)) == want
    rc, out, _ = run_cli(job)  # the same landed files again: nothing is loaded twice
    assert rc == 0 and "ran 0 ticks" in out
    assert committed(path)[0] == list(range(TICKS))


def test_run_goes_on_through_a_migration(landed, tmp_path):
    """`ebb migrate` (another process) between two ticks of a running scheduler, which holds the
    archive open: the migration takes the writer lock between ticks, the scheduler's next ticks
    read the new configuration and go to the new layout, and the answers equal the undisturbed
    run's."""
    landing, expected = landed
    job = write_job(tmp_path, "migrating", landing)
    path = tmp_path / "migrating"
    migrations = []

    def say(msg: str) -> None:
        if msg.startswith("tick 2 ") and "; +" in msg and not migrations:  # tick 2 committed
            m = ebb("migrate", path, "--G", "3", "--E", "2", "--mode", "rebuild", "--format", "json")
            assert m.returncode == 0, m.stderr
            migrations.append(json.loads(m.stdout))

    with Scheduler(load_job(str(job)), say=say) as s:
        assert s.run(until=T_END) == TICKS
    assert migrations and migrations[0]["after_update"] == 3  # bulk load and ticks 1, 2
    slots, prog = committed(path)
    assert slots == list(range(TICKS)) and prog["last_slot"] == TICKS - 1
    with Archive(str(path)) as a:
        assert (a.config.G, a.config.E, a.config.mode) == (3, 2, "rebuild") and len(a.state().subindices) == 6
    with ArchiveReader(str(path)) as r:
        for t, want in expected.items():
            assert rows_multiset(r.scan_table(as_of=t)) == want
    assert ebb("verify", path).returncode == 0
