"""The Arrow Flight service (ebb serve): answers equal the library's and the brute-force oracle's
for probes, range probes and scans at several as_of; scans stream; metadata describes the
archive; bad requests are clear errors and the server keeps serving; a token is enforced on every
call; the CLI serves and probes through it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest

from ebb.query.flight_client import FlightArchiveClient, error_message
from ebb.query.flight_protocol import BadRequest, ReadRequest, decode
from ebb.query.flight_server import ArchiveFlightServer
from ebb.query.reader import ArchiveReader
from ebb.storage import point_probe
from ebb.storage.archive import Archive
from ebb.storage.errors import EXIT_USAGE, ReadError

from support import SCHEMA, Oracle, config, ebb, random_rows, rows_multiset, table_of

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A 2x2 round-robin NoRebuild archive after a bulk load and 5 updates, with its oracle."""
    path = str(tmp_path_factory.mktemp("flight") / "arc")
    rng = np.random.default_rng(11)
    oracle = Oracle()
    with Archive.create(path, config(mode="norebuild")) as arc:
        rows = random_rows(rng, 400, 1, 16, 16, 40, "b")
        arc.load(table_of(rows, SCHEMA), 16)
        oracle.load(rows, 16)
        for T in range(18, 28, 2):
            rows = random_rows(rng, 80, T - 1, T, 16, 40, f"u{T}-")
            arc.load(table_of(rows, SCHEMA), T)
            oracle.load(rows, T)
    return path, oracle, 26


@pytest.fixture(scope="module")
def server(built):
    s = ArchiveFlightServer(built[0], port=0)
    yield s
    s.close()


@pytest.fixture(scope="module")
def secured(built):
    s = ArchiveFlightServer(built[0], port=0, token=TOKEN)
    yield s
    s.close()


def test_binds_loopback_by_default(server):
    assert server.url.startswith("grpc://127.0.0.1:") and server.port > 0


def test_probes_ranges_and_scans_match_library_and_oracle(built, server):
    path, oracle, last = built
    c = FlightArchiveClient(server.url)
    with ArchiveReader(path) as lib:
        for as_of in (None, last, last + 1, last + 5, last + 15, last + 40):
            t = last if as_of is None else as_of
            for key in (0, 3, 17, 39, 1000, -5):
                got, state = c.read(ReadRequest("probe", as_of, key=key))
                assert rows_multiset(got) == rows_multiset(lib.probe(key, as_of)) == oracle.probe(key, t), (key, as_of)
                assert state == {"update_seq": 6, "last_update_time": last, "as_of": t}
            for lo, hi in ((0, 9), (10, 10), (5, 30), (-100, 100), (20, 3)):
                got = c.probe_range(lo, hi, as_of)
                assert rows_multiset(got) == rows_multiset(lib.probe_range(lo, hi, as_of)) == oracle.probe_range(lo, hi, t)
            # open bounds
            assert rows_multiset(c.probe_range(None, 7, as_of)) == oracle.probe_range(-1, 7, t)
            assert rows_multiset(c.probe_range(30, None, as_of)) == oracle.probe_range(30, 10**9, t)
            got = c.scan_table(as_of)
            assert got.schema == lib.result_schema()
            assert rows_multiset(got) == rows_multiset(lib.scan_table(as_of)) == oracle.scan(t)
            assert len(got) > 0 if t < last + 16 else len(got) == 0


def test_probe_many_is_every_probe_in_one_request(built, server):
    """A probe_many ticket answers as the library's probe_many and the oracle (keys repeated,
    absent and outside the stored range), ordered by (key, exp, ts); its keys are checked
    against the archive's key type, and a ticket with too many keys is refused."""
    path, oracle, last = built
    c = FlightArchiveClient(server.url)
    keys = [5, 3, 39, 1000, -5, 3, 17, 0] + list(range(40))
    with ArchiveReader(path) as lib:
        for as_of in (None, last + 3):
            t = last if as_of is None else as_of
            got = c.probe_many(np.array(keys), as_of)
            assert got.equals(lib.probe_many(keys, as_of))
            assert rows_multiset(got) == sum((oracle.probe(k, t) for k in set(keys)), Counter())
            assert got["key"].to_pylist() == sorted(got["key"].to_pylist())
    assert c.probe_many([]).num_rows == 0
    for bad, fragment in (([1, "x"], "keys must be integers"), ([1, True], "keys must be integers"),
                          ([2**63], "keys must be integers"), ([None], "keys must be integers")):
        with pytest.raises(flight.FlightServerError, match=fragment):
            c.probe_many(bad)
    with pytest.raises(flight.FlightServerError, match="at most 100000 keys"):
        c.probe_many(range(100_001))
    assert rows_multiset(c.probe(3)) == oracle.probe(3, last)


