"""``ebb bench WORKLOAD``: reproduce the thesis's experiments (Chapter 4.4) and compare ebb with
the stores users would otherwise pick, on the same records and the same update schedule.

The command measures the machine's sequential disk bandwidth, runs every configuration (ebb
layouts and peers) in a process of its own through ``tools.run_config``, showing a progress
bar, then summarises (``tools.results``), draws the thesis-style figures (``tools.plots``) and
rewrites ``docs/benchmarks.md`` (``tools.report``). ``register`` adds the command to the ``ebb``
parser (``tools/cli.py``); imports nothing heavy until it runs. ``ebb bench soak`` is another kind of
run: ebb as a service, for a set time (``tools.soak``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
WORKLOAD_NAMES = ("thesis-small", "thesis-large", "thesis-large-smallbatch", "fluctuating", "periodic", "many-keys", "quick")
# per workload: (updates, scan every K-th update, cold-cache slot one in K scans); see --help
SCHEDULES: dict[str, tuple[int, int, int]] = {
    "thesis-small": (36, 1, 6),
    "fluctuating": (36, 4, 9),
    "periodic": (36, 1, 0),  # no cold slots: the spread of (warm) update times is the measure
    "thesis-large": (4, 2, 2),
    "thesis-large-smallbatch": (4, 2, 2),
    "many-keys": (6, 2, 3),
    "quick": (4, 1, 4),
}

DESCRIPTION = """\
Run a benchmark workload against ebb's layouts and the peer stores.

Workloads (thesis section 4.4; uniform keys, lifetimes uniform in [1, S], S = 36 Delta unless
stated, bulk load then periodic updates, each followed by a probe of a random key and a full scan):
  thesis-small   1000-byte records, 100 keys, ~500 MB live; all wave layouts
                 (R/D-ins/exp, n = 4, 9, 16, 25), doubly Rebuild/NoRebuild round-robin and
                 chronological at 2x2..5x5, 2x8, 8x2, and every peer (Figures 4.4-4.7);
                 36 updates with a probe and a scan after each (the thesis protocol), 6 cold slots
  fluctuating    as thesis-small with the data rate varying randomly by up to x4 (Figure 4.8);
                 R-ins, D-ins, Rebuild, NoRebuild (round-robin and random) at n = 4, 16;
                 36 updates, a scan after every 4th, 1 cold slot
  periodic       as thesis-small with a data rate periodic over 4 updates (one burst at 4x the
                 rate of three quiet slots), the worst case of round-robin partitioning (thesis
                 4.3.3): Rebuild and NoRebuild 4x4, round-robin, chronological and random;
                 36 updates with a probe and a scan after each, no cold slots
  thesis-large   ~5 GB live (Figures 4.9-4.11): R-ins, D-ins at n = 4, 16, Rebuild and
                 NoRebuild 2x2, 4x4; no peers; 4 updates, a scan after every 2nd, 1 cold slot;
                 each update brings 10x thesis-small's batch
  thesis-large-smallbatch
                 ~5 GB live with thesis-small's batch per update (S = 370 Delta, so 10x
                 thesis-small's archive at the same batch size): Rebuild and NoRebuild 2x2, 4x4;
                 the update-memory comparison of issue 8; schedule as thesis-large
  many-keys      1,000,000 keys, 200-byte records, ~500 MB live: R-ins16, D-ins16,
                 Rebuild4x4, NoRebuild4x4 and every peer; 6 updates, a scan after every 2nd
  quick          a tiny version of everything, for CI (about a minute): every technique at two
                 sizes (n = 4 and 9; doubly 2x2, 3x3, and 4x4, 2x8, 8x2) and every peer, 4 updates
  library        the library-level comparison (tools/library_bench.py): 1,000,000 int64 keys,
                 ~900k live 200-byte records, Rebuild2x2, NoRebuild4x4 (also keyed by strings),
                 SQLite, RocksDB, LMDB, each in its own build and read processes; warm probe
                 p50/p99 over 5 passes of 2,000 plain-timed probes, the stores taking turns,
                 cold probes in rounds of every store, a 10,000-key probe_many, a scan, the
                 median update; writes library.md and library.json to --out (about 10 minutes)
  soak           not a workload but the deployment, for --minutes (default 30; --short: about 4
                 minutes in all): a producer landing files, `ebb run --follow`, `ebb serve` with 8
                 client threads and a Spark analysis a minute, in processes of their own, with a
                 SIGKILL of the scheduler and a restart of the server; measured every 5 s and
                 checked against an oracle at the end (docs/operations.md, "Soak test")

