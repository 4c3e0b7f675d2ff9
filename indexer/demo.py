"""``ebb demo``: the whole pipeline on a synthetic stream, from landed files to probes.

Temperature sensors are polled every 10 minutes and humidity sensors every 15; a reading is
valid until the next poll is due (an explicit lifetime per source, docs/spec.md). Files land
every minute; the scheduler runs one tick per minute of event time, loading each tick's results
into a doubly partitioned archive. One tick also receives a file of late events, which are
counted and dropped.
"""

from __future__ import annotations

import os
import tempfile
import time

from ..query.reader import ArchiveReader
from ..storage.verify import verify
from .jobspec import TIME_UNITS_US, load_job
from .patterns import classify
from .scheduler import Scheduler, archive_config
from .synthetic import SensorFleet, land, with_timestamps

JOB = """\
# ebb demo job: sensors with different polling periods, each reading valid until the next poll
[job]
time_unit = "s"
origin = "2026-01-01T00:00:00Z"
late_policy = "drop"

[[source]]
name = "temperature"
path = "landing/temperature"
format = "parquet"
time_column = "event_time"
key = "sensor"
lifetime = 600

[[source]]
name = "humidity"
path = "landing/humidity"
format = "parquet"
time_column = "event_time"
key = "sensor"
lifetime = 900

[query]
kind = "lifetime"
sources = ["temperature", "humidity"]
key = "sensor"

[archive]
path = "archive"
layout = "auto"
G = 3
E = 3
mode = "norebuild"
interval = 60
start = 3600
"""


def run_demo(directory: str | None, ticks: int, sensors: int, master: str | None, verbose: bool = False) -> int:
    t_start = time.perf_counter()
    root = directory or tempfile.mkdtemp(prefix="ebb-demo-")
    os.makedirs(root, exist_ok=True)
    job_path = os.path.join(root, "sensors.toml")
    with open(job_path, "w") as f:
        f.write(JOB)
    job = load_job(job_path)
    fleets = {"temperature": SensorFleet(sensors, 600, 0, 21.0, seed=3), "humidity": SensorFleet(sensors, 900, sensors, 45.0, seed=5)}
    unit = TIME_UNITS_US[job.time_unit]
    tau, delta = job.archive.start, job.archive.interval

    def land_minute(lo: int, hi: int, tag: str = "") -> None:
        for name, fleet in fleets.items():
            ev = fleet.polls(lo, hi)
            land(with_timestamps(ev, job.origin_us, unit), job.sources[name].path, f"{name}-{hi:08d}{tag}.parquet")

    c = classify(job)
    # the words below are those of the README's "Concepts" section; each line says what it means here
    print(f"ebb demo in {root}")
    print(f"  {sensors} temperature sensors (every 600 s) and {sensors} humidity sensors (every 900 s); one chronon = 1 s")
    print(f"  query: lifetime over both sources -> update pattern {c.pattern} non-monotonic: {c.reason}")
    print(f"  S = {c.max_lifetime} s: no result stays valid longer; Delta = {delta} s: one update (tick) per minute "
          f"of event time, so S/Delta = {c.max_lifetime // delta} slots")
    cfg = archive_config(job, c)
    print(f"  layout: {cfg.layout_obj.describe()}: {cfg.n} sub-indices, rows by the slot a result arrived in, "
          "columns by the slot it expires in; an update inserts into one row and deletes from one column, so it "
          f"touches at most G + E - 1 = {cfg.G + cfg.E - 1} of the {cfg.n}")
    print("  NoRebuild: an update adds one new run to each sub-index it inserts into and deletes by dropping whole "
          "expired sections, never rewriting a run")
    print(f"  each tick line: results computed, +inserted -deleted (expired), and 'touched k/{cfg.n}': the sub-indices "
          "the update wrote (the first tick, the bulk load, fills several rows; a NoRebuild deletion writes nothing)\n")
    for hi in range(tau - c.max_lifetime + delta, tau + 1, delta):  # history before the bulk load
        land_minute(hi - delta, hi)
    with Scheduler(job, master, say=lambda m: print("  " + m, flush=True), verbose=verbose) as s:
        s.run(ticks=1)
        for j in range(1, ticks + 1):
            T = tau + j * delta
            land_minute(T - delta, T)
            if j == 3:
                # a producer re-sends readings from two minutes ago: late, counted and dropped
                print(f"  (on purpose: a producer re-sends the temperature readings of T={T - 3 * delta}..{T - 2 * delta}, "
                      "whose ticks are already committed; they are late, so the next tick counts and drops them)")
                land(with_timestamps(fleets["temperature"].polls(T - 3 * delta, T - 2 * delta), job.origin_us, unit),
                     job.sources["temperature"].path, f"temperature-{T:08d}-resend.parquet")
            s.run(ticks=1)
        st = s.archive.stats()
        print(f"\narchive: {st['records']} live results in {st['bytes'] / 1024:.0f} KiB after {st['updates']} updates; "
              f"{st['late_rows']} late events dropped")
        with ArchiveReader(s.archive) as r:
            for key in (42, sensors + 42):
                for row in r.probe(key).to_pylist():
                    print(f"probe sensor={key}: {row}")
            now = st["last_update_time"]
            print(f"scan: {r.scan_table().num_rows} readings valid at T={now}, "
                  f"{r.scan_table(as_of=now + 300).num_rows} still valid at T={now + 300} if no new data came")
        problems, _ = verify(s.archive)
    print("verify: " + ("ok" if not problems else "; ".join(problems)))
    archive = job.archive.path
    print(f"\ndone in {time.perf_counter() - t_start:.0f} s. Next:")
    print(f"  ebb stats {archive}")
    print(f"  ebb stats {archive} --plot archive.png   # the grid, what expires when, the next updates (pip install 'ebb[plot]')")
    print(f"  ebb probe {archive} 42")
    print(f"  ebb explain {job_path}")
    print(f"  ebb run {job_path} --ticks 3     # three more ticks; no new files landed, so they skip Spark")
    return 0 if not problems else 5
