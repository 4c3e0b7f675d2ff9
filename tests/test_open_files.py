"""Run files a process holds open. A long-running writer or reader (the scheduler, the Flight
server) lets go of the runs each new version replaced, or deleted files and their disk space
would stay alive until the process exits; and a read in flight keeps the file it reads open until
it finishes, whatever newer versions the process sees meanwhile."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import time
import weakref

import numpy as np
import pyarrow as pa
import pytest

from ebb.query.reader import ArchiveReader
from ebb.storage.archive import Archive
from ebb.storage import point_probe
from ebb.storage.errors import CorruptionError
from ebb.storage.files import RELEASER, OpenFiles
from ebb.storage.tuning import RELEASE_DELAY_S

from support import SCHEMA, Oracle, config, random_rows, rows_multiset, table_of


def _held(root: str) -> list[str]:
    """Files under ``root`` this process holds open or mapped that no longer exist."""
    root = os.path.realpath(root) + os.sep
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(root) and target.endswith(" (deleted)"):
            out.append(target)
    with open("/proc/self/maps") as f:
        out += [line.split(maxsplit=5)[5].strip() for line in f
                if line.count(" ") >= 5 and root in line and line.rstrip().endswith("(deleted)")]
    return out


@pytest.mark.parametrize("mode", ["rebuild", "norebuild"])
def test_a_long_running_process_holds_no_replaced_run(tmp_path, mode):
    rng = np.random.default_rng(3)
    path = str(tmp_path / "a")
    writer = Archive.create(path, config(mode=mode, block_bytes=512))
    reader = ArchiveReader(path)  # opened apart from the writer, as the Flight server would be
    oracle = Oracle()
    try:
        for T in range(16, 76, 2):
            rows = random_rows(rng, 150, T - 1, T, 16, 12, tag=str(T))
            writer.load(table_of(rows, SCHEMA), T)
            oracle.load(rows, T)
            # reads through both archives map and open the current runs
            k = int(rng.integers(12))
            assert rows_multiset(reader.probe(k, as_of=T)) == oracle.probe(k, T)
            assert rows_multiset(reader.scan_table(as_of=T)) == oracle.scan(T)
            with ArchiveReader(writer) as same_process:
                assert rows_multiset(same_process.probe(3, as_of=T)) == oracle.probe(3, T)
            assert RELEASER.idle()  # replaced runs are let go of in the background
            assert _held(path) == [], f"after the update at {T}"
    finally:
        reader.close()
        writer.close()


def test_a_let_go_file_stays_open_while_a_read_uses_it(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "r1").write_bytes(bytes(range(256)) * 64)
    files = OpenFiles(str(data))
    src = files.source("r1", sequential=True)
    files.retain(set())
    os.remove(data / "r1")
    assert src.read(256, 4, "r1").to_pybytes() == bytes([0, 1, 2, 3])  # still open: a read in flight
    assert len(_held(str(tmp_path))) == 1
    del src
    assert RELEASER.idle()
    assert _held(str(tmp_path)) == []  # closed with its last reader


def test_a_scan_in_flight_survives_newer_versions(tmp_path):
    rng = np.random.default_rng(5)
    path = str(tmp_path / "a")
    arc = Archive.create(path, config(mode="rebuild", block_bytes=256))
    oracle = Oracle()
    for T in range(16, 40, 2):
        rows = random_rows(rng, 200, T - 1, T, 16, 20, tag=str(T))
        arc.load(table_of(rows, SCHEMA), T)
        oracle.load(rows, T)
    want = oracle.scan(T)
    reader = ArchiveReader(arc)
    old = arc.snapshot()
    batches = reader.scan(as_of=T, snapshot=old)
    got = [next(batches)]
    for T2 in range(T + 2, T + 12, 2):  # every sub-index replaced; the old snapshot pins its runs
        arc.load(table_of(random_rows(rng, 200, T2 - 1, T2, 16, 20, tag=str(T2)), SCHEMA), T2)
    got += list(batches)
    assert rows_multiset([r for b in got for r in b.to_pylist()]) == want
    del got, batches
    old.close()
    arc.load(table_of([], SCHEMA), T2 + 2)  # reclaims the runs the old snapshot pinned
    assert RELEASER.idle()
    assert _held(path) == []
    arc.close()


@pytest.mark.parametrize("error", [OSError(24, "Too many open files"), CorruptionError("data file x.run is missing")])
def test_an_update_maps_its_new_runs_and_a_failure_to_map_them_does_not_undo_it(tmp_path, monkeypatch, error):
    """After its commit an update maps the runs it wrote for the probes that follow; if that
    fails (here: every map refused), the update still reports success, as it has committed."""
    rng = np.random.default_rng(5)
    arc = Archive.create(str(tmp_path / "a"), config(mode="rebuild", block_bytes=512))
    oracle = Oracle()
    try:
        rows = random_rows(rng, 150, 15, 16, 16, 12)
        arc.load(table_of(rows, SCHEMA), 16)
        oracle.load(rows, 16)
        names = {r.name for s in arc.state().subindices for r in s.runs}
        assert names and all(arc.open_files._open.get((n, "map")) for n in names)

        def refuse(name):
            raise error

        monkeypatch.setattr(arc.open_files, "mapped", refuse)
        rows = random_rows(rng, 150, 17, 18, 16, 12, tag="b")
        seq = arc.state().update_seq
        arc.load(table_of(rows, SCHEMA), 18)  # does not raise
        assert arc.state().update_seq == seq + 1
        oracle.load(rows, 18)
        monkeypatch.undo()
        with ArchiveReader(arc) as reader:
            assert rows_multiset(reader.scan_table(as_of=18)) == oracle.scan(18)
            assert rows_multiset(reader.probe(3, as_of=18)) == oracle.probe(3, 18)
    finally:
        arc.close()


@pytest.mark.parametrize("keys", ["int", "str"])
def test_a_result_kept_after_its_read_never_changes(tmp_path, keys):
    """Keyed reads view mapped run files in place; the tables they return own their memory, so
    one kept while NoRebuild updates punch out the blocks it came from still holds its rows."""
    rng = np.random.default_rng(9)
    schema = SCHEMA.set(0, SCHEMA.field(0).with_type(pa.string())) if keys == "str" else SCHEMA
    key = (lambda k: f"k{k:04d}") if keys == "str" else int
    arc = Archive.create(str(tmp_path / "a"), config(mode="norebuild", G=1, E=1))  # large blocks: read in place

    def load(rows, T):
        arc.load(table_of([{**r, "key": key(r["key"])} for r in rows], schema), T)

    load(random_rows(rng, 4000, 1, 16, 16, 400), 16)  # the one run holding keys below 400
    with ArchiveReader(arc) as reader:
        kept = [reader.probe_range(key(3), key(3)), reader.probe(key(3))]
        before = [t.to_pylist() for t in kept]
        assert len(before[0]) > 3
        for T in range(18, 32, 2):  # the run's first sections expire and are punched out
            load([{**r, "key": 1000 + r["key"]} for r in random_rows(rng, 50, T - 1, T, 16, 400)], T)
        assert [t.to_pylist() for t in kept] == before
    arc.close()


def test_a_process_that_exits_while_maps_are_being_let_go_of_exits_cleanly(tmp_path):
    """The releaser frees maps in a daemon thread; a process that exits mid-release used to abort
    (exit -6, "terminate called without an active exception") when that thread wanted the GIL back
    inside Arrow's buffer destructor. The process now waits for the release at exit."""
    data = tmp_path / "run"
    data.write_bytes(os.urandom(1 << 20))
    program = (
        "import os, sys\n"
        "from ebb.storage.files import MappedSource, RELEASER\n"
        f"path = {str(data)!r}\n"
        "sources = [MappedSource(os.open(path, os.O_RDONLY), 1 << 20) for _ in range(3000)]\n"
        "RELEASER.release(sources)\n"
        "del sources\n"
        "import time; time.sleep(0.002)\n"  # the release starts: the exit comes in the middle of it
        "sys.exit(0)\n")
    for _ in range(5):  # without the wait at exit, most runs aborted
        done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
        assert (done.returncode, done.stderr) == (0, "")