def test_numpy_scalars_are_the_values_they_hold(built, server):
    """Keys, bounds and times taken from an array (numpy or Arrow scalars) ask what their values ask."""
    path, oracle, last = built
    c = FlightArchiveClient(server.url)
    for key in (3, 17):
        assert c.probe(np.int64(key), np.int64(last + 1)).equals(c.probe(key, last + 1))
        assert rows_multiset(c.probe(np.int32(key))) == oracle.probe(key, last)
    assert c.probe_range(np.int64(5), np.uint8(30)).equals(c.probe_range(5, 30))
    assert c.probe_many([np.int64(3), np.int16(17), 3]).equals(c.probe_many([3, 17]))
    assert c.probe(pa.array([3])[0]).equals(c.probe(3))  # an Arrow scalar, too


def test_scan_streams_batch_by_batch(built, server):
    path, oracle, last = built
    # the server hands gRPC a generator over the bucket files, not a materialised table
    stream = server.do_get(None, flight.Ticket(ReadRequest("scan").encode()))
    assert isinstance(stream, flight.GeneratorStream)
    del stream
    batches = list(FlightArchiveClient(server.url).scan())
    assert len(batches) > 1  # one or more per non-empty sub-index, as the reader produces them
    assert rows_multiset(pa.Table.from_batches(batches)) == oracle.scan(last)


def test_flight_info_and_list_flights_describe_the_archive(built, server):
    path, oracle, last = built
    c = FlightArchiveClient(server.url)
    info = c.info()
    with Archive(path) as arc:
        st = arc.stats()
    assert info["last_update_time"] == last == st["last_update_time"]
    assert info["update_seq"] == st["updates"] == 6
    assert info["records"] == st["records"] == sum(oracle.scan(last).values())
    assert info["bytes"] == st["bytes"]
    assert info["schema"] == st["schema"]
    assert [s["records"] for s in info["subindices"]] == [s["records"] for s in st["subindices"]]
    assert info["layout"] == "doubly partitioned 2x2, round-robin" and info["n"] == 4
    assert path not in json.dumps(info)  # nothing about the server's filesystem leaks
    with Archive(path) as arc:
        assert c.schema() == arc.schema
    (fi,) = c.flights()
    assert fi.total_records == info["records"] and fi.total_bytes == info["bytes"]
    assert fi.schema == c.schema()
    # the endpoint's ticket is directly usable
    table = c._client.do_get(fi.endpoints[0].ticket).read_all()
    assert rows_multiset(table) == oracle.scan(last)
    probe_info = c._client.get_flight_info(flight.FlightDescriptor.for_command(ReadRequest("probe", key=3).encode()))
    assert probe_info.total_records == -1
    assert rows_multiset(c._client.do_get(probe_info.endpoints[0].ticket).read_all()) == oracle.probe(3, last)


BAD = [
    (b"{not json", "not valid JSON"),
    (b"[1, 2]", "must be a JSON object"),
    (b'{"kind": "delete", "key": 1}', 'unknown ticket kind "delete"'),
    (b'{"kind": "probe"}', 'needs a non-null "key"'),
    (b'{"kind": "probe", "key": "3"}', "key must be an integer"),
    (b'{"kind": "probe", "key": true}', "key must be an integer"),
    (b'{"kind": "probe_range", "lo": 1.5, "hi": 3}', "lo must be an integer"),
    (b'{"kind": "scan", "as_of": 20}', "as_of 20 is before 26, the oldest instant this archive can still read"),
    (b'{"kind": "scan", "as_of": "soon"}', "as_of must be an integer"),
    (b'{"kind": "scan", "path": "/etc"}', "cannot name a path"),
    (b'{"kind": "scan", "archive": "/tmp/other"}', "unknown field(s) archive"),
    (b'{"kind": "probe", "key": 99999999999999999999}', "does not fit in int64"),
    (b"\xff\xfe", "not valid JSON"),
]


