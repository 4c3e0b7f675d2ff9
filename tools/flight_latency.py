"""Flight serving benchmark: probe latency (p50/p99) and scan throughput of `ebb serve`, on an
idle archive and while another process applies updates back to back.

    python -m ebb.tools.flight_latency --sensors 100000 --probes 2000 --scans 5

It builds an archive of synthetic sensor readings (each valid until the sensor's next poll, the
explicit-lifetime query kind), starts `ebb serve` in its own process, and measures from this
process through ``FlightArchiveClient``:

- probe latency: one key per request, sequential, end to end (request, snapshot, read
  planning, block reads, Arrow IPC, decode), as percentiles;
- scan throughput: full scans streamed to the client, rows/s and MiB/s of Arrow data;

first with no writer, then with a loader process running `ebb load`'s code path continuously
(each update deletes expired readings and inserts one interval of polls). Prints a table and
optionally writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

TAU, DELTA = 0, 60  # one update a minute, in seconds as chronons


@dataclass(frozen=True)
class Workload:
    sensors: int
    period: int  # each sensor is polled every `period` s; a reading is valid until the next poll

    @property
    def max_lifetime(self) -> int:
        return self.period

    def readings(self, lo: int, hi: int) -> pa.Table:
        """Every reading polled in (lo, hi], with key/ts/exp (exp = next poll) and its value."""
        from ..indexer.synthetic import SensorFleet

        polls = SensorFleet(sensors=self.sensors, period=self.period, loss=0.0).polls(lo, hi)
        t = polls.column("t")
        return pa.table({"key": polls.column("sensor"), "ts": t,
                         "exp": pc.add(t, self.period), "value": polls.column("value")})


def build(path: str, w: Workload, mode: str, G: int, E: int) -> int:
    """Creates the archive and loads the bulk load plus one period of updates; returns the last
    update's slot."""
    from ..storage.archive import Archive
    from ..storage.manifest import ArchiveConfig

    cfg = ArchiveConfig(layout="doubly", partitioning="round-robin", split="insertion", G=G, E=E, n_wave=1,
                        mode=mode, tau=TAU, delta=DELTA, max_lifetime=w.max_lifetime, time_unit="s")
    with Archive.create(path, cfg) as arc:
        arc.load(w.readings(TAU - w.max_lifetime, TAU), TAU)
        slots = w.max_lifetime // DELTA
        for j in range(1, slots + 1):
            arc.load(w.readings(TAU + (j - 1) * DELTA, TAU + j * DELTA), TAU + j * DELTA)
    return slots


def loader(path: str, sensors: int, period: int, first_slot: int, stop_file: str, out: str) -> None:
    """Runs in its own process: applies updates back to back until ``stop_file`` exists."""
    from ..storage.archive import Archive

    w = Workload(sensors, period)
    times: list[float] = []
    j = first_slot
    while not os.path.exists(stop_file):
        T = TAU + j * DELTA
        batch = w.readings(T - DELTA, T)
        t0 = time.perf_counter()
        with Archive(path) as arc:  # open per update, as an `ebb load` process does
            arc.load(batch, T)
        times.append(time.perf_counter() - t0)
        j += 1
    with open(out, "w") as f:
        json.dump({"updates": len(times), "update_seconds": times}, f)


def _percentiles(xs: list[float]) -> dict[str, float]:
    a = np.asarray(xs) * 1000.0
    return {"p50_ms": float(np.percentile(a, 50)), "p90_ms": float(np.percentile(a, 90)),
            "p99_ms": float(np.percentile(a, 99)), "mean_ms": float(a.mean()), "max_ms": float(a.max())}