class _Held:
    """Something a replaced version held (a stand-in: only its lifetime is watched)."""


def test_the_releaser_waits_before_letting_go_unless_asked_to_finish():
    item = _Held()
    gone = weakref.ref(item)
    RELEASER.release([item])
    del item
    gc.collect()
    assert gone() is not None  # within RELEASE_DELAY_S of the handover: still held, off the request path
    assert RELEASER.idle()  # waiting for it cuts the delay short
    gc.collect()
    assert gone() is None


def test_the_releaser_keeps_up_with_versions_that_switch_faster_than_its_delay():
    items = [_Held() for _ in range(80)]
    gone = [weakref.ref(x) for x in items]
    for x in items:  # 80 handovers within one delay: one wait lets go of them all (not one a wait: 4 s)
        RELEASER.release([x])
    del items, x
    deadline = time.monotonic() + 10 * RELEASE_DELAY_S
    while any(g() is not None for g in gone) and time.monotonic() < deadline:
        time.sleep(0.01)
        gc.collect()
    assert all(g() is None for g in gone)


@pytest.mark.skipif(not point_probe.NATIVE, reason="runs are prepared for the native point probe only")
def test_a_new_version_reuses_the_runs_it_kept_and_holds_no_other(tmp_path):
    """A reader prepares a run for point probes once: each new version's run set takes the runs
    the previous one had prepared and still reads, and holds none that it no longer reads."""
    rng = np.random.default_rng(5)
    path = str(tmp_path / "a")
    writer = Archive.create(path, config(mode="norebuild", block_bytes=512))
    reader = ArchiveReader(path)
    oracle = Oracle()
    before: dict = {}
    try:
        for T in range(16, 60, 2):
            rows = random_rows(rng, 150, T - 1, T, 10, 12, tag=str(T))
            writer.load(table_of(rows, SCHEMA), T)
            oracle.load(rows, T)
            k = int(rng.integers(12))
            assert rows_multiset(reader.probe(k, as_of=T)) == oracle.probe(k, T)
            prepared = dict(reader.archive.reads.prepared_runs)
            current = reader.archive.state().run_names()
            assert set(prepared) == current
            kept = current & set(before)
            assert all(prepared[name] is before[name] for name in kept), f"after the update at {T}"
            before = prepared
        assert kept, "no run outlived an update: nothing was reused"
    finally:
        reader.close()
        writer.close()