Every update, probe and scan records wall time, /proc/self/io bytes read and written, peak
anonymous memory (RssAnon sampled every 2 ms during the operation; page-cache pages of mapped
files do not count), ebb's own counts (sub-indices, blocks, bytes) and the store's size on disk;
a random subset of slots (see --cold-every) is measured with every store closed and the page
cache dropped first (root only; reported if not allowed). Results go to --out (ops.csv,
summary.csv, machine.json, figures); unless --no-docs, the figures and their CSVs are copied to
docs/benchmarks/ and docs/benchmarks.md is rewritten from every workload summarised there.
"""

EPILOG = """\
examples:
  ebb bench quick                                  # CI smoke run, writes nothing under docs/
  ebb bench thesis-small                           # the reproduction (about 50 minutes here)
  ebb bench thesis-small --updates 12 --scan-every 2   # a shorter version (about 17 minutes)
  ebb bench thesis-large --configs Rebuild4x4,R-ins16 --updates 6
  ebb bench thesis-large-smallbatch                # 5 GB, thesis-small's batch: issue 8's memory target
  ebb bench periodic                               # does random allocation help a periodic rate?
  ebb bench thesis-small --resume                  # continue an interrupted run
  ebb bench thesis-small --one-layout D-ins4 --configs D-ins4,sqlite,duckdb,lmdb,rocksdb,parquet
                                                   # one layout against every peer (docs/benchmarks/one-layout/)
  ebb bench soak --short --out /tmp/soak           # the deployment for about 4 minutes (CI)
  ebb bench library --scale 0.05 --cold 2          # the library-level comparison, small and quick