def test_bad_tickets_are_clear_errors_and_the_server_keeps_serving(built, server):
    path, oracle, last = built
    c = FlightArchiveClient(server.url)
    for raw, fragment in BAD:
        with pytest.raises(flight.FlightServerError) as e:
            c._client.do_get(flight.Ticket(raw)).read_all()
        assert fragment in error_message(e.value), (raw, str(e.value))
        assert "Traceback" not in str(e.value)
    with pytest.raises(flight.FlightServerError, match="command descriptor"):
        c._client.get_flight_info(flight.FlightDescriptor.for_path("etc", "passwd"))
    with pytest.raises(flight.FlightServerError, match="the oldest instant this archive can still read"):
        c._client.get_flight_info(flight.FlightDescriptor.for_command(b'{"kind": "probe", "key": 1, "as_of": 0}'))
    # still serving, with the right answers
    assert rows_multiset(c.probe(3)) == oracle.probe(3, last)
    assert rows_multiset(c.scan_table()) == oracle.scan(last)


def test_a_bad_ticket_is_a_read_error():
    """BadRequest is the ReadError of the Flight layer: the server answers it, as any ReadError,
    with a FlightServerError (above); a CLI that met one would exit with a usage error."""
    with pytest.raises(BadRequest, match="ticket is not valid JSON") as e:
        decode(b"{")
    assert isinstance(e.value, ReadError) and e.value.exit_code == EXIT_USAGE


def test_token_is_required_on_every_call(built, secured):
    path, oracle, last = built
    for token in (None, "wrong", TOKEN + "x", TOKEN[:-1]):
        c = FlightArchiveClient(secured.url, token=token)
        for call in (lambda: c.probe(3), lambda: c.scan_table(), lambda: c.info(), lambda: c.flights(), lambda: c.schema()):
            with pytest.raises(flight.FlightUnauthenticatedError, match="missing or wrong token"):
                call()
    c = FlightArchiveClient(secured.url, token=TOKEN)
    assert rows_multiset(c.probe(3)) == oracle.probe(3, last)
    assert rows_multiset(c.probe_range(2, 8, last + 2)) == oracle.probe_range(2, 8, last + 2)
    assert c.info()["records"] == sum(oracle.scan(last).values())


def test_empty_archive_and_string_keys(tmp_path):
    empty = str(tmp_path / "empty")
    Archive.create(empty, config()).close()
    with ArchiveFlightServer(empty, port=0) as s:
        c = FlightArchiveClient(s.url)
        assert c.info()["schema"] is None and c.info()["last_update_time"] is None
        t, state = c.read(ReadRequest("scan"))
        assert t.num_rows == 0 and state["update_seq"] == 0
        assert c.probe(1).num_rows == 0

    path = str(tmp_path / "str")
    schema = pa.schema([pa.field("key", pa.string(), False), pa.field("ts", pa.int64(), False),
                        pa.field("exp", pa.int64(), False), ("v", pa.float64())])
    rng = np.random.default_rng(5)
    rows = [{"key": f"k{int(k):02d}", "ts": int(ts), "exp": int(ts + life), "v": float(i)}
            for i, (k, ts, life) in enumerate(zip(rng.integers(0, 30, 300), rng.integers(1, 17, 300), rng.integers(1, 17, 300)))]
    oracle = Oracle()
    with Archive.create(path, config(mode="rebuild", G=3, E=2)) as arc:
        arc.load(pa.Table.from_pylist(rows, schema=schema), 16)
    oracle.load(rows, 16)
    s = ArchiveFlightServer(path, port=0)
    try:
        c = FlightArchiveClient(s.url)
        opened, snapshot = [], s.archive.snapshot
        s.archive.snapshot = lambda: opened.append(1) or snapshot()
        for key in ("k03", "k29", "nope", ""):
            assert rows_multiset(c.probe(key)) == oracle.probe(key, 16)
        # with the native probe, string keys too are answered by the follower's prepared snapshot;
        # without it no run set is prepared, and each probe reads on a snapshot of its own
        assert opened == ([] if point_probe.NATIVE else [1] * 4)
        assert rows_multiset(c.probe_range("k05", "k12", 20)) == oracle.probe_range("k05", "k12", 20)
        assert rows_multiset(c.scan_table(17)) == oracle.scan(17)
        with pytest.raises(flight.FlightServerError, match="key must be a string"):
            c.probe(3)
        with pytest.raises(flight.FlightServerError, match="longer than 510 bytes"):
            c.probe("x" * 600)
    finally:
        s.close()


