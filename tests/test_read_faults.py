"""Read faults never become a wrong row or a dead process (LevelDB's Env tests, for reads).

Every read of a run file makes its system calls through ``files.READS``; ``faults.ReadFaults``
fails one of them (open, fstat, pread, mmap) with an errno from its n-th use on, or makes every
pread short. For each read path (the native and the planned point probe, range probes, scans as
batches and as a RecordBatchReader, Flight ``do_get``, the Spark source's task read) and each
fault, the read either returns exactly the oracle's rows or fails with ebb's error
(``DataIOError`` for a failed call, ``CorruptionError`` for a file shorter than its descriptor;
Flight: an internal error that names the problem; a RecordBatchReader: Arrow's error quoting
ebb's), and rows streamed before the failure are all the oracle's. A short read is no error.

A run file truncated under its memory map (the native probe's and the planned keyed read's)
must fail cleanly, not kill the process with SIGBUS: those cases run in a forked child.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import traceback
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest

from ebb.query.reader import ArchiveReader
from ebb.storage import files, point_probe
from ebb.storage.archive import Archive
from ebb.storage.errors import CorruptionError, DataIOError, EbbError
from ebb.storage.faults import ReadFaults

from support import SCHEMA, Oracle, config, random_rows, rows_multiset, table_of

PROBES, RANGES = (0, 3, 7, 11), ((0, 5), (6, 40))
FAULTS = [("open", errno.EIO, 1), ("open", errno.EIO, 3), ("fstat", errno.EIO, 1), ("fstat", errno.EIO, 4),
          ("preadv", errno.EIO, 1), ("preadv", errno.EIO, 3), ("mmap", errno.ENOMEM, 1), ("mmap", errno.EIO, 2),
          ("preadv", None, 1)]
IDS = [f"{c}-{'short' if e is None else errno.errorcode[e]}-{n}" for c, e, n in FAULTS]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A NoRebuild archive of small blocks (with page sums) after a bulk load and three updates,
    its oracle and the last update's time."""
    path = str(tmp_path_factory.mktemp("readfaults") / "arc")
    rng = np.random.default_rng(29)
    oracle = Oracle()
    with Archive.create(path, config(mode="norebuild", block_bytes=512)) as arc:
        rows = random_rows(rng, 600, 1, 16, 16, 12, "bulk")
        arc.load(table_of(rows, SCHEMA), 16)
        oracle.load(rows, 16)
        for t in (18, 20, 22):
            rows = random_rows(rng, 150, t - 1, t, 16, 12, f"u{t}")
            arc.load(table_of(rows, SCHEMA), t)
            oracle.load(rows, t)
    return path, oracle, 22


# -- the read paths: each yields (what, rows, complete) as answers arrive ------------------------------
def _probes(path):
    with ArchiveReader(path) as r:
        for k in PROBES:
            yield ("probe", k), r.probe(k), True


def _ranges(path):
    with ArchiveReader(path) as r:
        for rg in RANGES:
            yield ("range", rg), r.probe_range(*rg), True


def _scan_batches(path):
    with ArchiveReader(path) as r:
        for b in r.scan_batches():
            yield ("scan",), b, False
        yield ("scan",), None, True


def _scan_reader(path):
    with ArchiveReader(path) as r:
        for b in r.scan():
            yield ("scan",), b, False
        yield ("scan",), None, True


def _flight(path):
    from ebb.query.flight_client import FlightArchiveClient
    from ebb.query.flight_server import ArchiveFlightServer

    with ArchiveFlightServer(path, port=0) as server, FlightArchiveClient(server.url) as c:
        for k in PROBES:
            yield ("probe", k), c.probe(k), True
        for rg in RANGES:
            yield ("range", rg), c.probe_range(*rg), True
        for b in c.scan():
            yield ("scan",), b, False
        yield ("scan",), None, True


def _spark(path, plans):
    """The Spark source's executor-side read of partitions planned before the fault."""
    for what, reader, parts in plans:
        for p in parts:
            for b in reader.read(p):
                yield what, b, False
        yield what, None, True


