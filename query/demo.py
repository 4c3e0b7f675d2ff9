"""``ebb demo``: a storage-level walk through the archive on synthetic sensor readings."""

from __future__ import annotations

import os
import sys
import tempfile
import time

from ..indexer.synthetic import SensorFleet
from ..storage.archive import Archive
from ..storage.manifest import ArchiveConfig
from ..storage.verify import verify
from .reader import ArchiveReader


def run_demo(directory: str | None, updates: int, sensors: int) -> int:
    """Creates a 3x3 round-robin NoRebuild archive of sensor readings, runs ``updates``
    periodic updates of one minute each, and prints loads, I/O, a probe and a verify."""
    from .cli import _size, _update_line

    root = directory or tempfile.mkdtemp(prefix="ebb-demo-")
    path = os.path.join(root, "sensors.ebb")
    fleet = SensorFleet(sensors=sensors)
    tau, delta, s = 0, 60, max(fleet.periods)
    cfg = ArchiveConfig(layout="doubly", partitioning="round-robin", split="insertion", G=3, E=3, n_wave=1,
                        mode="norebuild", tau=tau, delta=delta, max_lifetime=s, time_unit="s")
    print(f"ebb demo: {sensors} sensors polled every {', '.join(str(p) for p in fleet.periods)} s; "
          f"a reading is valid until the next poll")
    print(f"archive {path}: doubly partitioned 3x3, round-robin, NoRebuild; Delta={delta}s S={s}s "
          f"(an update touches G+E-1 = 5 of 9 sub-indices)\n")
    t0 = time.perf_counter()
    with Archive.create(path, cfg) as arc:
        print(_update_line(arc.load(fleet.readings(tau - s, tau), tau)))
        for j in range(1, updates + 1):
            T = tau + j * delta
            print(_update_line(arc.load(fleet.readings(T - delta, T), T)))
        st = arc.stats()
        print(f"\n{st['records']} live records in {_size(st['bytes'])} after {st['updates']} updates "
              f"({time.perf_counter() - t0:.1f} s)")
        with ArchiveReader(arc) as r:
            key = 42
            hit = r.probe(key)
            print(f"\nprobe key={key} as of T={st['last_update_time']}: {hit.num_rows} valid reading(s)")
            for row in hit.to_pylist():
                print(f"  {row}")
            later = st["last_update_time"] + 240
            n_now = sum(b.num_rows for b in r.scan())
            n_later = sum(b.num_rows for b in r.scan(as_of=later))
            print(f"scan: {n_now} readings valid now, {n_later} still valid at T={later} if no update came")
        problems, _ = verify(arc)
        print("\nverify: " + ("ok" if not problems else f"{len(problems)} problems"))
        for p in problems:
            print(f"  {p}", file=sys.stderr)
    print(f"\ntry: ebb stats {path}   ebb plan {path}   ebb probe {path} 7 --format jsonl")
    return 0 if not problems else 5