def _start_serve(path: str, *extra: str) -> tuple[subprocess.Popen, str]:
    p = subprocess.Popen([sys.executable, "-m", "ebb.tools.cli", "serve", path, "--port", "0", *extra],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    assert "serving" in line, (line, p.stderr.read() if p.poll() is not None else "")
    return p, line.split(" at ")[1].split()[0]


def test_cli_serve_and_probe_through_the_server(built):
    path, oracle, last = built
    p, url = _start_serve(path, "--token", TOKEN)
    try:
        assert url.startswith("grpc://127.0.0.1:")
        local = ebb("probe", path, 3, "--format", "jsonl")
        remote = ebb("probe", "--server", url, 3, "--token", TOKEN, "--format", "jsonl")
        assert local.returncode == remote.returncode == 0, remote.stderr
        assert sorted(remote.stdout.splitlines()) == sorted(local.stdout.splitlines())
        assert len(remote.stdout.splitlines()) == sum(oracle.probe(3, last).values()) > 0

        rng = ebb("probe", "--server", url, 2, "--to", 9, "--as-of", last + 3, "--format", "jsonl", env={"EBB_FLIGHT_TOKEN": TOKEN})
        assert rng.returncode == 0, rng.stderr
        got = [json.loads(x) for x in rng.stdout.splitlines()]
        assert rows_multiset(got) == oracle.probe_range(2, 9, last + 3)

        r = ebb("probe", "--server", url, 3)
        assert r.returncode == 1 and "missing or wrong token" in r.stderr
        r = ebb("probe", "--server", url, 3, "--token", TOKEN, "--as-of", 1)
        assert r.returncode == 1 and "the oldest instant this archive can still read" in r.stderr
        r = ebb("probe", "--server", url, path, 3)
        assert r.returncode == 2 and "either PATH or --server" in r.stderr
        r = ebb("probe", 3)
        assert r.returncode == 2 and "needs PATH KEY" in r.stderr
    finally:
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
    assert p.returncode == 0 and "server stopped" in err
    r = ebb("probe", "--server", url, 3, "--token", TOKEN)
    assert r.returncode == 1 and "unavailable" in r.stderr.lower()


def test_serve_refuses_a_missing_archive_and_a_busy_port(tmp_path, server):
    r = ebb("serve", tmp_path / "nope", "--port", "0")
    assert r.returncode == 1 and "not an ebb archive" in r.stderr
    r = ebb("serve", server.archive.path, "--port", str(server.port))
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"ebb: error: port {server.port} on 127.0.0.1 is already in use (another `ebb serve`?); "
        "choose another with --port, or --port 0 for a free one"]


def test_a_vanished_data_file_is_a_clean_error(built, tmp_path):
    path = str(tmp_path / "copy")
    shutil.copytree(built[0], path)
    for f in os.listdir(os.path.join(path, "data")):
        os.remove(os.path.join(path, "data", f))
    with ArchiveFlightServer(path, port=0) as s:
        c = FlightArchiveClient(s.url)
        for call in (lambda: c.probe(3), lambda: c.probe_range(0, 40), lambda: c.scan_table()):
            with pytest.raises(flight.FlightInternalError) as e:
                call()
            msg = error_message(e.value)
            assert msg.startswith("ebb: the server cannot answer (do_get): ") and "ebb verify" in msg, msg
            assert str(tmp_path) not in str(e.value) and "Traceback" not in str(e.value)
        assert c.info()["records"] > 0  # metadata still answers


def test_deep_tickets_ipv6_host_port_and_needless_tokens(built, server):
    c = FlightArchiveClient(server.url)
    with pytest.raises(flight.FlightServerError, match="nested too deeply"):
        c._client.do_get(flight.Ticket(b"[" * 30000 + b"]" * 30000)).read_all()
    assert c.probe(3).num_rows > 0  # still serving
    # host:port without the scheme
    host_port = server.url.removeprefix("grpc://")
    assert rows_multiset(FlightArchiveClient(host_port).probe(3)) == rows_multiset(c.probe(3))
    r = ebb("probe", "--server", host_port, 3, "--token", TOKEN, "--format", "jsonl")
    assert r.returncode == 0 and "needs no token" in r.stderr and r.stdout
    r = ebb("probe", "--server", "nonsense", 3)
    assert r.returncode == 2 and "neither grpc://HOST:PORT nor HOST:PORT" in r.stderr
    # --host :: binds every interface, IPv6 included, with a bracketed URL
    p, url = _start_serve(built[0], "--host", "::")
    try:
        assert url.startswith("grpc://[::]:")
        r = ebb("probe", "--server", f"[::1]:{url.rsplit(':', 1)[1]}", 3, "--format", "jsonl")
        assert r.returncode == 0, r.stderr
        assert len(r.stdout.splitlines()) == c.probe(3).num_rows
    finally:
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=30)