def _spark_plans(path):
    """(what, EbbReader, partitions) of a scan, a probe and a key range, planned on the driver side."""
    from pyspark.sql.pandas.types import from_arrow_schema
    from pyspark.sql.datasource import EqualTo, GreaterThanOrEqual, LessThanOrEqual

    from ebb.query.spark_source import EbbDataSource

    out = []
    for what, filters in ((("scan",), []), (("probe", 3), [EqualTo(("key",), 3)]),
                          (("range", (6, 40)), [GreaterThanOrEqual(("key",), 6), LessThanOrEqual(("key",), 40)])):
        reader = EbbDataSource({"path": path}).reader(from_arrow_schema(SCHEMA))
        assert not list(reader.pushFilters(filters))
        out.append((what, reader, reader.partitions()))
    return out


def _expected(oracle: Oracle, t: int, what: tuple) -> Counter:
    if what[0] == "probe":
        return oracle.probe(what[1], t)
    if what[0] == "range":
        return oracle.probe_range(*what[1], t)
    return oracle.scan(t)


def _clean(e: BaseException, path: str) -> bool:
    """Whether ``e`` is how this read path reports a failed read: ebb's error, or (through
    Arrow's stream interface or Flight) one that carries ebb's words."""
    if isinstance(e, flight.FlightError):
        return isinstance(e, flight.FlightInternalError) and "ebb: the server cannot answer" in str(e) \
            and "Traceback" not in str(e) and path not in str(e)
    if isinstance(e, (pa.ArrowInvalid, pa.ArrowIOError)) and not isinstance(e, EbbError):
        return "cannot be read" in str(e) or "file ends" in str(e)
    return isinstance(e, (DataIOError, CorruptionError))


def _check(reads, oracle: Oracle, t: int, path: str) -> BaseException | None:
    """Consumes ``reads``: every complete answer is the oracle's, and the rows of one streamed
    before a failure are all the oracle's. The failure, if any (it must be clean)."""
    partial: dict[tuple, Counter] = {}
    try:
        for what, rows, complete in reads:
            if isinstance(rows, pa.RecordBatch):
                rows = pa.Table.from_batches([rows])
            got = partial.pop(what, Counter()) + (rows_multiset(rows) if rows is not None else Counter())
            want = _expected(oracle, t, what)
            if complete:
                assert got == want, f"{what}: a wrong answer"
            else:
                assert not got - want, f"{what}: rows the oracle does not hold"
                partial[what] = got
    except AssertionError:
        raise
    except BaseException as e:  # noqa: BLE001 - every other outcome must be a clean error
        assert _clean(e, path), f"not a clean error: {type(e).__name__}: {e}\n{traceback.format_exc()}"
        return e
    return None


def _faulty(monkeypatch, call, err, nth) -> ReadFaults:
    env = ReadFaults(call, err, nth)
    monkeypatch.setattr(files, "READS", env)
    return env


def _fired(env: ReadFaults, call: str, err, nth: int) -> bool:
    return err is not None and env.calls[call] >= nth


# -- faulty system calls --------------------------------------------------------------------------
@pytest.mark.parametrize("call,err,nth", FAULTS, ids=IDS)
@pytest.mark.parametrize("path_kind", ["native_probe", "planned_probe", "range_probe", "scan_batches", "scan"])
def test_library_reads_fail_cleanly(built, monkeypatch, path_kind, call, err, nth):
    path, oracle, t = built
    if path_kind == "native_probe" and not point_probe.NATIVE:
        pytest.skip("the native module is not built")
    if path_kind == "planned_probe":
        monkeypatch.setattr(point_probe, "NATIVE", False)
    reads = {"native_probe": _probes, "planned_probe": _probes, "range_probe": _ranges,
             "scan_batches": _scan_batches, "scan": _scan_reader}[path_kind]
    env = _faulty(monkeypatch, call, err, nth)
    failed = _check(reads(path), oracle, t, path)
    assert (failed is not None) == _fired(env, call, err, nth), f"calls {env.calls}, failure {failed!r}"
    if failed is not None and path_kind != "scan":
        assert isinstance(failed, DataIOError) and failed.errno == err


