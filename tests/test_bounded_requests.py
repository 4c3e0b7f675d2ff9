"""Issue 29, bounded work per request: range probes stream in (key, exp, ts) order in memory
bounded by the plan's shape, not by the answer (``Snapshot.read_range``), and a server admits
at most ``max_heavy_requests`` scans and range probes at once ("ebb: busy" beyond)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import tempfile
import textwrap
import threading

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ebb.query import flight_protocol as proto
from ebb.query.flight_client import FlightArchiveClient
from ebb.query.flight_server import ArchiveFlightServer
from ebb.query.reader import ArchiveReader
from ebb.storage.archive import Archive

from support import SCHEMA, Oracle, config, ebb, random_rows, rows_multiset, table_of

HERE = os.path.dirname(os.path.abspath(__file__))


@st.composite
def ranges(draw):
    mode = draw(st.sampled_from(["rebuild", "norebuild"]))
    string_keys = draw(st.booleans())
    block_bytes = draw(st.sampled_from([256, 600, 4096]))  # tiny blocks: a key's records span several
    keys = draw(st.integers(1, 30))  # few keys: many records share a (key, exp) across blocks
    updates = draw(st.integers(0, 5))
    bounds = st.one_of(st.none(), st.integers(-1, keys + 1))
    lo, hi = draw(bounds), draw(bounds)
    late = draw(st.integers(0, 6))  # as_of this many chronons after the last update
    return dict(mode=mode, string_keys=string_keys, block_bytes=block_bytes, keys=keys, updates=updates,
                lo=lo, hi=hi, late=late, seed=draw(st.integers(0, 2**32 - 1)))


def _key(k: int, string_keys: bool):
    return None if k is None else f"k{k:03d}é" if string_keys else k


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ranges())
def test_streamed_range_is_the_oracles_in_order(sc):
    rng = np.random.default_rng(sc["seed"])
    schema = SCHEMA if not sc["string_keys"] else SCHEMA.set(0, pa.field("key", pa.string()))
    oracle = Oracle()
    with tempfile.TemporaryDirectory() as d, \
            Archive.create(d + "/a", config(mode=sc["mode"], block_bytes=sc["block_bytes"])) as arc:
        T = 16
        for j in range(sc["updates"] + 1):
            rows = random_rows(rng, 200 if j == 0 else 60, T - 15 if j == 0 else T - 1, T, 16, sc["keys"], f"u{j}-")
            for r in rows:
                r["key"] = _key(r["key"], sc["string_keys"])
            arc.load(table_of(rows, schema), T)
            oracle.load(rows, T)
            T += 2
        t = T - 2 + sc["late"]
        lo, hi = _key(sc["lo"], sc["string_keys"]), _key(sc["hi"], sc["string_keys"])
        want = [r for r in oracle.valid(t) if (lo is None or lo <= r["key"]) and (hi is None or r["key"] <= hi)]
        with ArchiveReader(arc) as r:
            batches = list(r.probe_range_batches(lo, hi, t))
            table = r.probe_range(lo, hi, t)
        got = pa.Table.from_batches(batches, schema=table.schema)
        order = [(x["key"], x["exp"], x["ts"]) for x in got.to_pylist()]
        assert order == sorted((x["key"], x["exp"], x["ts"]) for x in want)
        assert rows_multiset(got) == rows_multiset(want)
        assert table.equals(got)


# -- memory: a server answering concurrent whole-range probes -------------------------------------
ROWS = 1_000_000  # a 50 MB Rebuild archive of 4 sub-indices (512 KiB blocks)
CLIENTS = 8
# what one whole-range probe may hold, generously: its merge holds a 512 KiB block per sorted
# stream (4 here) and gathers 1 MiB of output, and gRPC, Arrow's allocator and the batch being
# sent take their share; built whole, each held the whole answer at least twice over (~100 MB)
PER_REQUEST = 40 << 20

SERVER_MEMORY = textwrap.dedent("""
    import sys, threading, time, subprocess
    import numpy as np, pyarrow as pa, pyarrow.flight as fl
    sys.path.insert(0, sys.argv[1])
    from support import config
    from ebb.query import flight_protocol as proto
    from ebb.storage.archive import Archive

    path, rows, clients = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    rng = np.random.default_rng(1)
    with Archive.create(path, config(mode="rebuild", tau=1000, delta=10, max_lifetime=1000)) as arc:
        ts = rng.integers(1, 1001, rows)
        exp = np.maximum(ts + rng.integers(1, 1001, rows), 1001)
        pay = np.char.add("payload-", rng.integers(0, 10**8, rows).astype(str)).astype(object)
        arc.load(pa.table({"key": rng.integers(0, 200_000, rows), "ts": ts, "exp": exp, "payload": pay}), 1000)
    server = subprocess.Popen([sys.executable, "-m", "ebb.tools.cli", "serve", path, "--port", "0",
                               "--max-heavy-requests", str(clients)],
                              stdout=subprocess.PIPE, text=True)
    url = server.stdout.readline().split(" at ")[1].split()[0]

    def anon():  # MiB of anonymous memory the server holds now
        for line in open(f"/proc/{server.pid}/status"):
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) // 1024

    base, peak, got, done = anon(), [0], [], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], anon())
            time.sleep(0.005)

    def client():
        c = fl.connect(url)
        got.append(sum(chunk.data.num_rows for chunk in c.do_get(fl.Ticket(proto.ReadRequest("probe_range").encode()))))

    threads = [threading.Thread(target=client) for _ in range(clients)]
    sampler = threading.Thread(target=sample)
    sampler.start()
    [t.start() for t in threads]
    [t.join() for t in threads]
    done.set()
    sampler.join()
    server.terminate()
    server.wait()
    print(base, peak[0], sorted(got))
