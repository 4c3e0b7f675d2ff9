"""Inputs at the edges, refused in one line with nothing written (issue "hardening", points 3 to
7): times outside ebb's range (ts = -2^63, ``--at`` past 2^63, ``as_of`` likewise), absurd
counts (``plan --updates``, a slide of 2^62), impossible job fields (G = 0, an interval past the
time range, a job file that is a directory or not UTF-8), bad server arguments (port, empty
token, unknown URL scheme) and the RPCs a read-only Flight server does not serve."""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.parquet as pq
import pytest

from ebb.query.flight_server import ArchiveFlightServer, _flight_error
from ebb.query.reader import ArchiveReader
from ebb.storage.archive import Archive
from ebb.storage.errors import ReadError, RejectedBatch, VersionReclaimed
from ebb.storage.timemodel import MAX_TIME

from support import SCHEMA, config, ebb, random_rows, rows_multiset

JOB = """[job]
time_unit = "s"
[[source]]
name = "clicks"
path = "c"
time_column = "t"
key = "user"
[query]
kind = "window"
source = "clicks"
range = {range}
slide = {slide}
[archive]
path = "a"
interval = {interval}
start = 0
{extra}
"""


@pytest.fixture
def archive(tmp_path):
    """A small archive with one bulk load and one update, and its scan as of the last update."""
    path = str(tmp_path / "arc")
    rng = np.random.default_rng(7)
    with Archive.create(path, config()) as arc:
        arc.load(pa.Table.from_pylist(random_rows(rng, 40, 4, 16, 16, 9), SCHEMA), 16)
        arc.load(pa.Table.from_pylist(random_rows(rng, 40, 17, 18, 16, 9), SCHEMA), 18)
        before = rows_multiset(ArchiveReader(arc).scan_table())
    return path, before


@pytest.mark.parametrize("ts", [-(2**63), -(MAX_TIME + 1), MAX_TIME + 1])
def test_times_outside_the_range_are_rejected_whole(archive, ts):
    path, before = archive
    rows = [{"key": 1, "ts": ts, "exp": 19, "payload": "x"}, {"key": 2, "ts": 19, "exp": 21, "payload": "y"}]
    with Archive(path) as arc:
        with pytest.raises(RejectedBatch, match="outside"):
            arc.load(pa.Table.from_pylist(rows, SCHEMA), 20)
        assert arc.state().update_seq == 2
        assert rows_multiset(ArchiveReader(arc).scan_table()) == before


def test_an_update_time_past_the_range_is_refused_and_changes_nothing(archive, tmp_path):
    path, before = archive
    batch = tmp_path / "b.parquet"
    pq.write_table(pa.Table.from_pylist([{"key": 3, "ts": 18, "exp": 30, "payload": "z"}], SCHEMA), batch)
    r = ebb("load", path, batch, "--at", 9223372036854775810)
    assert r.returncode != 0 and "outside ebb's time range" in r.stderr and "\n" not in r.stderr.strip(), r.stderr
    with Archive(path) as arc:
        with pytest.raises(RejectedBatch, match="outside ebb's time range"):
            arc.load(pa.Table.from_pylist([], SCHEMA), MAX_TIME + 1)
        assert arc.state().update_seq == 2
        reader = ArchiveReader(arc)
        assert rows_multiset(reader.scan_table()) == before
        with pytest.raises(ReadError, match="outside ebb's time range"):
            reader.probe(1, as_of=2**63 + 5)
        with pytest.raises(ReadError, match="outside ebb's time range"):
            reader.scan_table(as_of=-(2**63))
    r = ebb("probe", path, "1", "--as-of", 2**64)
    assert r.returncode == 2 and "unexpected" not in r.stderr, r.stderr


def test_plan_refuses_an_absurd_number_of_updates(archive):
    path, _ = archive
    t0 = time.monotonic()
    r = ebb("plan", path, "--updates", 1_000_000_000_000)
    assert r.returncode == 2 and "plan 1 to 100000 updates" in r.stderr, r.stderr
    assert time.monotonic() - t0 < 30
    r = ebb("plan", path, "--updates", 3, "--format", "json")
    assert r.returncode == 0 and len(json.loads(r.stdout)) == 3


def test_a_huge_slide_is_analysed_at_once(tmp_path):
    """window_lifetimes is closed-form: a slide of 2^62 - 1 chronons takes no time (it looped
    over every instant of a slide); past the time range, the field is refused."""
    job = tmp_path / "j.toml"
    job.write_text(JOB.format(range=2**62 - 1, slide=2**62 - 1, interval=10, extra=""))
    t0 = time.monotonic()
    r = ebb("explain", job)
    assert time.monotonic() - t0 < 30 and "unexpected" not in r.stderr, r.stderr
    job.write_text(JOB.format(range=60, slide=2**62, interval=10, extra=""))
    r = ebb("explain", job)
    assert r.returncode == 2 and "query.slide" in r.stderr and "time range" in r.stderr, r.stderr


