"""``ebb bench-migration``: what a layout change costs, by draining against by copying.

One archive is built with a benchmark workload in layout FROM; after ``--before`` updates it is
cloned, one clone is migrated to layout TO by draining and the other by copying (``--copy``),
and both then take the next p = S/Delta updates, the time it takes the drained layout to empty.
Reported per method: the switch's I/O (ebb's bytes read and written, and the OS's) and wall
time, then the updates' I/O and time over the drain period, and the disk space at the switch,
at its largest during the drain period (a draining layout keeps expired records until their
run goes) and at the end. Both clones must answer every scan alike (rows and the sum of ``seq``), or the
run fails.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path


def register(sub) -> None:
    c = sub.add_parser(
        "bench-migration", help="measure a layout change: draining against copying",
        description=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("--workload", default="thesis-small", help="benchmark workload (default: thesis-small)")
    c.add_argument("--from", dest="from_", default="Rebuild2x2", metavar="CONFIG", help="layout before (default Rebuild2x2)")
    c.add_argument("--to", default="NoRebuild4x4", metavar="CONFIG", help="layout after (default NoRebuild4x4)")
    c.add_argument("--before", type=int, default=12, metavar="N", help="updates before the switch (default 12)")
    c.add_argument("--out", default="bench-results/migration", metavar="DIR", help="where the archives and results go")
    c.set_defaults(handler=run)


def run(a) -> int:
    from ..storage.archive import Archive
    from ..storage.errors import UsageError
    from ..storage.migration import migrate
    from .configs import parse
    from .ebb_store import EbbStore, archive_config
    from .measure import dir_size_bytes
    from .workloads import WORKLOADS

    if a.workload not in WORKLOADS:
        raise UsageError(f"unknown workload {a.workload!r} (one of {', '.join(sorted(WORKLOADS))})")
    src, dst = parse(a.from_), parse(a.to)
    if "peer" in (src.family, dst.family):
        raise UsageError("--from and --to must be ebb layouts (e.g. Rebuild2x2, NoRebuild4x4-chr, R-ins9)")
    w = WORKLOADS[a.workload]
    w = w.with_updates(a.before + w.p)
    out = Path(a.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    batches = w.batches()
    base = EbbStore(str(out / "drain"), w, src)
    base.create()
    for j, at, batch in batches:
        print(f"building {a.from_}: update {j}/{a.before}", file=sys.stderr, flush=True)
        base.load(batch, at)
        if j == a.before:
            break
    base.close()
    shutil.copytree(out / "drain", out / "copy")
    target = archive_config(dst, w)
    result = {"workload": w.name, "from": a.from_, "to": a.to, "switch_after_update": a.before, "p": w.p, "methods": {}}
    archives = {m: Archive(str(out / m)) for m in ("drain", "copy")}
    try:
        for method, arc in archives.items():
            rec = migrate(arc, target, copy=method == "copy")
            result["methods"][method] = {"switch": rec, "disk_bytes_at_switch": dir_size_bytes(str(out / method)),
                                         "updates": []}
            print(f"{method}: switch wrote {rec['bytes_written']} bytes in {rec['wall_seconds']:.3f} s", file=sys.stderr)
        for j, at, batch in batches:
            answers = set()
            for method, arc in archives.items():
                t0 = time.perf_counter()
                rec = arc.load(batch, at)
                result["methods"][method]["updates"].append(
                    {k: rec[k] for k in ("slot", "bytes_read", "bytes_written", "os_write_bytes", "drained_runs",
                                         "drained_records")}
                    | {"seconds": time.perf_counter() - t0, "disk_bytes": dir_size_bytes(str(out / method))})
                answers.add(_scan_digest(arc, at))
            if len(answers) != 1:
                raise RuntimeError(f"update {j}: the drained and the copied archive answer a scan differently: {answers}")
            print(f"update {j}: both archives answer alike", file=sys.stderr, flush=True)
        for method, arc in archives.items():
            m = result["methods"][method]
            m["draining_left"] = len(arc.state().draining)
            m["disk_bytes_at_end"] = dir_size_bytes(str(out / method))
            ups = m["updates"]
            m["disk_bytes_max"] = max(u["disk_bytes"] for u in ups)
            m["drain_period"] = {k: sum(u[k] for u in ups) for k in ("bytes_read", "bytes_written", "os_write_bytes", "seconds")}
    finally:
        for arc in archives.values():
            arc.close()
    (out / "migration.json").write_text(json.dumps(result, indent=2))
    print(_table(result))
    print(f"results: {out / 'migration.json'}")
    return 0


def _scan_digest(arc, at: int) -> tuple[int, int]:
    """(rows, sum of seq) of a scan as of ``at``."""
    import pyarrow.compute as pc

    from ..query.reader import ArchiveReader

    rows = total = 0
    with ArchiveReader(arc) as r:
        for b in r.scan(as_of=at):
            rows += b.num_rows
            total += int(pc.sum(b.column("seq")).as_py() or 0)
    return rows, total


def _table(r: dict) -> str:
    mb = lambda b: f"{b / 1e6:,.1f} MB"
    lines = [f"{r['workload']}: {r['from']} -> {r['to']} after update {r['switch_after_update']}, then p = {r['p']} updates",
             f"{'method':<7} {'switch wrote':>13} {'switch read':>12} {'switch s':>9} {'next p updates wrote':>21} "
             f"{'their s':>8} {'disk at switch':>15} {'disk max':>10} {'disk at end':>12}"]
    for name, m in r["methods"].items():
        s, d = m["switch"], m["drain_period"]
        lines.append(f"{name:<7} {mb(s['bytes_written']):>13} {mb(s['bytes_read']):>12} {s['wall_seconds']:>9.3f} "
                     f"{mb(d['bytes_written']):>21} {d['seconds']:>8.2f} {mb(m['disk_bytes_at_switch']):>15} "
                     f"{mb(m['disk_bytes_max']):>10} {mb(m['disk_bytes_at_end']):>12}")
    return "\n".join(lines)
