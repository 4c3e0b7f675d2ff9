"""Reads stay exact under load: an `ebb serve` process answers probes, range probes and scans
from several client processes while `ebb load` processes apply 24 updates. Every answer must
equal the brute-force oracle's answer for the committed state the server says it read (and that
state's time), no request may fail, and the answers must span many states (so the reads really
did overlap the updates)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pyarrow.parquet as pq
import pytest

from ebb.storage.archive import Archive

from support import SCHEMA, Oracle, config, ebb, rows_multiset, table_of

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
json.dump({"answers": answers, "errors": errors}, open(out, "w"))
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

    server = subprocess.Popen([sys.executable, "-m", "ebb.query.cli", "serve", path, "--port", "0"],
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
        for f, T in files:  # the loader: one `ebb load` process per update, as in production
            r = ebb("load", path, f, "--at", T, "--quiet")
            assert r.returncode == 0, r.stderr
            time.sleep(0.05)
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

    seen: set[int] = set()
    kinds: set[str] = set()
    total = 0
    for out in outs:
        res = json.load(open(out))
        assert res["errors"] == []
        for a in res["answers"]:
            req, state = a["req"], a["state"]
            k = state["update_seq"] - 1
            assert 0 <= k <= UPDATES
            T_k = TAU + k * DELTA
            assert state["last_update_time"] == T_k
            t = req.get("as_of", T_k)
            assert state["as_of"] == t
            got = rows_multiset([dict(zip(("key", "ts", "exp", "payload"), r)) for r in a["rows"]])
            assert got == _expected(states[k], req, t), (req, state)
            seen.add(k)
            kinds.add(req["kind"])
            total += 1
    assert kinds == {"probe", "probe_range", "scan"}
    # the reads overlapped the updates: answers came from the first, the last and many states between
    assert 0 in seen and UPDATES in seen and len(seen) >= UPDATES // 2, sorted(seen)
    assert total >= 100
