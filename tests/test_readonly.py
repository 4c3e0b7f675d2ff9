"""A read-only open never waits for another process's update, sees the last committed state,
and refuses to write."""

from __future__ import annotations

import subprocess
import sys
import threading

import numpy as np
import pyarrow as pa
import pytest

from ebb.query.reader import ArchiveReader
from ebb.storage.archive import Archive, ArchiveError

from support import SCHEMA, config, random_rows, rows_multiset

HOLD_WRITE_TXN = """
import sys, time, lmdb
env = lmdb.open(sys.argv[1], map_size=1 << 36, subdir=True)
txn = env.begin(write=True)  # LMDB's writer lock: what an update holds while it runs
txn.put(b"uncommitted", b"1")
print("holding", flush=True)
time.sleep(60)
"""


def test_readonly_open_does_not_wait_for_a_writer(tmp_path):
    path = str(tmp_path / "a")
    rows = [{"key": i % 3, "ts": 16, "exp": 20 + i, "payload": str(i)} for i in range(10)]
    with Archive.create(path, config()) as arc:
        arc.load(pa.Table.from_pylist(rows, schema=SCHEMA), 16)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_WRITE_TXN, str(tmp_path / "a" / "index")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        result = {}

        def read():
            with ArchiveReader(path) as r:
                result["rows"] = rows_multiset(r.scan_table())
                result["readonly"] = r.archive.readonly

        t = threading.Thread(target=read, daemon=True)
        t.start()
        t.join(timeout=20)
        assert not t.is_alive(), "a read-only open waited for the writer"
        assert result["rows"] == rows_multiset(rows) and result["readonly"]
        assert holder.poll() is None  # the writer was still holding its transaction
    finally:
        holder.kill()
        holder.wait()


def test_readonly_archive_refuses_to_write(tmp_path):
    path = str(tmp_path / "a")
    Archive.create(path, config()).close()
    with Archive(path, readonly=True) as arc:
        with pytest.raises(ArchiveError, match="read-only"):
            arc.load(pa.Table.from_pylist([], schema=SCHEMA), 16)


def test_archives_of_another_format_are_refused_by_version(tmp_path):
    """A format-1 archive (or any other version) is refused with a message naming its version."""
    from ebb.storage.errors import FormatVersionError

    path = tmp_path / "old"
    Archive.create(str(path), config()).close()
    (path / "EBB").write_text('{"format": 1}')
    with pytest.raises(FormatVersionError, match="format version 1; this ebb reads only format version 2"):
        Archive(str(path))
    r = subprocess.run([sys.executable, "-m", "ebb.tools.cli", "stats", str(path)], capture_output=True, text=True)
    assert r.returncode == 1 and "format version 1" in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_a_task_read_without_the_metadata_equals_the_pinned_read_or_fails(tmp_path):
    """What a Spark executor that mounts only the data files does (docs/cluster.md)."""
    from ebb.storage.errors import CorruptionError
    from ebb.storage.read_plan import Probe, Scan
    from ebb.storage.snapshot import read_unpinned

    rng = np.random.default_rng(4)
    with Archive.create(str(tmp_path / "a"), config(block_bytes=256), data_dir=str(tmp_path / "shared")) as arc:
        arc.load(pa.Table.from_pylist(random_rows(rng, 300, 1, 16, 16, 20), schema=SCHEMA), 16)
        with arc.snapshot() as snap:
            tasks = snap.plan(Scan()) + snap.plan(Probe([3]))
            args = snap.read_args()
            assert args[0] == str(tmp_path / "shared")
            for t in tasks:
                want = rows_multiset(pa.Table.from_batches(list(snap.read(t)), snap.schema))
                got = rows_multiset(pa.Table.from_batches(list(read_unpinned(t, *args)), snap.schema))
                assert got == want
        # updates reclaim what the plan named (nothing pinned it): the read fails, never answers
        for T in (18, 20):
            arc.load(pa.Table.from_pylist(random_rows(rng, 50, T - 1, T, 16, 20), schema=SCHEMA), T)
        with pytest.raises(CorruptionError, match=r"data file \S+\.run is missing"):
            for t in tasks:
                list(read_unpinned(t, *args))