def _resident_pages(m) -> int:
    """How many pages of map ``m`` are in the page cache (mincore)."""
    import ctypes

    page = os.sysconf("SC_PAGESIZE")
    n = (len(m) + page - 1) // page
    vec = (ctypes.c_ubyte * n)()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    assert libc.mincore(ctypes.c_void_p(np.frombuffer(m, np.uint8).ctypes.data), len(m), vec) == 0
    return sum(v & 1 for v in vec)


def _mapped_kib(path: str) -> int:
    """The pages of ``path`` this process has mapped in (Rss of its maps, in KiB)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            if "-" in line.split(" ", 1)[0]:
                inside = line.rstrip().endswith(path)
            elif inside and line.startswith("Rss:"):
                total += int(line.split()[1])
    return total


@pytest.mark.skipif(not point_probe.NATIVE, reason="maps in resident pages through the native module")
def test_a_newly_mapped_run_has_its_cached_pages_mapped_in_and_nothing_read(tmp_path):
    """The releaser maps in the pages of a new map that the page cache holds (so the probes after
    a commit take no page fault for them), and only those: it reads nothing from disk."""
    from ebb.storage.files import MappedSource

    page = os.sysconf("SC_PAGESIZE")
    path = str(tmp_path / "r")
    with open(path, "wb") as f:
        f.write(os.urandom(64 * page))
        f.flush()
        os.fsync(f.fileno())
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # out of the cache (where the file system can)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
    os.pread(fd, 16 * page, 0)
    os.pread(fd, 8 * page, 40 * page)
    src = MappedSource(fd, 64 * page)
    m, _ = src.native()
    resident = _resident_pages(m)
    assert resident >= 24
    assert _mapped_kib(path) == 0
    mapped = src.map_resident()
    if mapped < 0:
        pytest.skip("the kernel has no MADV_POPULATE_READ (Linux 5.14)")
    assert mapped == resident
    assert _resident_pages(m) == resident  # nothing read
    assert _mapped_kib(path) * 1024 == resident * page
    del m
    src.close()


@pytest.mark.skipif(not point_probe.NATIVE, reason="maps in resident pages through the native module")
def test_a_reader_maps_in_the_runs_a_commit_wrote_before_its_next_probe(tmp_path):
    rng = np.random.default_rng(9)
    path = str(tmp_path / "a")
    writer = Archive.create(path, config(mode="norebuild", block_bytes=4096))
    reader = ArchiveReader(path)
    try:
        writer.load(table_of(random_rows(rng, 20000, 15, 16, 16, 50, tag="x" * 100), SCHEMA), 16)
        reader.probe(3, as_of=16)  # maps the runs the commit wrote
        assert RELEASER.idle()
        runs = sorted(os.listdir(os.path.join(path, "data")))
        assert runs
        for name in runs:  # the probe touched a few pages of each
            size = os.path.getsize(os.path.join(path, "data", name))
            assert size > 64 * os.sysconf("SC_PAGESIZE")
            assert _mapped_kib(name) * 1024 >= size - size % os.sysconf("SC_PAGESIZE"), name
    finally:
        reader.close()
        writer.close()


def _limits_in_a_process(soft: int, hard: int) -> tuple[int, int]:
    """(OpenFiles' default limit, the soft descriptor limit after) in a new process started
    with descriptor limits (soft, hard)."""
    import resource

    code = ("import resource; from ebb.storage.files import OpenFiles; "
            "print(OpenFiles('.').limit, resource.getrlimit(resource.RLIMIT_NOFILE)[0])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard)))
    limit, after = out.stdout.split()
    return int(limit), int(after)


def test_the_open_files_limit_raises_the_descriptor_limit_toward_the_hard_one():
    """The native probe maps every run of a version at once, up to half the open-files limit:
    a process started with the usual soft limit of 1024 raises it (to 16,384 where the hard
    limit allows) and keeps half of it for run files; where the hard limit is 1024 too, 512."""
    import resource

    from ebb.storage.tuning import OPEN_FILES_MAX, OPEN_FILES_MIN

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"the hard descriptor limit here is {hard}")
    raised = 2 * OPEN_FILES_MAX if hard == resource.RLIM_INFINITY else min(hard, 2 * OPEN_FILES_MAX)
    assert _limits_in_a_process(1024, hard) == (min(OPEN_FILES_MAX, raised // 2), raised)
    assert _limits_in_a_process(1024, 1024) == (OPEN_FILES_MIN, 1024)
    assert _limits_in_a_process(256, 256) == (OPEN_FILES_MIN, 256)  # as before: 512, whatever the limit
