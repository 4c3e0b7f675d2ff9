"""The indexer's subcommands: ``ebb run``, ``ebb explain`` and ``ebb demo``, their arguments
(``register``) and their work.

Errors are raised, not printed: ``tools/cli.py``'s ``main`` prints each as one ``ebb: error:``
line with the exit code of its class. Spark is imported only when a command needs it.
``load_job_file`` is how every command that takes a job file (``ebb advise`` too) reads it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from ..query.serve_cmd import add_metrics_options
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
    p.add_argument("--verbose", action="store_true",
                   help="show Spark's and the JVM's own log output, and each tick's line in a long catch-up")
    p.add_argument("--format", choices=("text", "json"), default="text",
                   help="json: one JSON object per line on stdout, one per tick and a summary last (other messages "
                        "go to stderr)")
    add_metrics_options(p)
    p.set_defaults(handler=run_cmd)

    p = sub.add_parser("explain", help="check a job and show its update pattern and layout",
                       description="Check a job file the way `ebb run` would and print the query's update pattern "
                       "(weakest or weak non-monotonic) and why, the largest lifetime S it can produce, the lookback a "
                       "tick reads, and the archive layout 'auto' picks. If every source has a landed file, Spark "
                       "analyses the query over empty inputs with those files' columns (expressions, the key among the "
                       "output columns, its type). Creates nothing on disk. Queries that cannot be archived and invalid "
                       "jobs are rejected with the reason (exit 2).")
    p.add_argument("job", nargs="+", help="the job's TOML file (several: each is checked and reported, with one "
                   "Spark session; the exit code is the worst)")
    p.add_argument("--master", help="Spark master URL (default local[*])")
    p.add_argument("--verbose", action="store_true", help="show Spark's and the JVM's own log output")
    p.add_argument("--format", choices=("text", "json"), default="text",
                   help="json: one document {jobs: [one report per job], exit_code} on stdout")
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


def load_job_file(path: str):
    """The job in the TOML file ``path``; a JobError (exit 2) that names the file if it is bad."""
    from .jobspec import JobError, load_job

    try:
        return load_job(path)
    except JobError as e:
        raise JobError(str(e) if path in str(e) else f"{path}: {e}") from None


def run_cmd(a) -> int:
    from .run_monitor import RunMonitor
    from .scheduler import Scheduler
    from .stopping import StopOnSignals, Stopped

    job = load_job_file(a.job)
    conf = _conf(a.conf)
    if a.part_mib is not None and a.part_mib <= 0:
        raise UsageError(f"--part-mib must be positive, not {a.part_mib}")
    report = RunReport(a.format, each_tick=a.follow or a.verbose)
    # logs and metrics for operators; with JSON logs the lines for a person become log records
    watch = RunMonitor(job, a)
    say = watch.say if watch.json else report.say
    # SIGTERM or Ctrl-C: finish the tick whose commit is under way or abandon the one computing,
    # say which in one line and exit 0 (a supervisor's stop is not a failure)
    stopped: str | None = None  # the one line a stop leaves
    with StopOnSignals() as stop:
        try:
            with Scheduler(job, a.master, conf, say, verbose=a.verbose, load_on=a.load_on,
                           part_bytes=int(a.part_mib * 2**20) if a.part_mib else None, stop=stop) as s:
                s.on_tick, s.tick_say = report.tick, report.tick_line
                watch.attach(s)
                try:
                    n = s.run(ticks=a.ticks, until=a.until, follow=a.follow, max_catchup=a.max_catchup)
                except Stopped as e:
                    stopped = s.stop_message(e.signame)
                except Exception as e:
                    if stop.signame is not None:
                        # the stop interrupted a py4j call, whose clean-up then failed on the half-read
                        # connection (e.g. "'JavaObject' object is not callable"): still the stop, and
                        # nothing of the tick was committed (a commit defers the signal)
                        stopped = s.stop_message(stop.signame)
                    else:
                        watch.failed(s, e)
                        raise
                finally:
                    stop.ignore()  # the run is over: a later signal changes nothing
                    watch.stop()
                prog = s.progress()
                at = "-" if prog.last_slot is None else s.when(s.config.time.time_of(prog.last_slot))
        except Stopped as e:  # while taking the runner lock or opening the archive
            stopped = f"ebb: stopped by {e.signame} while starting; nothing was run"
    if stopped is not None:
        watch.stopped(stopped)
        return 0
    report.summary(n, at, prog)
    return 0


class RunReport:
    """What ``ebb run`` prints about its ticks. A run shows a progress bar on a terminal and ends
    with one summary line: ticks, results archived, late events, bytes written, time. Each tick's
    own line is printed too when its pass runs at most ``FEW_TICKS`` ticks, and always with
    ``--follow`` or ``--verbose``; a long catch-up is the summary alone, not a thousand lines.
    With ``--format json``, stdout carries one JSON object per tick and the summary, nothing else."""

    FEW_TICKS = 10

    def __init__(self, fmt: str, each_tick: bool):
        import time

        from ..query.progress import Bar

        self.json, self.each_tick = fmt == "json", each_tick
        self.bar = Bar("ticks", unit="tick", enabled=not each_tick)
        self.t0 = time.perf_counter()
        self.ticks = self.results = self.late = self.bytes_written = self.new_files = 0
        self._line: str | None = None  # the last tick's own line, until ``tick`` knows how many are due

    def say(self, msg: str) -> None:
        if self.json or self.bar.shown:  # stdout is for JSON; a bar owns the terminal's last line
            self.bar.write(msg)
        else:
            print(msg, flush=True)

    def tick_line(self, msg: str) -> None:
        self._line = msg

    def tick(self, rec: dict, due: int) -> None:
        self.ticks += 1
        self.results += rec["inserted"]
        self.late += rec["late"]
        self.bytes_written += rec["bytes_written"]
        self.new_files += rec["new_files"]
        self.bar.set(None, due)
        self.bar.update()
        line, self._line = self._line, None
        if self.json:  # the JSON object says what the line would
            print(json.dumps({"event": "tick", **rec}), flush=True)
        elif line is not None and (self.each_tick or due <= self.FEW_TICKS):
            self.say(line)

    def summary(self, n: int, at: str, prog) -> None:
        import time

        from ..query.progress import human_size, plural

        self.bar.close()
        seconds = time.perf_counter() - self.t0
        if self.json:
            print(json.dumps({"event": "summary", "ticks": n, "results": self.results, "late": self.late,
                              "new_files": self.new_files, "bytes_written": self.bytes_written,
                              "seconds": round(seconds, 3), "last_tick": prog.last_slot, "archive_at": at,
                              "late_total": prog.late_total}), flush=True)
            return
        print(f"ran {plural(n, 'tick')} in {seconds:.1f} s: {plural(self.results, 'result')} archived from "
              f"{plural(self.new_files, 'new file')}, {plural(self.late, 'late event')} dropped, "
              f"{human_size(self.bytes_written)} written; archive at {at}; "
              f"{plural(prog.late_total, 'late event')} dropped so far", flush=True)


def explain_cmd(a) -> int:
    """Checks every job given, prints each one's report (text, or one JSON document), and
    returns the worst exit code: a bad job does not stop the others from being checked."""
    from ..storage.errors import EXIT_ERROR, EbbError

    spark: list = []  # the one Spark session, started by the first job that needs it
    reports = []
    for i, path in enumerate(a.job):
        out = sys.stderr if a.format == "json" else sys.stdout
        if len(a.job) > 1 and a.format == "text":
            print(("\n" if i else "") + f"== {path}")
        try:
            reports.append({"job": path, "ok": True, "exit_code": 0, **_explain_job(a, path, spark, out)})
        except (EbbError, OSError, ValueError) as e:
            code = getattr(e, "exit_code", EXIT_ERROR)
            msg = " ".join(str(e).split())
            reports.append({"job": path, "ok": False, "exit_code": code, "error": msg})
            if a.format == "text":
                print(f"ebb: error: {msg}", file=sys.stderr, flush=True)
    worst = max(r["exit_code"] for r in reports)
    if a.format == "json":
        print(json.dumps({"jobs": reports, "exit_code": worst}, indent=2))
    return worst


def _explain_job(a, path: str, spark: list, out) -> dict:
    """``ebb explain`` of one job: prints its text report (unless JSON is asked for) and
    returns the same facts as a dict. Raises JobError (with the path) for a bad job."""
    from .jobspec import JobError
    from .patterns import classify
    from .scheduler import archive_config, grace_of

    text = a.format == "text"
    show = (lambda line: print(line, flush=True)) if text else (lambda line: None)
    job = load_job_file(path)
    try:
        c = classify(job)
    except JobError as e:
        raise JobError(f"{path}: cannot archive this query: {e}") from None
    cfg = archive_config(job, c)
    q = job.query
    chosen = "auto -> " if job.archive.layout == "auto" else ""
    exists = os.path.exists(job.archive.path)
    facts: dict = {"query": {"kind": q.kind, "sources": [w.source for w in q.windows], "key": q.key},
                   "pattern": f"{c.pattern} non-monotonic", "reason": c.reason, "max_lifetime": c.max_lifetime,
                   "time_unit": job.time_unit, "lookback": c.lookback, "grace": None,
                   "layout": cfg.layout_obj.describe(), "layout_auto": bool(chosen), "mode": cfg.mode,
                   "delta": cfg.delta, "p": cfg.time.p, "archive": job.archive.path, "archive_exists": exists}
    show(f"query      {q.kind} over {', '.join(w.source for w in q.windows)}; key {q.key!r}")
    show(f"pattern    {c.pattern} non-monotonic: {c.reason}")
    show(f"S          {c.max_lifetime} chronons ({job.time_unit}): the largest lifetime a result can have")
    show(f"lookback   {c.lookback} chronons: a tick reads events from (T - Delta - {c.lookback}, T]")
    if job.time_unit != "chronon":
        g = facts["grace"] = grace_of(job, cfg)
        show(f"grace      {g} chronons ({job.time_unit}): tick T runs when the wall clock reads T + {g}; "
             "events at or before T that land after that are late")
    show(f"layout     {chosen}{cfg.layout_obj.describe()}, {cfg.mode_text}; Delta={cfg.delta} S={cfg.max_lifetime} (p={cfg.time.p})")
    show(f"archive    {job.archive.path}" + ("" if exists else " (created by the first `ebb run`)"))
    columns = None
    if all(_has_files(job.sources[w.source].path) for w in q.windows):
        if not spark:
            spark.append(_spark_for_explain(a, out))
        from .tick import check

        try:
            columns = check(spark[0], job)
        except JobError as e:
            raise JobError(f"{path}: {e}") from None
    facts["columns"] = columns
    if columns is None:
        empty = [w.source for w in q.windows if not _has_files(job.sources[w.source].path)]
        facts["columns_unchecked"] = empty
        show(f"columns    not checked: no file has landed for {', '.join(empty)} yet (every tick checks them)")
    else:
        show(f"columns    {', '.join(columns)}")
    return facts


def _has_files(directory: str) -> bool:
    from .landing import list_files

    return bool(list_files(directory))


def _spark_for_explain(a, out):
    import time

    from .spark import session

    print("checking the query against the sources' columns: starting Spark (10-30 s)...", file=out, flush=True)
    t0 = time.perf_counter()
    spark = session(a.master, {"spark.sql.shuffle.partitions": "1"}, app="ebb-explain", verbose=a.verbose)
    print(f"spark ready in {time.perf_counter() - t0:.1f} s", file=out, flush=True)
    return spark


def demo_cmd(a) -> int:
    from .demo import run_demo

    return run_demo(a.dir, a.ticks, a.sensors, a.master, a.verbose)
