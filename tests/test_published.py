"""Reading an archive from a machine that mounts only its data directory (storage/published.py).

The "other machine" here is a second path to the data directory (a symlink: the reader never
sees the archive directory, its LMDB or its reader table) and, for the server, a separate
`ebb serve` process given only that path.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest

from ebb.storage import faults, files, published
from ebb.storage.archive import Archive, PublishedArchive, open_readonly
from ebb.storage.errors import ArchiveError, ReadError
from ebb.storage.faults import FaultInjectionFS, SimulatedCrash
from ebb.storage.read_plan import Probe, Scan
from ebb.storage.verify import verify

from support import SCHEMA, Oracle, archive_answers, config, random_rows, rows_multiset, table_of

PROBES = (0, 3, 7, 11)
RANGES = ((2, 5), (0, 11))


def _answers(oracle: Oracle, t: int) -> dict:
    return {"scan": oracle.scan(t), "probes": {k: oracle.probe(k, t) for k in PROBES},
            "ranges": {rg: oracle.probe_range(*rg, t) for rg in RANGES}}


def _archive(tmp_path, **kw) -> tuple[Archive, str]:
    """A new archive with its own data directory, and the path "another machine" mounts it at."""
    arc = Archive.create(str(tmp_path / "arc"), config(block_bytes=256, **kw), data_dir=str(tmp_path / "shared"))
    os.symlink(tmp_path / "shared", tmp_path / "mount")
    return arc, str(tmp_path / "mount")


def _loaded(tmp_path, seed: int, rows: int):
    """``_archive`` with a first load at 16, its oracle and the random generator."""
    rng = np.random.default_rng(seed)
    arc, mount = _archive(tmp_path)
    oracle = Oracle()
    first = random_rows(rng, rows, 1, 16, 16, 12)
    oracle.load(first, 16)
    arc.load(table_of(first, SCHEMA), 16)
    return arc, mount, oracle, rng


@pytest.mark.parametrize("mode", ["rebuild", "norebuild"])
def test_a_reader_of_the_data_directory_answers_as_the_archive_at_every_update(tmp_path, mode):
    rng = np.random.default_rng(11)
    arc, mount = _archive(tmp_path, mode=mode)
    oracle = Oracle()
    remote = open_readonly(mount)
    assert isinstance(remote, PublishedArchive)
    assert archive_answers(remote, 16, PROBES, RANGES) == _answers(oracle, 16)  # published at creation
    for T in range(16, 60, 2):
        rows = random_rows(rng, int(rng.integers(0, 120)), T - 1 if T > 16 else 1, T, 16, 12, f"t{T}-")
        oracle.load(rows, T)
        arc.load(table_of(rows, SCHEMA), T)
        # the same reader object follows the writer's commits
        assert archive_answers(remote, T, PROBES, RANGES) == _answers(oracle, T) == archive_answers(arc, T, PROBES, RANGES)
        assert remote.stats()["updates"] == arc.stats()["updates"]
    assert len(published._copies(published.meta_dir(str(tmp_path / "shared")))) == published.KEEP
    # the copies replaced and deleted are not held mapped (their page check kept no map of them),
    # nor the runs deleted, once the releaser has let go of the replaced versions' maps
    files.RELEASER.idle()
    with open("/proc/self/maps") as f:
        assert [line for line in f if str(tmp_path) in line and line.rstrip().endswith("(deleted)")] == []
    problems, notes = verify(arc)
    assert problems == [] and any(n.startswith("meta:") for n in notes)
    remote.close()
    arc.close()


def test_an_archive_without_its_own_data_directory_publishes_nothing(tmp_path):
    with Archive.create(str(tmp_path / "arc"), config()) as arc:
        arc.load(table_of(random_rows(np.random.default_rng(1), 50, 1, 16, 16, 8), SCHEMA), 16)
        assert not arc.publishes and not os.path.exists(os.path.join(arc.data_dir, published.META_DIR))
    with pytest.raises(ArchiveError, match="not an ebb archive"):
        open_readonly(str(tmp_path / "arc" / "data"))


def test_a_remote_read_survives_the_next_update_and_fails_clearly_after_more(tmp_path):
    """Garbage collection keeps the files of every kept published copy; a read that outlives
    KEEP updates may fail, but never returns rows of another version."""
    rng = np.random.default_rng(5)
    arc, mount = _archive(tmp_path)
    oracle = Oracle()
    for T in (16, 18):
        rows = random_rows(rng, 200, 1, T, 16, 12)
        oracle.load(rows, T)
        arc.load(table_of(rows, SCHEMA), T)
    remote = open_readonly(mount)
    snap = remote.snapshot()
    scan = snap.plan(Scan())
    tasks = scan + snap.plan(Probe((3,)))

    def read(t):  # each read in a fresh file cache, as a new request on another thread would
        remote.open_files.close()
        return rows_multiset(pa.Table.from_batches(list(snap.read(t)), snap.schema))

    arc.load(table_of(random_rows(rng, 200, 19, 20, 16, 12), SCHEMA), 20)  # one more publish: still kept
    got = [read(t) for t in tasks]
    assert sum(got[:len(scan)], start=Counter()) == oracle.scan(18)
    assert sum(got[len(scan):], start=Counter()) == oracle.probe(3, 18)
    for T in (22, 24, 26):
        arc.load(table_of(random_rows(rng, 200, T - 1, T, 16, 12), SCHEMA), T)
    failed = 0
    for t, want in zip(tasks, got):  # the version is gone: the right rows or a clear failure
        try:
            assert read(t) == want
        except ReadError as e:
            assert "was reclaimed" in str(e)
            failed += 1
    assert failed  # Rebuild replaced every run of that version
    remote.open_files.close()
    with pytest.raises(ReadError, match="was reclaimed"):  # reading ahead says nothing of its own
        list(snap.read_all(tasks[len(scan):]))
    snap.close()
    remote.close()
    arc.close()


def test_a_crash_while_publishing_leaves_the_previous_version_readable(tmp_path, monkeypatch):
    """Power lost after the update committed, with its copy written but not yet current: remote
    readers keep reading the previous version; the next writer publishes again."""
    arc, mount, oracle, rng = _loaded(tmp_path, 8, 150)
    before = _answers(oracle, 16)
    fs = FaultInjectionFS()
    monkeypatch.setattr("ebb.storage.files.FS", fs)
    faults.arm("publish.copied")
    later = random_rows(rng, 150, 17, 18, 16, 12)
    try:
        with pytest.raises(SimulatedCrash):
            arc.load(table_of(later, SCHEMA), 18)
    finally:
        faults.arm(None)
    fs.drop_unsynced()
    monkeypatch.undo()
    oracle.load(later, 18)  # the update itself committed
    with open_readonly(mount) as remote:
        with remote.snapshot() as snap:
            assert snap.state.update_seq == 1
        assert archive_answers(remote, 16, PROBES, RANGES) == before
    arc.recover()  # what the next update does first
    meta = published.meta_dir(str(tmp_path / "shared"))
    assert not [n for n in os.listdir(meta) if n.endswith(".tmp")]
    with open_readonly(mount) as remote:
        assert archive_answers(remote, 18, PROBES, RANGES) == _answers(oracle, 18)
    arc.close()


def test_ebb_serve_on_the_data_directory_serves_the_archive(tmp_path):
    from ebb.query.flight_client import FlightArchiveClient

    arc, mount, oracle, rng = _loaded(tmp_path, 3, 300)
    proc = subprocess.Popen([sys.executable, "-m", "ebb.tools.cli", "serve", mount, "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "serving" in line, line + proc.stderr.read()
        url = line.split(" at ")[1].split(" ")[0]
        with FlightArchiveClient(url) as c:
            assert rows_multiset(c.probe(3)) == oracle.probe(3, 16)
            rows = random_rows(rng, 100, 17, 18, 16, 12)
            oracle.load(rows, 18)
            arc.load(table_of(rows, SCHEMA), 18)
            deadline = time.monotonic() + 10
            while rows_multiset(c.scan_table()) != oracle.scan(18):  # the pointer's rename is seen at once locally
                assert time.monotonic() < deadline
                time.sleep(0.05)
            assert rows_multiset(c.probe_range(2, 5)) == oracle.probe_range(2, 5, 18)
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    arc.close()


def test_the_published_copy_cannot_be_written_through(tmp_path):
    arc, mount = _archive(tmp_path)
    with PublishedArchive(mount) as remote:
        with pytest.raises(ArchiveError, match="published metadata"):
            remote.load(table_of([], SCHEMA), 16)
    arc.close()


def test_publishing_writes_each_descriptor_once_and_copies_only_the_small_entries(tmp_path):
    """A copy holds no run descriptor (they are files written once each, removed once their
    run is deleted), so an update publishes what it changed, not the archive's descriptors."""
    arc, mount, _, rng = _loaded(tmp_path, 12, 300)
    runs = published.runs_dir(arc.data_dir)
    seen: dict[str, int] = {}
    for T in range(18, 40, 2):
        arc.load(table_of(random_rows(rng, 100, T - 1, T, 16, 12), SCHEMA), T)
        for name in os.listdir(runs):  # written once: an unchanged run's file is never rewritten
            inode = os.stat(os.path.join(runs, name)).st_ino
            assert seen.setdefault(name, inode) == inode
        assert set(os.listdir(runs)) == {n for n in os.listdir(arc.data_dir) if n.endswith(".run")}
        copy = published.current_copy(arc.data_dir, 2)
        env = published.open_copy(copy)
        with env.begin() as txn:
            keys = [bytes(k) for k, _ in txn.cursor()]
        env.close()
        assert keys and not any(k.startswith(b"run/") for k in keys)
    arc.close()