@pytest.mark.parametrize("field,value,message", [
    ("G", 0, "archive.G: must be a positive number of sub-indices"),
    ("E", 0, "archive.E: must be a positive number of sub-indices"),
    ("n", 0, "archive.n: must be a positive number of sub-indices"),
    ("interval", 2**63 - 1, "archive.interval: 9223372036854775807 is outside ebb's time range"),
    ("start", -(2**63), "archive.start"),
])
def test_impossible_job_fields_are_refused_by_explain(tmp_path, field, value, message):
    job = tmp_path / "j.toml"
    text = JOB.format(range=60, slide=10, interval=10, extra="")
    if field in ("interval", "start"):
        text = text.replace(f"{field} = {10 if field == 'interval' else 0}\n", f"{field} = {value}\n")
    else:
        text += f"{field} = {value}\n"
    job.write_text(text)
    r = ebb("explain", job)
    assert r.returncode == 2 and message in r.stderr, r.stderr


def test_a_job_file_that_is_a_directory_or_not_utf8_is_a_usage_error(tmp_path):
    r = ebb("explain", tmp_path)
    assert r.returncode == 2 and "is a directory" in r.stderr, r.stderr
    bad = tmp_path / "j.toml"
    bad.write_bytes(b"[job]\ntime_unit = \"\xff\xfe\"\n")
    r = ebb("explain", bad)
    assert r.returncode == 2 and "not UTF-8" in r.stderr, r.stderr


def test_server_arguments_are_checked(archive):
    path, _ = archive
    r = ebb("serve", path, "--port", 99999)
    assert r.returncode == 2 and "not a TCP port" in r.stderr, r.stderr
    r = ebb("serve", path, "--token", "", "--port", 0)
    assert r.returncode == 2 and "is empty" in r.stderr, r.stderr
    r = ebb("probe", "--server", "garbage://", "1")
    assert r.returncode == 2 and "the scheme must be one of" in r.stderr and "unexpected" not in r.stderr, r.stderr


def test_a_read_only_server_refuses_writes_and_actions_in_one_line(archive):
    path, _ = archive
    with ArchiveFlightServer(path, port=0) as server:
        client = flight.FlightClient(server.url)
        assert [a.type for a in client.list_actions()] == ["health"]  # the one action, answered in tests/test_tls.py
        with pytest.raises(flight.FlightServerError) as e:
            list(client.do_action(flight.Action("drop", b"")))
        assert "read-only" in str(e.value) and "Traceback" not in str(e.value)
        with pytest.raises(flight.FlightServerError) as e:
            writer, _ = client.do_put(flight.FlightDescriptor.for_command(b"x"), SCHEMA)
            writer.write_table(pa.Table.from_pylist([], SCHEMA))
            writer.close()
        assert "read-only" in str(e.value) and "Traceback" not in str(e.value)
        client.close()


def test_a_reclaimed_version_is_a_retry_naming_the_archive():
    e = _flight_error(VersionReclaimed("archive arc: the version this read started on (update 3) was reclaimed"), "do_get")
    assert isinstance(e, flight.FlightUnavailableError) and "ebb: retry: archive arc" in str(e)


def test_duplicate_column_names_in_a_later_load_are_rejected_whole(archive):
    path, before = archive
    table = pa.Table.from_arrays([pa.array([1]), pa.array([18]), pa.array([30]), pa.array(["a"]), pa.array(["b"])],
                                 names=["key", "ts", "exp", "payload", "payload"])
    with Archive(path) as arc:
        with pytest.raises(RejectedBatch, match="payload"):
            arc.load(table, 20)
        assert arc.state().update_seq == 2
        assert rows_multiset(ArchiveReader(arc).scan_table()) == before


def test_verify_checks_published_copies_through_the_archive_and_the_data_directory(tmp_path):
    """ebb verify DATA_DIR checks the copies published there (it was refused as "not an ebb
    archive"), and ebb verify ARCHIVE checks them too: a damaged copy fails both."""
    path, data = str(tmp_path / "arc"), str(tmp_path / "shared")
    rng = np.random.default_rng(3)
    with Archive.create(path, config(), data_dir=data) as arc:
        arc.load(pa.Table.from_pylist(random_rows(rng, 40, 4, 16, 16, 9), SCHEMA), 16)
    assert ebb("verify", data).returncode == 0 and ebb("verify", path).returncode == 0
    with open(f"{data}/meta/CURRENT") as f:
        copy = f"{data}/meta/{json.load(f)['copy']}/data.mdb"
    size = os.path.getsize(copy)
    with open(copy, "r+b") as f:  # zero every page after the two meta pages: the copy's trees
        f.seek(2 * 4096)
        f.write(bytes(size - 2 * 4096))
    for target in (data, path):
        r = ebb("verify", target)
        assert r.returncode in (5, 6) and "unexpected" not in r.stderr, (target, r.returncode, r.stdout, r.stderr)


