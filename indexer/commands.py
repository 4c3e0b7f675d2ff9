"""The indexer's subcommands: ``ebb run``, ``ebb explain`` and ``ebb demo``.

Errors are raised, not printed: ``cli.main`` prints each as one ``ebb: error:`` line with the exit
code of its class. Spark is imported only when a command needs it.
"""

from __future__ import annotations

import argparse
import os

from ..storage.errors import UsageError


def register(sub) -> None:
    p = sub.add_parser("run", help="compute a job's ticks with Spark and load them",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Run a job (a TOML file: sources, one windowed query, an archive; see docs/jobs.md). "
                       "Each tick at T = tau + j*Delta computes the results with ts in (T - Delta, T] from the landed files "
                       "and loads them into the archive in one atomic update, together with the scheduler's progress, so "
                       "every landed event is processed exactly once even across crashes. Without --ticks or --until, runs "
                       "the ticks that are due by the wall clock (catching up after downtime) and exits; tick T is due "
                       "once the clock reads T + grace (job.grace, default Delta), so files landing up to then are in it.\n\n"
                       "It says first how many ticks are due. More than the catch-up bound (job.max_catchup, default "
                       "1000) are refused unless --max-catchup allows them or --ticks picks how many to run. A tick "
                       "whose input range holds no landed file skips Spark: it only updates the archive.")
    p.add_argument("job", help="the job's TOML file")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--ticks", type=int, metavar="N", help="run the next N ticks, whatever the wall clock says")
    g.add_argument("--until", type=int, metavar="T", help="run every tick up to time T (chronons)")
    g.add_argument("--follow", action="store_true",
                   help="keep running: one tick every Delta of wall-clock time, each once the clock reads its T + grace")
    p.add_argument("--max-catchup", type=int, metavar="N",
                   help="run at most N due ticks without --ticks (default: the job's max_catchup, else 1000)")
    p.add_argument("--master", help="Spark master URL (default local[*]), e.g. spark://HOST:7077 (docs/cluster.md)")
    p.add_argument("--load-on", choices=("driver", "executors"),
                   help="who writes each tick's run files: 'driver' collects the results and loads them here; "
                        "'executors' has Spark tasks write them into the archive's data_dir, which every executor "
                        "must mount, and only commits here (default: executors with a cluster --master, else driver)")
    p.add_argument("--part-mib", type=float, metavar="MIB",
                   help="with --load-on executors: live MiB of a Rebuild sub-index one Spark task rewrites (default 128)")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="Spark configuration, repeatable")
    p.add_argument("--verbose", action="store_true", help="show Spark's and the JVM's own log output")
    p.set_defaults(handler=run_cmd)

    p = sub.add_parser("explain", help="check a job and show its update pattern and layout",
                       description="Check a job file the way `ebb run` would and print the query's update pattern "
                       "(weakest or weak non-monotonic) and why, the largest lifetime S it can produce, the lookback a "
                       "tick reads, and the archive layout 'auto' picks. If every source has a landed file, Spark "
                       "analyses the query over empty inputs with those files' columns (expressions, the key among the "
                       "output columns, its type). Creates nothing on disk. Queries that cannot be archived and invalid "
                       "jobs are rejected with the reason (exit 2).")
    p.add_argument("job", nargs="+", help="the job's TOML file (several: checked in turn, with one Spark session)")
    p.add_argument("--master", help="Spark master URL (default local[*])")
    p.add_argument("--verbose", action="store_true", help="show Spark's and the JVM's own log output")
    p.set_defaults(handler=explain_cmd)

    p = sub.add_parser("demo", help="run the built-in Spark demo end to end",
                       description="Generate a synthetic stream (temperature sensors polled every 10 minutes, humidity "
                       "sensors every 15) into a landing directory, run the job for several ticks with Spark, and print "
                       "what each tick loaded, its update I/O, and a sample probe.")
    p.add_argument("--dir", help="working directory (default: a new temporary directory)")
    p.add_argument("--ticks", type=int, default=12, help="periodic ticks to run after the bulk load (default 12)")
    p.add_argument("--sensors", type=int, default=2000, help="sensors per kind (default 2000)")
    p.add_argument("--master", help="Spark master URL (default local[*])")
    p.add_argument("--verbose", action="store_true", help="show Spark's and the JVM's own log output")
    p.set_defaults(handler=demo_cmd)


