"""Version-switch latency: what the first probe after each update costs a long-lived reader in
its own process, next to that process's steady probes.

    python -m ebb.tools.switch_latency --keys 1000000 --updates 20 --layouts rebuild:2x2 norebuild:4x4

For each layout it builds an archive of ``--keys`` int64 keys (one live reading per key, about
200 bytes each), starts a reader process that holds one ``ArchiveReader`` open (as ``ebb serve``
does, following new versions: ``ArchiveReader(path, follow=True)``) and probes random keys
through the public API about once a millisecond, then applies
``--updates`` updates from this process, one every ``--gap`` seconds. Each update replaces a
quarter of the readings. The reader notes, outside the timed call, when the archive's newest
committed version changed and when the version it serves changed: the first probe after
either counts as a first probe after the update. Prints, per
layout, the steady probe p50/p99 and the first-probe-after-update p50/max, and their ratio
(issue 24's target: at most 2).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa

DELTA, PERIOD = 60, 240  # each key is read every PERIOD s; an update brings one DELTA of readings


def readings(keys: int, lo: int, hi: int) -> pa.Table:
    """The readings polled in (lo, hi]: key k is polled at times = k mod PERIOD (mod PERIOD),
    valid until its next poll; a 176-byte payload makes a record about 200 bytes."""
    k = np.arange(keys, dtype=np.int64)
    phase = k % PERIOD
    first = lo + 1 + (phase - (lo + 1)) % PERIOD
    sel = first <= hi
    k, ts = k[sel], first[sel]
    n = len(k)
    payload = pa.FixedSizeBinaryArray.from_buffers(pa.binary(176), n, [None, pa.py_buffer(np.zeros(n * 176, np.uint8))])
    return pa.table({"key": k, "ts": ts, "exp": ts + PERIOD, "value": (k % 1000).astype(np.float64),
                     "payload": payload})


def build(path: str, keys: int, mode: str, G: int, E: int) -> int:
    """The archive after its bulk load and one period of updates; returns the next update's time."""
    from ..storage.archive import Archive
    from ..storage.config import build_config

    cfg = build_config(layout="doubly", mode=mode, G=G, E=E, interval=DELTA, max_lifetime=PERIOD, start=0)
    with Archive.create(path, cfg) as arc:
        arc.load(readings(keys, -PERIOD, 0), 0)
        for T in range(DELTA, PERIOD + 1, DELTA):
            arc.load(readings(keys, T - DELTA, T), T)
    return PERIOD + DELTA


READER = """
import json, sys, time
import numpy as np
from ebb.query.reader import ArchiveReader
path, keys, out, stop = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
rng = np.random.default_rng(1)
r = ArchiveReader(path, follow=True)
env = r.archive.env
lat, first, rows = [], [], 0

def version():  # outside the timed call: the newest commit, and the version served
    served = r.served_snapshot()
    return env.info()["last_txnid"], served and served.state.update_seq

seen = version()
print("ready", flush=True)
import os
while not os.path.exists(stop):
    for key in rng.integers(0, keys, 200).tolist():
        now = version()
        t0 = time.perf_counter_ns()
        rows += r.probe(key).num_rows
        dt = time.perf_counter_ns() - t0
        # the first probe after a commit, and the first on a newly served version
        (first if now != seen else lat).append(dt)
        seen = now
        time.sleep(0.001)
with open(out, "w") as f:
    json.dump({"steady_ns": lat, "first_ns": first, "rows": rows}, f)
"""


def measure(path: str, keys: int, updates: int, gap: float, next_T: int) -> dict:
    from ..storage.archive import Archive

    with tempfile.TemporaryDirectory() as d:
        out, stop = os.path.join(d, "out.json"), os.path.join(d, "stop")
        reader = subprocess.Popen([sys.executable, "-c", READER, path, str(keys), out, stop], stdout=subprocess.PIPE,
                                  text=True)
        try:
            assert reader.stdout.readline().strip() == "ready"
            time.sleep(gap)
            update_s = []
            for i in range(updates):
                T = next_T + i * DELTA
                batch = readings(keys, T - DELTA, T)
                t0 = time.perf_counter()
                with Archive(path) as arc:  # a separate writer, as `ebb run` is
                    arc.load(batch, T)
                update_s.append(time.perf_counter() - t0)
                time.sleep(gap)
            open(stop, "w").close()
            reader.wait(120)
        finally:
            reader.kill()
        with open(out) as f:
            got = json.load(f)
    steady, first = np.asarray(got["steady_ns"]) / 1e3, np.asarray(got["first_ns"]) / 1e3
    return {"probes": len(steady) + len(first), "updates": updates, "update_s_p50": float(np.median(update_s)),
            "steady_p50_us": float(np.percentile(steady, 50)), "steady_p99_us": float(np.percentile(steady, 99)),
            "first_after_update_p50_us": float(np.percentile(first, 50)) if len(first) else None,
            "first_after_update_max_us": float(first.max()) if len(first) else None,
            "ratio_p50": float(np.percentile(first, 50) / np.percentile(steady, 50)) if len(first) else None,
            "first_after_update_us": [round(x, 1) for x in first.tolist()]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ebb.tools.switch_latency", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=1_000_000)
    p.add_argument("--updates", type=int, default=20)
    p.add_argument("--gap", type=float, default=1.0, help="seconds between updates (default 1)")
    p.add_argument("--layouts", nargs="+", default=["rebuild:2x2", "norebuild:4x4"], metavar="MODE:GxE")
    p.add_argument("--dir", help="where to build the archives (default: a temporary directory)")
    p.add_argument("--json", help="also write the results here")
    a = p.parse_args(argv)
    results = {}
    with tempfile.TemporaryDirectory(dir=a.dir) as d:
        for spec in a.layouts:
            mode, grid = spec.split(":")
            G, E = (int(x) for x in grid.split("x"))
            path = os.path.join(d, spec.replace(":", "-"))
            t0 = time.perf_counter()
            next_T = build(path, a.keys, mode, G, E)
            print(f"{spec}: built in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
            r = measure(path, a.keys, a.updates, a.gap, next_T)
            results[spec] = r
            ratio = "n/a" if r["ratio_p50"] is None else f"{r['ratio_p50']:.2f}x"
            print(f"{spec:16s} steady p50 {r['steady_p50_us']:7.1f} us  p99 {r['steady_p99_us']:7.1f} us | first after "
                  f"update p50 {r['first_after_update_p50_us']:8.1f} us  max {r['first_after_update_max_us']:8.1f} us "
                  f"| ratio {ratio} ({r['updates']} updates, {r['probes']} probes, update {r['update_s_p50']:.2f} s)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
