"""Reads stay exact under load: an `ebb serve` process answers probes, range probes and scans
from several client processes while a loader process runs `ebb load` for 24 updates. Every answer must
equal the brute-force oracle's answer for the committed state the server says it read (and that
state's time), no request may fail, and the answers must span many states (so the reads really
did overlap the updates)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import numpy as np
import pyarrow.parquet as pq
import pytest

from ebb.storage.archive import Archive

from support import SCHEMA, Oracle, config, rows_multiset, table_of

TAU, DELTA, S = 0, 10, 60
UPDATES = 24
KEYS = 60
CLIENTS = 3
FAR = TAU + (UPDATES + 2) * DELTA  # an as_of at or after every update's time: valid all along

CLIENT = r"""
import json, random, sys, os, time
from ebb.query.flight_client import FlightArchiveClient
from ebb.query.flight_protocol import ReadRequest
url, seed, stop, out, keys, far = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
rnd = random.Random(seed)
c = FlightArchiveClient(url, timeout=60)
answers, errors = [], []
while not os.path.exists(stop):
    as_of = rnd.choice([None, None, far])
    k = rnd.random()
    if k < 0.5:
        req = ReadRequest("probe", as_of, key=rnd.randrange(keys))
    elif k < 0.75:
        lo = rnd.randrange(keys)
        req = ReadRequest("probe_range", as_of, lo=lo, hi=lo + rnd.randrange(8))
    else:
        req = ReadRequest("scan", as_of)
    try:
        table, state = c.read(req)
        rows = [[r["key"], r["ts"], r["exp"], r["payload"]] for r in table.to_pylist()]
        answers.append({"req": req.to_json(), "state": state, "rows": rows})
    except Exception as e:
        errors.append(f"{req.to_json()}: {type(e).__name__}: {e}")
    time.sleep(0.02)  # leave the 2 cores some room for the loader and the server
json.dump({"answers": answers, "errors": errors}, open(out, "w"))
"""


# The loader process runs the `ebb load` command once per update: the CLI's own entry point (argument
# parsing, opening the archive, the update, closing it), without an interpreter start per update.
LOADER = r"""
import json, sys, time
from ebb.tools.cli import main
path, files = sys.argv[1], json.loads(sys.argv[2])
for f, at in files:
    rc = main(["load", path, f, "--at", str(at), "--quiet"])
    if rc != 0:
        sys.exit(f"ebb load {f} --at {at} exited {rc}")
    time.sleep(0.15)  # let the clients read each committed state a few times
"""


def _batch(rng: np.random.Generator, n: int, ts_lo: int, ts_hi: int, tag: str) -> list[dict]:
    ts = rng.integers(ts_lo, ts_hi + 1, n)
    life = rng.integers(1, S + 1, n)
    key = rng.integers(0, KEYS, n)
    return [{"key": int(k), "ts": int(t), "exp": int(t + l), "payload": f"{tag}{i}"}
            for i, (k, t, l) in enumerate(zip(key, ts, life))]


def _expected(state_rows: list[dict], req: dict, t: int):
    o = Oracle()
    o.records = state_rows
    if req["kind"] == "probe":
        return o.probe(req["key"], t)
    if req["kind"] == "probe_range":
        return o.probe_range(req["lo"], req["hi"], t)
    return o.scan(t)


@pytest.mark.parametrize("mode", ["norebuild", "rebuild"])
def test_flight_reads_are_exact_while_updates_commit(tmp_path, mode):
    rng = np.random.default_rng(99)
    path = str(tmp_path / "arc")
    oracle = Oracle()
    states: list[list[dict]] = []  # states[k]: the records after update_seq k+1
    with Archive.create(path, config(mode=mode, G=2, E=2, tau=TAU, delta=DELTA, max_lifetime=S)) as arc:
        rows = _batch(rng, 1500, TAU - S + 1, TAU, "b")
        arc.load(table_of(rows, SCHEMA), TAU)
    oracle.load(rows, TAU)
    states.append(list(oracle.records))
    files = []
    for j in range(1, UPDATES + 1):
        T = TAU + j * DELTA
        rows = _batch(rng, 250, T - DELTA + 1, T, f"u{j}-")
        f = str(tmp_path / f"u{j}.parquet")
        pq.write_table(table_of(rows, SCHEMA), f)
        files.append((f, T))
        oracle.load(rows, T)
        states.append(list(oracle.records))

    server = subprocess.Popen([sys.executable, "-m", "ebb.tools.cli", "serve", path, "--port", "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    clients: list[subprocess.Popen] = []
    stop = str(tmp_path / "stop")
    try:
        line = server.stdout.readline()
        assert "serving" in line, server.stderr.read()
        url = line.split(" at ")[1].split()[0]
        outs = [str(tmp_path / f"client{i}.json") for i in range(CLIENTS)]
        clients = [subprocess.Popen([sys.executable, "-c", CLIENT, url, str(i), stop, outs[i], str(KEYS), str(FAR)])
                   for i in range(CLIENTS)]
        time.sleep(1.0)  # let the clients get going on the initial state
        loader = subprocess.run([sys.executable, "-c", LOADER, path, json.dumps(files)], capture_output=True, text=True, timeout=300)
        assert loader.returncode == 0, loader.stderr
        time.sleep(0.5)
        open(stop, "w").close()
        for c in clients:
            assert c.wait(timeout=120) == 0
    finally:
        open(stop, "w").close()
        for c in clients:
            if c.poll() is None:
                c.kill()
        server.send_signal(signal.SIGTERM)
        server.communicate(timeout=30)

    expected: dict[tuple, object] = {}
    seen: set[int] = set()
    kinds: set[str] = set()
    total = 0
    for out in outs:
        res = json.load(open(out))
        assert res["errors"] == []
        seqs = [a["state"]["update_seq"] for a in res["answers"]]
        assert seqs == sorted(seqs)  # one client's successive reads never go back in time
        for a in res["answers"]:
            req, state = a["req"], a["state"]
            k = state["update_seq"] - 1
            assert 0 <= k <= UPDATES
            T_k = TAU + k * DELTA
            assert state["last_update_time"] == T_k
            t = req.get("as_of", T_k)
            assert state["as_of"] == t
            got = rows_multiset([dict(zip(("key", "ts", "exp", "payload"), r)) for r in a["rows"]])
            memo = (k, t, json.dumps(req, sort_keys=True))
            if memo not in expected:
                expected[memo] = _expected(states[k], req, t)
            assert got == expected[memo], (req, state)
            seen.add(k)
            kinds.add(req["kind"])
            total += 1
    assert kinds == {"probe", "probe_range", "scan"}
    # the reads overlapped the updates: answers came from the first, the last and most states between
    assert 0 in seen and UPDATES in seen and len(seen) >= UPDATES * 2 // 3, sorted(seen)
    assert total >= 100
