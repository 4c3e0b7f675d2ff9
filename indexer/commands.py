"""The indexer's subcommands: ``ebb run``, ``ebb explain`` and ``ebb demo``."""

from __future__ import annotations

import argparse
import sys


def register(sub) -> None:
    p = sub.add_parser("run", help="compute a job's ticks with Spark and load them",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Run a job (a TOML file: sources, one windowed query, an archive). Each tick at "
                       "T = tau + j*Delta computes the results with ts in (T - Delta, T] from the landed files and loads "
                       "them into the archive in one atomic update, together with the scheduler's progress, so every "
                       "landed event is processed exactly once even across crashes. Without --ticks or --until, runs "
                       "the ticks that are due by the wall clock (catching up after downtime) and exits.")
    p.add_argument("job", help="the job's TOML file")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--ticks", type=int, metavar="N", help="run the next N ticks, whatever the wall clock says")
    g.add_argument("--until", type=int, metavar="T", help="run every tick up to time T (chronons)")
    g.add_argument("--follow", action="store_true", help="keep running, one tick every Delta of wall-clock time")
    p.add_argument("--master", help="Spark master URL (default local[*])")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="Spark configuration, repeatable")
    p.set_defaults(handler=run_cmd)

    p = sub.add_parser("explain", help="classify a job's query and show the layout it gets",
                       description="Print the query's update pattern (monotonic, weakest, weak, strict) and why, the "
                       "largest lifetime S it can produce, the lookback a tick reads, and the archive layout 'auto' picks. "
                       "Queries that cannot be archived are rejected with the reason (exit 3).")
    p.add_argument("job", help="the job's TOML file")
    p.set_defaults(handler=explain_cmd)

    p = sub.add_parser("demo", help="run the built-in Spark demo end to end",
                       description="Generate a synthetic stream (temperature sensors polled every 10 minutes, humidity "
                       "sensors every 15) into a landing directory, run the job for several ticks with Spark, and print "
                       "what each tick loaded, its update I/O, and a sample probe.")
    p.add_argument("--dir", help="working directory (default: a new temporary directory)")
    p.add_argument("--ticks", type=int, default=12, help="periodic ticks to run after the bulk load (default 12)")
    p.add_argument("--sensors", type=int, default=2000, help="sensors per kind (default 2000)")
    p.add_argument("--master", help="Spark master URL (default local[*])")
    p.set_defaults(handler=demo_cmd)


def _conf(pairs: list[str]) -> dict[str, str]:
    out = {}
    for kv in pairs:
        k, sep, v = kv.partition("=")
        if not sep:
            raise ValueError(f"--conf takes KEY=VALUE, got {kv!r}")
        out[k] = v
    return out


def _job(path: str):
    from .jobspec import load_job

    return load_job(path)


def run_cmd(a) -> int:
    from .jobspec import JobError
    from .scheduler import Scheduler

    try:
        job = _job(a.job)
        say = lambda m: print(m, flush=True)
        with Scheduler(job, a.master, _conf(a.conf), say) as s:
            n = s.run(ticks=a.ticks, until=a.until, follow=a.follow)
            prog = s.progress()
        print(f"ran {n} ticks; archive at T={s.archive.config.time.time_of(prog.last_slot) if prog.last_slot is not None else '-'}"
              f"; {prog.late_total} late events dropped so far")
        return 0
    except JobError as e:
        print(f"ebb: error: {e}", file=sys.stderr)
        return 3


def explain_cmd(a) -> int:
    from .jobspec import JobError
    from .patterns import classify
    from .scheduler import archive_config

    try:
        job = _job(a.job)
        c = classify(job)
    except JobError as e:
        print(f"ebb: error: cannot archive this query: {e}", file=sys.stderr)
        return 3
    cfg = archive_config(job, c)
    q = job.query
    print(f"query      {q.kind} over {', '.join(w.source for w in q.windows)}; key {q.key!r}")
    print(f"pattern    {c.pattern} non-monotonic: {c.reason}")
    print(f"S          {c.max_lifetime} chronons ({job.time_unit}): the largest lifetime a result can have")
    print(f"lookback   {c.lookback} chronons: a tick reads events from (T - Delta - {c.lookback}, T]")
    chosen = "auto -> " if job.archive.layout == "auto" else ""
    print(f"layout     {chosen}{cfg.layout_obj.describe()}, {cfg.mode}; Delta={cfg.delta} S={cfg.max_lifetime} (p={cfg.time.p})")
    print(f"archive    {job.archive.path}")
    return 0


def demo_cmd(a) -> int:
    from .demo import run_demo

    return run_demo(a.dir, a.ticks, a.sensors, a.master)
