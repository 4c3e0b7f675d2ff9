"""Leases (storage/leases.py): a read in another process or on another machine pins its version
for as long as it renews its lease; a holder that dies pins nothing once its lease expires."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pyarrow as pa
import pytest

from ebb.storage import leases
from ebb.storage.archive import Archive, open_readonly
from ebb.storage.errors import ReadError
from ebb.storage.read_plan import Scan
from ebb.storage.snapshot import read_unpinned

from support import SCHEMA, Oracle, config, random_rows, rows_multiset, table_of


def _runs(arc) -> set[str]:
    return {n for n in os.listdir(arc.data_dir) if n.endswith(".run")}


def _built(path, **kw):
    rng = np.random.default_rng(3)
    arc = Archive.create(path, config(block_bytes=512, **kw))
    oracle = Oracle()
    rows = random_rows(rng, 400, 1, 16, 16, 20)
    arc.load(table_of(rows, SCHEMA), 16)
    oracle.load(rows, 16)
    return arc, oracle, rng


def _read(tasks, args) -> pa.Table:
    return pa.Table.from_batches([b for t in tasks for b in read_unpinned(t, *args)], args[1])


def test_a_lease_keeps_its_version_readable_until_released(tmp_path):
    arc, oracle, rng = _built(str(tmp_path / "a"))
    with arc.snapshot() as snap:
        tasks, args = snap.plan(Scan()), snap.read_args()
        lease = snap.lease(seconds=60)
    pinned = _runs(arc)
    for T in range(18, 28, 2):  # Rebuild replaces every run the plan reads
        arc.load(table_of(random_rows(rng, 200, T - 1, T, 16, 20), SCHEMA), T)
    assert pinned <= _runs(arc)
    lease.renew()
    assert rows_multiset(_read(tasks, args)) == oracle.scan(16)
    lease.release()
    arc.load(table_of([], SCHEMA), 28)
    assert not pinned & _runs(arc)
    arc.close()


def test_a_killed_readers_lease_stops_pinning_once_it_expires(tmp_path):
    """A reader in its own process leases its version for 2 s and is killed with SIGKILL: its
    runs stay through updates while the lease lives, and the first update after it expires
    reclaims them."""
    arc, _, rng = _built(str(tmp_path / "a"))
    script = textwrap.dedent(f"""
        import sys, time
        from ebb.storage.archive import open_readonly
        arc = open_readonly({arc.path!r})
        with arc.snapshot() as snap:
            snap.lease(seconds=2.0)
        print("leased", flush=True)
        time.sleep(600)
    """)
    reader = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert reader.stdout.readline().strip() == "leased"
        pinned = _runs(arc)
        os.kill(reader.pid, signal.SIGKILL)
        reader.wait(10)
        leased_at = time.time()
        arc.load(table_of(random_rows(rng, 200, 17, 18, 16, 20), SCHEMA), 18)
        assert pinned <= _runs(arc)  # the lease still lives
        time.sleep(max(0.0, leased_at + 2.2 - time.time()))
        arc.load(table_of(random_rows(rng, 200, 19, 20, 16, 20), SCHEMA), 20)
        assert not pinned & _runs(arc)
        assert os.listdir(leases.lease_dir(arc.data_dir)) == []  # the expired lease is gone too
    finally:
        reader.kill()
        arc.close()


def test_renewing_an_expired_lease_fails_clearly(tmp_path):
    arc, _, _ = _built(str(tmp_path / "a"))
    with arc.snapshot() as snap:
        lease = snap.lease(seconds=0.5)
    time.sleep(0.7)
    arc.load(table_of([], SCHEMA), 18)  # garbage collection removes the expired lease
    lease.renewed = 0.0
    with pytest.raises(ReadError, match="lease expired"):
        lease.renew()
    arc.close()


def test_a_remote_scan_outlasts_many_published_updates(tmp_path):
    """A scan through a data directory alone (``PublishedArchive``) holds its version with a
    lease: it reads the planned version's rows after 2 x KEEP updates replaced every run."""
    from ebb.query.reader import ArchiveReader

    rng = np.random.default_rng(8)
    arc = Archive.create(str(tmp_path / "arc"), config(block_bytes=256), data_dir=str(tmp_path / "shared"))
    oracle = Oracle()
    rows = random_rows(rng, 300, 1, 16, 16, 12)
    arc.load(table_of(rows, SCHEMA), 16)
    oracle.load(rows, 16)
    with ArchiveReader(open_readonly(str(tmp_path / "shared"))) as remote:
        stream = remote.scan()
        first = next(stream)
        for T in range(18, 28, 2):
            arc.load(table_of(random_rows(rng, 200, T - 1, T, 16, 12), SCHEMA), T)
            remote.archive.open_files.close()  # nothing cached: every block is read after the updates
        got = pa.Table.from_batches([first, *stream])
    assert rows_multiset(got) == oracle.scan(16)
    arc.load(table_of([], SCHEMA), 28)  # the scan ended: its lease is gone and so is its space
    assert os.listdir(leases.lease_dir(arc.data_dir)) == []
    arc.close()


def test_a_lease_renews_on_the_first_read_of_another_process(tmp_path):
    """A lease travels pickled to other processes (Spark executors): their first renewal
    touches the file, whatever this process's clock said."""
    import pickle

    arc, _, _ = _built(str(tmp_path / "a"))
    with arc.snapshot() as snap:
        lease = snap.lease(seconds=60)
    os.utime(lease.path, (1, 1))
    moved = pickle.loads(pickle.dumps(lease))
    assert moved.renewed == 0.0
    moved.renew()
    assert os.stat(lease.path).st_mtime > 1
    arc.close()