""")


def test_concurrent_whole_range_probes_stay_within_a_memory_bound(tmp_path):
    """Peak anonymous memory of a server answering CLIENTS whole-range probes of a 50 MB archive
    at once grows with CLIENTS x a per-request budget, not with CLIENTS x the archive (measured
    on 2 cores: 837 MB built whole, 243 MB streamed, from a 28 MB start)."""
    script = tmp_path / "server_memory.py"
    script.write_text(SERVER_MEMORY)
    out = subprocess.run([sys.executable, str(script), HERE, str(tmp_path / "arc"), str(ROWS), str(CLIENTS)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    base, peak, got = out.stdout.split(maxsplit=2)
    assert got.strip() == str([ROWS] * CLIENTS)
    bound = int(base) + CLIENTS * PER_REQUEST // (1 << 20)
    assert int(peak) <= bound, f"peak RssAnon {peak} MiB over {bound} MiB (started at {base} MiB)"


# -- the limit on heavy requests ----------------------------------------------------------------
@pytest.fixture(scope="module")
def built(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("bounded") / "arc")
    rng = np.random.default_rng(3)
    with Archive.create(path, config(mode="norebuild")) as arc:
        arc.load(table_of(random_rows(rng, 300, 1, 16, 16, 30, "b"), SCHEMA), 16)
    return path


def test_heavy_requests_beyond_the_limit_are_told_to_retry(built):
    with ArchiveFlightServer(built, port=0, max_heavy_requests=1) as server, FlightArchiveClient(server.url) as c:
        whole = c.scan_table()
        # a scan the server has started answering holds the one slot until its stream ends
        _, held = server._answer(proto.ReadRequest("scan"))
        for busy in (lambda: c.scan_table(), lambda: c.probe_range(None, None), lambda: c.probe_range(3, 9)):
            with pytest.raises(flight.FlightUnavailableError, match=r"ebb: busy: 1 heavy requests .* in progress; retry"):
                busy()
        assert c.probe(3).num_rows == whole.filter(pa.compute.equal(whole["key"], 3)).num_rows  # never limited
        assert sum(b.num_rows for b in (x[0] if type(x) is tuple else x for x in held)) == whole.num_rows
        assert c.probe_range(None, None).num_rows == whole.num_rows  # the slot came back at the stream's end
        # ... and when a stream is dropped before it starts (a client that went away)
        _, held = server._answer(proto.ReadRequest("probe_range"))
        with pytest.raises(flight.FlightUnavailableError, match="ebb: busy"):
            c.scan_table()
        del held
        gc.collect()
        assert c.scan_table().num_rows == whole.num_rows


def test_concurrent_clients_over_the_limit_all_succeed_or_are_busy(built):
    with ArchiveFlightServer(built, port=0, max_heavy_requests=2) as server:
        outcomes = []

        def client():
            with FlightArchiveClient(server.url) as c:
                try:
                    outcomes.append(c.probe_range(None, None).num_rows)
                except flight.FlightUnavailableError as e:
                    outcomes.append("busy" if "ebb: busy" in str(e) else str(e))

        threads = [threading.Thread(target=client) for _ in range(12)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        with ArchiveReader(built) as r:
            rows = r.probe_range(None, None).num_rows
        assert set(outcomes) <= {rows, "busy"} and rows in outcomes


def test_serve_refuses_a_limit_below_one(built):
    out = ebb("serve", built, "--port", "0", "--max-heavy-requests", "0")
    assert out.returncode == 2 and "--max-heavy-requests must be at least 1" in out.stderr


def test_csv_of_a_column_csv_cannot_hold_is_a_one_line_usage_error(tmp_path):
    path = str(tmp_path / "arc")
    with Archive.create(path, config()) as arc:
        arc.load(pa.table({"key": [1, 2], "ts": [10, 11], "exp": [20, 21],
                           "iv": pa.array([(1, 2, 3), None], pa.month_day_nano_interval())}), 16)
    out = ebb("scan", path, "--format", "csv")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        "ebb: error: --format csv cannot write column 'iv' (month_day_nano_interval); use --format jsonl or --format parquet"]
    assert ebb("scan", path, "--format", "jsonl").returncode == 0