def test_read_arguments_of_the_wrong_type_are_one_read_error(archive, tmp_path):
    """A time that is not a number, a range bound or a key collection of the wrong kind is a
    ReadError naming it, on every read path (it was Python's TypeError from a comparison, or a
    string probed character by character); a float ``as_of`` reads as its whole chronons, any
    iterable of keys probes as their list, and many keys probe on the terms of one."""
    path, before = archive
    with ArchiveReader(path) as r:
        r.probe(1), r.probe(2)  # the kept snapshot answers probes from here on
        for read in (lambda: r.probe(1, as_of="18"), lambda: r.probe_many([1], as_of="18"),
                     lambda: r.probe_range(1, 5, as_of="18"), lambda: r.scan_table(as_of="18"),
                     lambda: r.probe(1, as_of=True), lambda: r.probe(1, as_of=float("nan"))):
            with pytest.raises(ReadError, match="as_of must be a time in chronons"):
                read()
        with pytest.raises(ReadError, match="outside ebb's time range"):
            r.probe(1, as_of=float("inf"))
        assert r.scan_table(as_of=18.7).equals(r.scan_table(as_of=18))
        assert rows_multiset(r.scan_table(as_of=np.float64(18.2))) == before
        assert r.probe_many(range(9), as_of=18.5).equals(r.probe_many(list(range(9))))
        for bounds in (("1", 5), (1, b"5"), (True, 5)):
            with pytest.raises(ReadError, match="bound .* is not of the key column's type, int64"):
                r.probe_range(*bounds)
        assert r.probe_range(0.5, 4.5).equals(r.probe_range(1, 4))
        with pytest.raises(ReadError, match="a collection of keys, not one str"):
            r.probe_many("12")
        listed = r.probe_many([1, 2, 5])
        assert listed.num_rows > 0
        for keys in ({5, 1, 2}, (k for k in (2, 1, 5)), {1: "a", 2: "b", 5: "c"}.keys(),
                     [pa.scalar(1), np.int64(2), 5], pa.array([5, 2, 1])):
            assert r.probe_many(keys).equals(listed), keys
        # one key or many, on the same terms: a number the key column cannot hold equals none of
        # its keys, and a whole float probes its integer (pandas makes an integer column with
        # nulls float); a null, a bool or a NaN is no key
        assert r.probe(1.0).equals(r.probe(1)) and r.probe(2.5).num_rows == 0 and r.probe(2**63).num_rows == 0
        some = r.probe_many([1, 5])
        for keys in ([1.0, 2.5, np.float64(5), 2**63], np.array([5.0, 1.0, -0.5]), [pa.scalar(1.0), 5, 2**70],
                     np.array([1, 5, 2**63], np.uint64)):
            assert r.probe_many(keys).equals(some), keys
        for nulls in ([1, None], [1.0, float("nan")], pa.array([1, None])):
            with pytest.raises(ReadError, match="cannot be null"):
                r.probe_many(nulls)
        for wrong in (True, float("nan"), [1]):
            with pytest.raises(ReadError, match="is not of the key column's type, int64"):
                r.probe(wrong)
        for wrong in ([True, False], ["1"], [[1]]):
            with pytest.raises(ReadError, match="probe keys must be numbers"):
                r.probe_many(wrong)
    with ArchiveReader(path, follow=True) as r:  # the served snapshot's path (``ebb serve``)
        with pytest.raises(ReadError, match="as_of must be a time in chronons"):
            r.probe(1, as_of="18")
        assert r.probe(1, as_of=18.5).equals(r.probe(1, as_of=18))
    spath = str(tmp_path / "strings")
    with Archive.create(spath, config()) as arc:
        arc.load(pa.table({"key": ["a", "b"], "ts": [16, 16], "exp": [20, 20], "payload": ["x", "y"]}), 16)
        with ArchiveReader(arc) as r:
            with pytest.raises(ReadError, match="upper bound 5 is not of the key column's type, string"):
                r.probe_range("a", 5)
            assert r.probe_many({"b", "a"}).column("key").to_pylist() == ["a", "b"]