"""


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "bench", help="reproduce the thesis's experiments and compare with SQLite, DuckDB, LMDB, RocksDB, Parquet",
        description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workload", choices=WORKLOAD_NAMES + ("library", "soak"),
                   help="which workload to run, or library or soak (see above)")
    p.add_argument("--out", metavar="DIR", help="results directory (default: bench-results/WORKLOAD in the current directory)")
    p.add_argument("--configs", metavar="LIST",
                   help="comma-separated configurations instead of the workload's default set, e.g. "
                   "R-ins16,D-exp9,Rebuild4x4,NoRebuild2x8-chr,Rebuild3x3-rand,sqlite,parquet")
    p.add_argument("--no-peers", action="store_true", help="leave out SQLite, DuckDB, LMDB, RocksDB and Parquet")
    p.add_argument("--updates", type=int, metavar="N", help="periodic updates after the bulk load (default: the workload's)")
    p.add_argument("--scan-every", type=int, metavar="K",
                   help="scan after every K-th update only (1 = the thesis protocol; default: the workload's, above)")
    p.add_argument("--cold-every", type=int, metavar="K",
                   help="in one scan slot out of K (chosen at random, the same for every configuration) drop the "
                   "page cache before the update, and again before a probe and a scan measured cold; 0 = never "
                   "(default: the workload's, above)")
    p.add_argument("--bandwidth-mib", type=int, metavar="MIB",
                   help="size of the O_DIRECT sequential read/write test (default 1024; quick 64; 0 = skip)")
    p.add_argument("--resume", action="store_true", help="keep configurations already complete in --out and run the rest")
    p.add_argument("--no-docs", action="store_true", help="do not touch docs/ (default for quick)")
    p.add_argument("--docs-dir", metavar="DIR", help=f"where benchmarks.md and benchmarks/ go (default: {REPO_ROOT / 'docs'})")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (one line per configuration instead)")
    p.add_argument("--one-layout", metavar="LAYOUT",
                   help="publish this run as the one-layout comparison of LAYOUT against the peers "
                   "(docs/benchmarks/one-layout/), not as the workload's full run; --configs then lists LAYOUT, "
                   "the peers and any other layouts shown beside them")
    p.add_argument("--minutes", type=float, metavar="M", help="soak only: length of the steady phase (default 30)")
    p.add_argument("--short", action="store_true", help="soak only: the CI run, about 4 minutes in all (6 on a slow machine), same checks")
    library = p.add_argument_group("library only (see `python -m ebb.tools.library_bench --help`)")
    library.add_argument("--stores", metavar="LIST", help="ebb layouts and peers to compare (default Rebuild2x2,"
                         "NoRebuild4x4,sqlite,rocksdb,lmdb)")
    library.add_argument("--string-keys", action=argparse.BooleanOptionalAction, default=True,
                         help="also run each ebb layout keyed by strings (default on)")
    library.add_argument("--scale", type=float, default=1.0, metavar="F", help="records and keys times F (default 1)")
    library.add_argument("--cold", type=int, metavar="N", help="cold probes per store (default 20; 0 = none)")
    library.add_argument("--probes", type=int, metavar="N", help="timed warm probes per store (default 2000)")
    library.add_argument("--passes", type=int, metavar="N", help="passes of the timed probes, the stores taking turns "
                         "(default 5)")
    library.add_argument("--warmup", type=int, metavar="N", help="untimed probes before them (default 200)")
    library.add_argument("--batch", type=int, metavar="N", help="keys in the probe_many batch (default 10000)")
    library.add_argument("--dir", metavar="DIR", help="where the stores are built (default a new directory under /tmp)")
    library.add_argument("--keep", action="store_true", help="keep the stores at the end")
    p.set_defaults(handler=run)


_LIBRARY_ONLY = ("stores", "cold", "probes", "passes", "warmup", "batch", "dir")


def run(args: argparse.Namespace) -> int:
    from ..storage.errors import UsageError

    if args.one_layout and (args.workload in ("soak", "library", "quick") or args.no_docs):
        raise UsageError("--one-layout publishes a thesis workload's run to docs/: not with quick, library, soak or --no-docs")
    if args.workload == "soak":
        from . import soak

        return soak.run(args)
    if args.workload == "library":
        from . import library_bench as lib

        defaults = {"stores": lib.DEFAULT_STORES, "cold": lib.COLD_PROBES, "probes": lib.PROBES, "passes": lib.PROBE_PASSES,
                    "warmup": lib.WARMUP_PROBES, "batch": lib.BATCH_KEYS, "out": "bench-results/library", "bandwidth_mib": 256}
        for name, value in defaults.items():
            if getattr(args, name) is None:
                setattr(args, name, value)
        return lib.run(args)
    if any(getattr(args, name) is not None for name in _LIBRARY_ONLY) or args.keep or args.scale != 1.0:
        raise UsageError("--stores, --scale, --cold, --probes, --passes, --warmup, --batch, --dir and --keep are options of "
                         "`ebb bench library`")
    if args.minutes is not None or args.short:
        raise UsageError("--minutes and --short are options of `ebb bench soak`")
    from . import configs as cfgs
    from .plan import Plan

    quick = args.workload == "quick"
    names = args.configs.split(",") if args.configs else cfgs.default_configs(args.workload)
    names = [n.strip() for n in names if n.strip()]
    if args.no_peers:
        names = [n for n in names if n not in cfgs.PEERS]
    for n in names:
        cfgs.parse(n)  # ValueError (exit 1) names the bad one before anything runs
    if args.one_layout and args.one_layout not in names:
        raise UsageError(f"--one-layout {args.one_layout} is not among the configurations run ({','.join(names)})")
    out = Path(args.out or Path.cwd() / "bench-results" / args.workload).resolve()
    updates, scan_every, cold_every = SCHEDULES[args.workload]
    plan = Plan.create(args.workload, names, out, updates=args.updates or updates, scan_every=args.scan_every or scan_every,
                       cold_every=cold_every if args.cold_every is None else args.cold_every)
    bandwidth = (64 if quick else 1024) if args.bandwidth_mib is None else args.bandwidth_mib
    status = execute(plan, bandwidth << 20, resume=args.resume, progress=not args.no_progress)

    from . import results

    summary = results.summarise(plan)
    results.write(plan, summary)
    print(f"results: {plan.out}/ (ops.csv, summary.csv, machine.json)")
    if not (args.no_docs or (quick and args.docs_dir is None)):
        from . import report

        docs = Path(args.docs_dir).resolve() if args.docs_dir else REPO_ROOT / "docs"
        written = report.publish(plan, summary, docs, one_layout=args.one_layout)
        print(f"docs: {written}")
    else:
        from . import plots

        figs = plots.draw_workload(plan.workload, {plan.workload: summary}, plan.out, ops=results.load_ops(plan.out))
        print(f"figures: {', '.join(str(f) for f in figs) or '(none for this set of configurations)'}")
    return status


def execute(plan, bandwidth_bytes: int, resume: bool, progress: bool) -> int:
    """Runs every configuration of ``plan`` not already complete; 0 if all succeeded, else 1."""
    from . import machine
    from .results import complete_configs

    plan.out.mkdir(parents=True, exist_ok=True)
    stores = plan.out / "stores"
    stores.mkdir(exist_ok=True)
    mach_path = plan.out / "machine.json"
    if not (resume and mach_path.exists()):
        mach = machine.describe(str(stores), bandwidth_bytes)
        mach_path.write_text(json.dumps(mach, indent=2))
    else:
        mach = json.loads(mach_path.read_text())
    if mach["cold_cache_problem"]:
        print(f"ebb bench: cold-cache measurements disabled: {mach['cold_cache_problem']}", file=sys.stderr)
        plan.disable_cold()
    plan.save()
    ops_csv = plan.out / "ops.csv"
    done = complete_configs(plan) if resume else set()
    if not resume and ops_csv.exists():
        ops_csv.unlink()
    elif resume:
        _drop_incomplete(ops_csv, done)
    todo = [c for c in plan.configs if c not in done]
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=plan.ops_per_config() * len(todo), unit="op", desc=plan.workload, dynamic_ncols=True)
    failures = []
    for name in todo:
        job_path = plan.out / f"job-{name}.json"
        job_path.write_text(json.dumps(plan.job(name, str(stores / name), str(ops_csv))))
        t0 = time.time()
        if bar is not None:
            bar.set_postfix_str(name)
        proc = subprocess.Popen([sys.executable, "-m", "ebb.tools.run_config", str(job_path)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for line in proc.stdout:
            if bar is not None and line.startswith("op "):
                bar.update(1)
        err = proc.stderr.read()
        rc = proc.wait()
        job_path.unlink(missing_ok=True)
        if rc != 0:
            failures.append(name)
            (plan.out / f"failed-{name}.log").write_text(err)
            msg = f"ebb bench: {name} failed (exit {rc}); see {plan.out}/failed-{name}.log"
            print(msg, file=sys.stderr) if bar is None else bar.write(msg)
        elif bar is None:
            print(f"{name}: {time.time() - t0:.1f} s", flush=True)
    if bar is not None:
        bar.close()
    return 1 if failures else 0


def _drop_incomplete(ops_csv: Path, keep: set[str]) -> None:
    """Removes the rows of configurations that did not finish, so they can run again."""
    import csv

    if not ops_csv.exists():
        return
    with open(ops_csv, newline="") as f:
        rows = list(csv.DictReader(f))
        fields = rows[0].keys() if rows else []
    with open(ops_csv, "w", newline="") as f:
        if rows:
            w = csv.DictWriter(f, fieldnames=list(fields))
            w.writeheader()
            w.writerows(r for r in rows if r["config"] in keep)