def measure(client, sensors: int, probes: int, scans: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    lat: list[float] = []
    hits = 0
    for key in rng.integers(0, sensors, probes).tolist():
        t0 = time.perf_counter()
        hits += client.probe(key).num_rows
        lat.append(time.perf_counter() - t0)
    scan_s, rows, nbytes = [], 0, 0
    for _ in range(scans):
        t0 = time.perf_counter()
        for b in client.scan():
            rows += b.num_rows
            nbytes += b.nbytes
        scan_s.append(time.perf_counter() - t0)
    total = sum(scan_s)
    return {"probes": probes, "rows_per_probe": hits / max(probes, 1), **_percentiles(lat),
            "scans": scans, "rows_per_scan": rows // max(scans, 1), "scan_seconds_mean": total / max(scans, 1),
            "scan_rows_per_s": rows / total if total else 0.0, "scan_mib_per_s": nbytes / total / 2**20 if total else 0.0}


def machine() -> dict:
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), cpu)
    except OSError:
        pass
    mem = 0
    try:
        with open("/proc/meminfo") as f:
            mem = int(next(l.split()[1] for l in f if l.startswith("MemTotal:"))) * 1024
    except (OSError, StopIteration):
        pass
    return {"cpus": os.cpu_count(), "cpu_model": cpu, "memory_gib": round(mem / 2**30, 1),
            "python": platform.python_version(), "pyarrow": pa.__version__, "load_average": os.getloadavg()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ebb.tools.flight_latency", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sensors", type=int, default=100_000, help="keys (sensors); about one live reading each (default 100000)")
    p.add_argument("--period", type=int, default=600, help="poll period = lifetime = S, in s (default 600: p = 10 slots)")
    p.add_argument("--mode", choices=["rebuild", "norebuild"], default="norebuild", help="maintenance mode (default norebuild)")
    p.add_argument("--G", type=int, default=3, help="insertion-time partitions (default 3)")
    p.add_argument("--E", type=int, default=3, help="expiration-time partitions (default 3)")
    p.add_argument("--probes", type=int, default=2000, help="probes per phase (default 2000)")
    p.add_argument("--scans", type=int, default=5, help="full scans per phase (default 5)")
    p.add_argument("--dir", help="where to build the archive (default: a temporary directory, removed after)")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    a = p.parse_args(argv)

    from ..query.flight_client import FlightArchiveClient

    root = a.dir or tempfile.mkdtemp(prefix="ebb-flight-bench-")
    path = os.path.join(root, "arc")
    w = Workload(a.sensors, a.period)
    t0 = time.perf_counter()
    last_slot = build(path, w, a.mode, a.G, a.E)
    print(f"built {path}: {a.sensors} sensors, period {a.period}s, {a.mode} {a.G}x{a.E}, "
          f"{last_slot + 1} loads in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    server = subprocess.Popen([sys.executable, "-m", "ebb.tools.cli", "serve", path, "--port", "0"],
                              stdout=subprocess.PIPE, text=True)
    results: dict = {"machine": machine(), "config": vars(a)}
    stop = os.path.join(root, "stop")
    try:
        line = server.stdout.readline()
        if "serving" not in line:
            print(f"ebb serve did not start: {line}", file=sys.stderr)
            return 1
        url = line.split(" at ")[1].split()[0]
        with FlightArchiveClient(url) as c:
            info = c.info()
            results["archive"] = {k: info[k] for k in ("layout", "mode", "n", "records", "bytes")}
            measure(c, a.sensors, 50, 1, seed=0)  # warm the page cache and the connection
            results["idle"] = measure(c, a.sensors, a.probes, a.scans, seed=1)
            print("idle:", json.dumps(results["idle"]), file=sys.stderr)
            out = os.path.join(root, "loader.json")
            code = (f"from ebb.tools.flight_latency import loader; "
                    f"loader({path!r}, {a.sensors}, {a.period}, {last_slot + 1}, {stop!r}, {out!r})")
            ld = subprocess.Popen([sys.executable, "-c", code])
            time.sleep(1.0)  # the loader's first update is under way
            t1 = time.perf_counter()
            results["under_updates"] = measure(c, a.sensors, a.probes, a.scans, seed=2)
            elapsed = time.perf_counter() - t1
            open(stop, "w").close()
            if ld.wait(timeout=600) != 0:
                print("the loader failed", file=sys.stderr)
                return 1
            with open(out) as f:
                lr = json.load(f)
            results["under_updates"].update({
                "updates_applied": lr["updates"], "updates_per_s": lr["updates"] / elapsed,
                "update_seconds_mean": float(np.mean(lr["update_seconds"])) if lr["update_seconds"] else 0.0})
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
        if not a.dir:
            shutil.rmtree(root, ignore_errors=True)

    m = results["machine"]
    print(f"\nmachine: {m['cpus']} CPUs ({m['cpu_model']}), {m['memory_gib']} GiB; load average at start {m['load_average'][0]:.1f}")
    ar = results["archive"]
    print(f"archive: {ar['layout']}, {ar['mode']}, n={ar['n']}, {ar['records']} records, {ar['bytes'] / 2**20:.1f} MiB\n")
    print(f"{'phase':<16} {'probe p50':>10} {'p90':>8} {'p99':>8} {'mean':>8}  {'scan rows/s':>12} {'MiB/s':>7}  updates")
    for phase in ("idle", "under_updates"):
        r = results[phase]
        upd = f"{r['updates_applied']} ({r['updates_per_s']:.1f}/s, {r['update_seconds_mean'] * 1000:.0f} ms each)" if "updates_applied" in r else "-"
        print(f"{phase:<16} {r['p50_ms']:>8.2f}ms {r['p90_ms']:>6.2f}ms {r['p99_ms']:>6.2f}ms {r['mean_ms']:>6.2f}ms  "
              f"{r['scan_rows_per_s']:>12,.0f} {r['scan_mib_per_s']:>7.1f}  {upd}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