def _conf(pairs: list[str]) -> dict[str, str]:
    out = {}
    for kv in pairs:
        k, sep, v = kv.partition("=")
        if not sep:
            raise UsageError(f"--conf takes KEY=VALUE, got {kv!r}")
        out[k] = v
    return out


def _job(path: str):
    from .jobspec import JobError, load_job

    try:
        return load_job(path)
    except JobError as e:
        raise JobError(str(e) if path in str(e) else f"{path}: {e}") from None


def run_cmd(a) -> int:
    from .scheduler import Scheduler

    job = _job(a.job)
    conf = _conf(a.conf)
    if a.part_mib is not None and a.part_mib <= 0:
        raise UsageError(f"--part-mib must be positive, not {a.part_mib}")
    say = lambda m: print(m, flush=True)
    with Scheduler(job, a.master, conf, say, verbose=a.verbose, load_on=a.load_on,
                   part_bytes=int(a.part_mib * 2**20) if a.part_mib else None) as s:
        n = s.run(ticks=a.ticks, until=a.until, follow=a.follow, max_catchup=a.max_catchup)
        prog = s.progress()
        at = "-" if prog.last_slot is None else s.when(s.config.time.time_of(prog.last_slot))
    print(f"ran {n} ticks; archive at {at}; {prog.late_total} late events dropped so far")
    return 0


def explain_cmd(a) -> int:
    from .jobspec import JobError
    from .patterns import classify
    from .scheduler import archive_config, grace_of

    spark = None
    for i, path in enumerate(a.job):
        job = _job(path)
        try:
            c = classify(job)
        except JobError as e:
            raise JobError(f"{path}: cannot archive this query: {e}") from None
        cfg = archive_config(job, c)
        q = job.query
        if len(a.job) > 1:
            print(("\n" if i else "") + f"== {path}")
        print(f"query      {q.kind} over {', '.join(w.source for w in q.windows)}; key {q.key!r}")
        print(f"pattern    {c.pattern} non-monotonic: {c.reason}")
        print(f"S          {c.max_lifetime} chronons ({job.time_unit}): the largest lifetime a result can have")
        print(f"lookback   {c.lookback} chronons: a tick reads events from (T - Delta - {c.lookback}, T]")
        if job.time_unit != "chronon":
            g = grace_of(job, cfg)
            print(f"grace      {g} chronons ({job.time_unit}): tick T runs when the wall clock reads T + {g}; "
                  "events at or before T that land after that are late")
        chosen = "auto -> " if job.archive.layout == "auto" else ""
        print(f"layout     {chosen}{cfg.layout_obj.describe()}, {cfg.mode}; Delta={cfg.delta} S={cfg.max_lifetime} (p={cfg.time.p})")
        print(f"archive    {job.archive.path}" + ("" if os.path.exists(job.archive.path) else " (created by the first `ebb run`)"))
        columns = None
        if all(_has_files(job.sources[w.source].path) for w in q.windows):
            if spark is None:
                spark = _spark_for_explain(a)
            from .tick import check

            try:
                columns = check(spark, job)
            except JobError as e:
                raise JobError(f"{path}: {e}") from None
        if columns is None:
            empty = [w.source for w in q.windows if not _has_files(job.sources[w.source].path)]
            print(f"columns    not checked: no file has landed for {', '.join(empty)} yet (every tick checks them)")
        else:
            print(f"columns    {', '.join(columns)}")
    return 0


def _has_files(directory: str) -> bool:
    from .landing import list_files

    return bool(list_files(directory))


def _spark_for_explain(a):
    import time

    from .spark import session

    print("checking the query against the sources' columns: starting Spark (10-30 s)...", flush=True)
    t0 = time.perf_counter()
    spark = session(a.master, {"spark.sql.shuffle.partitions": "1"}, app="ebb-explain", verbose=a.verbose)
    print(f"spark ready in {time.perf_counter() - t0:.1f} s", flush=True)
    return spark


def demo_cmd(a) -> int:
    from .demo import run_demo

    return run_demo(a.dir, a.ticks, a.sensors, a.master, a.verbose)
