"""``ebb bench-scaleout``: ticks loaded by Spark executors (indexer/executor_load.py), measured.

Two experiments, each configuration in its own process (a Spark master cannot change in one):

- **driver memory**: ticks of 100k and of 1M results (200-byte records, generated on the
  executors) loaded by executors into a Rebuild 2x2 archive; the peak anonymous memory (RssAnon)
  of the driver's Python process and of the Spark driver JVM during each tick. In local mode that
  JVM also runs the executors, so its figure is an upper bound of the driver's.
- **scaling**: thesis-large (1000-byte records, 100 keys, S = 36 Delta, about 5 GB live after the
  bulk load), Rebuild 4x4, loaded and updated by executors with 1 and with 2 executor cores
  (local[1], local[2]); each update's time split into planning, the tasks, and the commit.

Results go to --out (scaleout.json) and, unless --no-docs, to docs/benchmarks/scaleout.json,
which docs/benchmarks.md and docs/cluster.md quote. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCALING_UPDATES = 3
CHILD_TIMEOUT_S = 1800
ROWS_PER_INPUT_PARTITION = 150_000  # generated results per Spark partition of the routing stage
THESIS_LARGE = dict(record_bytes=1000, keys=100, p=36, live_bytes=5_000_000_000)  # as `ebb bench thesis-large`


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "bench-scaleout", help="measure ticks loaded by Spark executors (driver memory, 1 vs 2 cores)",
        description=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="bench-results/scaleout", help="results directory (default %(default)s)")
    p.add_argument("--dir", help="where the archives go (default: a temporary directory, removed afterwards)")
    p.add_argument("--no-docs", action="store_true", help="do not write docs/benchmarks/scaleout.json")
    p.add_argument("--updates", type=int, default=SCALING_UPDATES, help="scaling: updates after the bulk load (default 3)")
    p.add_argument("--child", help=argparse.SUPPRESS)  # internal: one configuration, in its own process
    p.set_defaults(handler=run)


def run(a) -> int:
    if a.child:
        print(json.dumps(_child(json.loads(a.child))), flush=True)
        return 0
    work = Path(a.dir or tempfile.mkdtemp(prefix="ebb-scaleout-"))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
              "commit": _commit(), "memory": [], "scaling": []}
    try:
        for rows in (100_000, 1_000_000):
            print(f"driver memory: a tick of {rows} results...", flush=True)
            result["memory"].append(_in_child({"kind": "memory", "rows": rows, "dir": str(work / f"mem{rows}")}))
        for cores in (1, 2):
            print(f"scaling: thesis-large, Rebuild 4x4, {cores} executor core(s)...", flush=True)
            result["scaling"].append(_in_child({"kind": "scaling", "cores": cores, "updates": a.updates,
                                                "dir": str(work / f"scale{cores}")}))
    finally:
        if not a.dir:
            shutil.rmtree(work, ignore_errors=True)
    text = json.dumps(result, indent=2)
    (out / "scaleout.json").write_text(text)
    if not a.no_docs:
        docs = Path(__file__).resolve().parent.parent / "docs" / "benchmarks"
        (docs / "scaleout.json").write_text(text)
    print(summary(result))
    return 0


def _commit() -> str:
    try:
        here = Path(__file__).resolve().parent.parent
        return subprocess.run(["git", "-C", str(here), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def _in_child(spec: dict) -> dict:
    r = subprocess.run([sys.executable, "-m", "ebb.tools.cli", "bench-scaleout", "--child", json.dumps(spec)],
                       capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    if r.returncode != 0:
        raise RuntimeError(f"{spec['kind']} run failed: {r.stderr.strip().splitlines()[-1:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _results(spark, n: int, lo: int, hi: int, s: int, keys: int, record_bytes: int, seed: int, parts: int):
    """n results with ts in (lo, hi], lifetimes uniform in [1, s], generated on the executors."""
    from pyspark.sql import functions as F

    pad = max(1, record_bytes - 24)
    return (spark.range(n, numPartitions=parts)
            .select((F.floor(F.rand(seed) * keys)).cast("bigint").alias("key"),
                    (F.lit(lo + 1) + F.floor(F.rand(seed + 1) * (hi - lo))).cast("bigint").alias("ts"),
                    (F.floor(F.rand(seed + 2) * s) + 1).cast("bigint").alias("life"),
                    F.expr(f"substring(repeat(sha2(cast(id as string), 256), {pad // 64 + 1}), 1, {pad})").alias("payload"))
            .select("key", "ts", (F.col("ts") + F.col("life")).alias("exp"), "payload"))


def _input_partitions(rows: int, cores: int) -> int:
    return max(2 * cores, -(-rows // ROWS_PER_INPUT_PARTITION))


def _child(spec: dict) -> dict:
    from ..indexer.executor_load import load
    from ..indexer.spark import session
    from ..storage.archive import Archive
    from ..storage.config import build_config
    from .measure import AnonPeak, release_unused_memory

    cores = spec.get("cores", 2)
    spark = session(f"local[{cores}]", {"spark.sql.shuffle.partitions": str(2 * cores)})
    jvm_pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    if spec["kind"] == "memory":
        cfg = build_config(layout="doubly", mode="rebuild", interval=10, max_lifetime=100, start=100, G=2, E=2)
        arc = Archive.create(spec["dir"], cfg)
        df = _results(spark, spec["rows"], 0, 100, 100, 1_000_000, 200, 7, _input_partitions(spec["rows"], cores))
        release_unused_memory()
        with AnonPeak() as py, AnonPeak(pid=jvm_pid) as jvm:
            t0 = time.perf_counter()
            rec = load(spark, arc, df, 100)
            wall = time.perf_counter() - t0
        arc.close()
        return {"rows": spec["rows"], "inserted": rec["inserted"], "wall_s": round(wall, 3),
                "driver_python_anon_base": py.base, "driver_python_anon_peak": py.peak,
                "driver_jvm_anon_base": jvm.base, "driver_jvm_anon_peak": jvm.peak}
    from .workloads import _per_slot

    w = dict(THESIS_LARGE, per_slot=_per_slot(THESIS_LARGE["live_bytes"], THESIS_LARGE["record_bytes"]))
    s = w["p"]
    cfg = build_config(layout="doubly", mode="rebuild", interval=1, max_lifetime=s, start=s, G=4, E=4)
    arc = Archive.create(spec["dir"], cfg)
    updates = []
    for u in range(spec["updates"] + 1):
        at = s + u
        lo, n = (0, w["per_slot"] * s) if u == 0 else (at - 1, w["per_slot"])
        df = _results(spark, n, lo, at, s, w["keys"], w["record_bytes"], 11 + u, _input_partitions(n, cores))
        rec = load(spark, arc, df, at)
        updates.append({k: rec[k] for k in ("kind", "input_rows", "inserted", "deleted", "parts", "plan_seconds",
                                            "tasks_seconds", "commit_seconds", "part_seconds_max", "bytes_read",
                                            "bytes_written", "wall_seconds")})
        print(f"  update {u}: {updates[-1]}", file=sys.stderr, flush=True)
    live = sum(x.bytes for x in arc.state().subindices)
    arc.close()
    return {"cores": cores, "live_bytes": live, "updates": updates}


def summary(r: dict) -> str:
    """The results as the markdown docs/benchmarks.md and docs/cluster.md quote."""
    lines = [f"Measured on commit {r['commit']}, {r['machine']['cpus']} cores.", "",
             "| tick size | driver Python peak anon | driver JVM peak anon (local mode: with executors) | wall s |",
             "|---|---|---|---|"]
    for m in r["memory"]:
        lines.append(f"| {m['rows']:,} results | {m['driver_python_anon_peak'] / 2**20:.0f} MiB "
                     f"(base {m['driver_python_anon_base'] / 2**20:.0f}) | {m['driver_jvm_anon_peak'] / 2**20:.0f} MiB "
                     f"(base {m['driver_jvm_anon_base'] / 2**20:.0f}) | {m['wall_s']:.1f} |")
    lines += ["", "| executor cores | live GB | periodic update s (median) | tasks s | commit s | plan s | parts |",
              "|---|---|---|---|---|---|---|"]
    med = {}
    for sc in r["scaling"]:
        per = [u for u in sc["updates"] if u["kind"] == "periodic"]
        pick = lambda k: sorted(u[k] for u in per)[len(per) // 2] if per else float("nan")
        med[sc["cores"]] = pick("tasks_seconds")
        lines.append(f"| {sc['cores']} | {sc['live_bytes'] / 1e9:.2f} | {pick('wall_seconds'):.2f} | "
                     f"{pick('tasks_seconds'):.2f} | {pick('commit_seconds'):.3f} | {pick('plan_seconds'):.3f} | "
                     f"{per[0]['parts'] if per else '-'} |")
    if 1 in med and 2 in med:
        lines += ["", f"Tasks' part, 1 core / 2 cores: {med[1] / med[2]:.2f}x."]
    return "\n".join(lines)