@pytest.mark.parametrize("call,err,nth", FAULTS, ids=IDS)
def test_flight_do_get_fails_cleanly(built, monkeypatch, call, err, nth):
    path, oracle, t = built
    env = _faulty(monkeypatch, call, err, nth)
    failed = _check(_flight(path), oracle, t, path)
    assert (failed is not None) == _fired(env, call, err, nth), f"calls {env.calls}, failure {failed!r}"
    if failed is not None:
        assert "cannot be read" in str(failed)


@pytest.mark.parametrize("call,err,nth", FAULTS, ids=IDS)
def test_spark_task_read_fails_cleanly(built, monkeypatch, call, err, nth):
    pytest.importorskip("pyspark.sql.datasource")
    path, oracle, t = built
    plans = _spark_plans(path)  # on the driver, before the fault
    env = _faulty(monkeypatch, call, err, nth)
    failed = _check(_spark(path, plans), oracle, t, path)
    assert (failed is not None) == _fired(env, call, err, nth), f"calls {env.calls}, failure {failed!r}"
    if failed is not None:
        assert isinstance(failed, DataIOError) and failed.errno == err


# -- a file truncated under its map ---------------------------------------------------------------------
def _in_child(fn) -> None:
    """Runs ``fn`` in a forked child, so that a SIGBUS or a segfault fails this test and not the
    run; its assertion message, if any, comes back through a pipe."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        code = 0
        try:
            fn()
        except BaseException:  # noqa: BLE001 - reported to the parent
            os.write(w, traceback.format_exc().encode()[-4000:])
            code = 1
        os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        message = f.read().decode()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        pytest.fail(f"the read killed the process with {signal.Signals(os.WTERMSIG(status)).name}")
    assert os.WEXITSTATUS(status) == 0, message


def _truncate_runs(path: str, keep: float) -> None:
    data = os.path.join(path, files.DATA_DIR)
    for name in os.listdir(data):
        if files.parse_run_file(name) is not None:
            p = os.path.join(data, name)
            os.truncate(p, int(os.path.getsize(p) * keep))


@pytest.mark.parametrize("keep", [0.0, 0.5, 0.97])
@pytest.mark.parametrize("native", [True, False], ids=["native", "planned"])
def test_file_truncated_under_its_map(built, tmp_path, keep, native):
    """Runs mapped by earlier probes, then truncated: the next reads fail with CorruptionError
    (both paths check the file's size with fstat before touching the map), or return the
    oracle's rows (what they read lies before the cut)."""
    if native and not point_probe.NATIVE:
        pytest.skip("the native module is not built")
    src, oracle, t = built
    path = str(tmp_path / "arc")
    shutil.copytree(src, path)

    def child():
        point_probe.NATIVE = native
        with ArchiveReader(path) as r:
            for k in PROBES:
                assert rows_multiset(r.probe(k)) == oracle.probe(k, t)
            _truncate_runs(path, keep)
            failures = 0
            for k in PROBES:
                try:
                    assert rows_multiset(r.probe(k)) == oracle.probe(k, t)
                except CorruptionError as e:
                    assert "file ends" in str(e), e
                    failures += 1
            for rg in RANGES:
                try:
                    assert rows_multiset(r.probe_range(*rg)) == oracle.probe_range(*rg, t)
                except CorruptionError:
                    failures += 1
            assert failures or keep > 0.9

    _in_child(child)


def test_native_probe_reports_a_failed_fstat(built, tmp_path):
    """The native probe's own fstat (before it touches a map) failing is a DataIOError: here its
    descriptor is closed under it (EBADF)."""
    if not point_probe.NATIVE:
        pytest.skip("the native module is not built")
    path, oracle, t = built

    def child():
        with ArchiveReader(path) as r:
            assert rows_multiset(r.probe(3)) == oracle.probe(3, t)
            for src in list(r.archive.reads.open_files._open.values()):
                os.close(src.fd)
            with pytest.raises(DataIOError) as e:
                r.probe(3)
            assert e.value.errno == errno.EBADF and "cannot be read" in str(e.value)
            os._exit(0)  # the sources' descriptors are gone: skip their closing

    _in_child(child)
