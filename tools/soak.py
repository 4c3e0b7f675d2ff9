"""``ebb bench soak``: ebb run as a service on this machine for a set time, measured throughout
and checked against a brute-force oracle at the end (issue 24, "How we will know: a soak test").

The deployment: separate processes, each in a process group of its own, everything under OUT
(docs/operations.md, "Soak test"):

- producer (``python -m ebb.tools.soak producer OUT``): every 2 s lands a Parquet file of sensor
  readings the way ``indexer/synthetic.py`` does (hidden name, then rename), each reading valid for
  a random lifetime of Delta..S seconds. Event times are out of order inside a file and across
  files (a tenth of the readings go into the next file), and some files are held back until a few
  seconds before the grace runs out. Its ledger (OUT/produced.csv) lists every file it landed.
- scheduler: ``ebb run OUT/job.toml --follow``: query kind ``lifetime`` (the oracle is the
  readings themselves, each valid [t, t + life)), Delta = 5 s, grace = 10 s, doubly partitioned
  3x3 NoRebuild, ``retain`` = 120 s of history readable with as_of.
- server: ``ebb serve OUT/archive`` on 127.0.0.1, and a client process whose 8 threads probe
  random keys and stream whole scans through ``FlightArchiveClient``, logging every read.
- analysis (``python -m ebb.tools.soak analysis OUT``): a Spark session (local[1]) that once a
  minute reads ``spark.read.format("ebb")``: a count, a collect through a mapInArrow whose
  partitions wait for updates to commit (so the read spans at least 5 updates), and a groupBy;
  its rows are kept.

Early in the run the scheduler's process group is killed with SIGKILL and started again, then the
server is stopped with SIGTERM and started again; the analysis starts once the restarted
scheduler has committed again.

Measured every 5 s (OUT/series.csv; OUT/soak.png, one panel per series): events produced and
archived; failed reads; probe p50 and p99 over the last minute; the first probe after each update
(the earliest-started probe answered from that update's version); anonymous memory (RssAnon) of
the scheduler, its JVM and the server; the size of index/data.mdb and of the data directory; and
the space of run files that the current version no longer references (replaced, not reclaimed).

Checked at the end, once the producer has stopped and the scheduler has committed the tick of the
last reading (printed, and OUT/summary.json; exit 1 if any check fails): no reading lost (every
tick inserted exactly the readings of its interval, none counted late) and the archive equal to
the oracle; no failed read outside the server's restart; every Spark analysis exactly one
version's rows, spanning at least 5 updates; the first probe after an update at most 2x the
steady p50; anonymous memory and metadata flat; ``ebb scan --as-of T`` equal to the oracle at 50
random instants of the retention window, and a clear error before it; both restarts recovered.
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ..storage.errors import EbbError, UsageError

if TYPE_CHECKING:
    import numpy as np

# files under OUT
SETTINGS, JOB, LANDING, ARCHIVE, LEDGER = "settings.json", "job.toml", "landing", "archive", "produced.csv"
READS, ANALYSES, ANALYSIS_ROWS, LOGS = "reads.csv", "analyses.csv", "analyses", "logs"
SCANS, SERIES, FIGURE, SUMMARY = "scans", "series.csv", "soak.png", "summary.json"

LEDGER_HEADER = ("seq", "file", "held", "landed", "readings", "min_t", "max_t", "lateness_s")
READS_HEADER = ("start", "thread", "kind", "ms", "update_seq", "rows", "error")
ANALYSIS_HEADER = ("i", "start", "end", "seq_before", "seq_after", "time_before", "time_after", "rows", "error")
SOURCE = "readings"
ROW_COLUMNS = ("sensor", "value", "source", "ts", "exp")  # what the job archives for each reading
READ_TIMEOUT_S = 60.0  # a client read that takes longer fails
MIN_SPANNED_UPDATES = 5  # a Spark analysis must run across at least this many updates
FIRST_PROBE_FACTOR = 2.0  # issue 24: first probe after an update at most 2x the steady p50
FLAT = 1.10  # memory and metadata: at most 10% above their earlier level
TIME_TRAVEL_INSTANTS = 50

JOB_TEMPLATE = """\
# written by `ebb bench soak` (tools/soak.py): sensor readings, each valid for its own lifetime
[job]
time_unit = "s"
origin = "{origin}"
grace = {grace}

[[source]]
name = "{source}"
path = "{landing}"
time_column = "event_time"
key = "sensor"
lifetime_column = "life"

[query]
kind = "lifetime"
source = "{source}"
max_lifetime = {max_lifetime}

[archive]
path = "{archive}"
layout = "doubly"
partitioning = "round-robin"
G = 3
E = 3
mode = "norebuild"
interval = {delta}
start = 0
retain = {retain}
update_log = {update_log}
"""


class SoakFailed(EbbError):
    """The deployment could not be brought up (exit code 1); the message names the log to read."""


@dataclass(frozen=True)
class Settings:
    """One soak run. Times in seconds; one chronon is one second, chronon 0 is ``origin_us``."""

    out: str
    steady_s: float  # the steady phase: everything runs; the restarts come early in it
    origin_us: int = 0
    port: int = 0  # ebb serve's, the same after its restart
    delta: int = 5
    grace: int = 10
    max_lifetime: int = 60  # S
    retain: int = 120
    sensors: int = 2000
    period: int = 10  # each sensor reports every `period` s
    file_every: float = 2.0
    late_share: float = 0.15  # files held back until 3-5 s before the grace runs out
    carry_share: float = 0.1  # readings that go into the next file
    sample_s: float = 5.0
    analysis_every: float = 60.0
    analysis_wait_s: float = 300.0  # an analysis's partitions wait at most this long for its updates
    threads: int = 8
    pause_s: float = 0.05  # a client thread's pause between reads
    scan_share: float = 0.05  # of the client reads, full scans
    seed: int = 24

    @property
    def update_log(self) -> int:
        """Update records the archive keeps: as many as the retention window holds versions."""
        return self.retain // self.delta

    @property
    def full_at(self) -> int:
        """Archive time from which the metadata should stay flat: the retention window and the
        update log (as long) are full, the runs of the first retained version have expired, and
        the leases of the first analyses (renewed while they read, then 60 s) have lapsed."""
        return self.retain + self.max_lifetime + int(self.analysis_every) + 60

    @property
    def max_seconds(self) -> float:
        """How long a process of the soak runs at most, whatever happens to the driver."""
        return self.steady_s + 900

    def path(self, name: str) -> Path:
        return Path(self.out) / name

    def chronon(self, wall: float) -> int:
        return int((int(wall * 1e6) - self.origin_us) // 1_000_000)


def settings(args) -> Settings:
    """The run ``ebb bench soak`` asked for (``--short``: the CI run, about 4 minutes in all)."""
    if args.short and args.minutes is not None:
        raise UsageError("give --short or --minutes, not both")
    minutes = 30.0 if args.minutes is None else args.minutes
    if not args.short and minutes < 5:
        raise UsageError(f"--minutes must be at least 5 (the retention window and S must fill well before the "
                         f"end), got {minutes:g}; --short is the short run")
    out = Path(args.out or Path.cwd() / "bench-results" / "soak").resolve()
    if (out / JOB).exists():
        raise UsageError(f"{out} already holds a soak run; give another --out")
    if args.short:  # S and the window halved, so that both fill within the run; a quarter of the
        # reads, so that on a slow 2-core CI machine the clients leave Spark room to keep up
        return Settings(out=str(out), steady_s=105.0, max_lifetime=30, retain=60, pause_s=0.2)
    return Settings(out=str(out), steady_s=minutes * 60)


# -- the producer --------------------------------------------------------------------------------
def produce(s: Settings) -> int:
    """Lands readings until SIGTERM (or ``max_seconds``), then lands what it holds back and exits."""
    import numpy as np

    from ..indexer.synthetic import SensorFleet

    stop = _stop_event()
    rng = np.random.default_rng(s.seed)
    fleet = SensorFleet(sensors=s.sensors, period=s.period, seed=s.seed)
    pending: list[tuple[float, bool, int, object]] = []  # (when to land, held back, sequence number, readings)
    carry, lo, seq = None, 0, 0
    tick, deadline = time.time(), time.time() + s.max_seconds
    with open(s.path(LEDGER), "w", newline="") as f:
        ledger = csv.writer(f)
        ledger.writerow(LEDGER_HEADER)
        while not stop.wait(max(0.0, tick - time.time())) and time.time() < deadline:
            hi = s.chronon(time.time())
            batch, carry = _next_batch(fleet.polls(lo, hi), carry, rng, s)
            lo, tick = hi, tick + s.file_every
            if batch.num_rows:
                pending.append((*_landing_time(batch, rng, s), seq, batch))
                seq += 1
            pending = _land_due(pending, time.time(), s, ledger)
            f.flush()
        if carry is not None and carry.num_rows:
            pending.append((0.0, False, seq, carry))
        _land_due(pending, float("inf"), s, ledger)
    return 0


def _next_batch(polls, carry, rng, s: Settings):
    """(this file's readings: the previous file's carry plus most of ``polls``, shuffled; the
    carry for the next file). Each reading gets its lifetime, Delta..S."""
    import pyarrow as pa

    n = polls.num_rows
    polls = polls.append_column("life", pa.array(rng.integers(s.delta, s.max_lifetime + 1, n), pa.int64()))
    held = rng.random(n) < s.carry_share
    batch = polls.filter(pa.array(~held))
    if carry is not None:
        batch = pa.concat_tables([carry, batch])
    return batch.take(pa.array(rng.permutation(batch.num_rows))), polls.filter(pa.array(held))


def _landing_time(batch, rng, s: Settings) -> tuple[float, bool]:
    """(when to land the file, whether it is held back): now, or for one file in ``late_share``
    3-5 s before the grace of its oldest reading runs out."""
    now = time.time()
    if rng.random() >= s.late_share:
        return now, False
    oldest = (s.origin_us / 1e6) + min(batch.column("t").to_pylist())
    return max(now, oldest + rng.uniform(s.grace - 5, s.grace - 3)), True


def _land_due(pending: list, now: float, s: Settings, ledger) -> list:
    """Lands the pending files due by ``now``, in that order, into the ledger; returns the rest."""
    from ..indexer.synthetic import land, with_timestamps

    due = sorted((p for p in pending if p[0] <= now), key=lambda p: p[:3])
    for _, held, seq, batch in due:
        name = f"{SOURCE}-{seq:06d}.parquet"
        land(with_timestamps(batch, s.origin_us, 1_000_000), str(s.path(LANDING)), name)
        landed = time.time()
        t = batch.column("t").to_pylist()
        ledger.writerow([seq, name, int(held), f"{landed:.3f}", len(t), min(t), max(t),
                         f"{landed - s.origin_us / 1e6 - min(t):.3f}"])
    return [p for p in pending if p[0] > now]


# -- the Flight clients --------------------------------------------------------------------------
def read_continuously(s: Settings) -> int:
    """``threads`` client threads reading from ``ebb serve`` until SIGTERM; every read is logged."""
    stop = _stop_event()
    lock = threading.Lock()
    with open(s.path(READS), "w", newline="") as f:
        log = csv.writer(f)
        log.writerow(READS_HEADER)

        def record(row: list) -> None:
            with lock:
                log.writerow(row)

        threads = [threading.Thread(target=_client, args=(s, i, stop, record), daemon=True) for i in range(s.threads)]
        for t in threads:
            t.start()
        stop.wait(s.max_seconds)
        stop.set()
        for t in threads:
            t.join(READ_TIMEOUT_S + 5)
    return 0


def _client(s: Settings, i: int, stop: threading.Event, record) -> None:
    """One thread: probes of random keys, and now and then a whole scan, streamed."""
    import random

    from ..query.flight_client import FlightArchiveClient, error_message
    from ..query.flight_protocol import ReadRequest

    rng = random.Random(s.seed * 1000 + i)
    with FlightArchiveClient(f"grpc://127.0.0.1:{s.port}", timeout=READ_TIMEOUT_S) as c:
        while not stop.is_set():
            kind = "scan" if rng.random() < s.scan_share else "probe"
            start, t0 = time.time(), time.perf_counter()
            seq, rows, error = "", 0, ""
            try:
                if kind == "probe":
                    table, state = c.read(ReadRequest("probe", key=rng.randrange(s.sensors)))
                    seq, rows = state.get("update_seq", ""), table.num_rows
                else:
                    rows = sum(b.num_rows for b in c.scan())
            except Exception as e:  # every failure is a failed read, logged with its message
                error = _one_line(f"{type(e).__name__}: {error_message(e)}")
            record([f"{start:.6f}", i, kind, f"{(time.perf_counter() - t0) * 1000:.3f}", seq, rows, error])
            stop.wait(s.pause_s)


# -- the Spark analysis --------------------------------------------------------------------------
def analyse_every_minute(s: Settings) -> int:
    """One Spark session (local[1]); an analysis every ``analysis_every`` s until SIGTERM, which
    lets the analysis under way finish. The first runs even if SIGTERM came while Spark started."""
    os.environ["PYSPARK_PYTHON"] = sys.executable  # its workers must import ebb
    from ..indexer.spark import session
    from ..query.spark_source import register

    stop = _stop_event()
    spark = session("local[1]", {"spark.sql.shuffle.partitions": "1"}, app="ebb-soak-analysis")
    register(spark)
    s.path(ANALYSIS_ROWS).mkdir(exist_ok=True)
    deadline, i = time.time() + s.max_seconds, 0
    with open(s.path(ANALYSES), "w", newline="") as f:
        log = csv.writer(f)
        log.writerow(ANALYSIS_HEADER)
        while True:
            started = time.time()
            log.writerow(_analysis(spark, s, i))
            f.flush()
            i += 1
            if stop.wait(max(0.0, started + s.analysis_every - time.time())) or time.time() >= deadline:
                break
    spark.stop()
    return 0


def _analysis(spark, s: Settings, i: int) -> list:
    """One analysis, as a row of the analyses log: the archive's version before and after it, the
    rows it returned (kept in OUT/analyses/I.parquet) or its error."""
    archive = str(s.path(ARCHIVE))
    seq0, time0 = _version(archive)
    start, rows, error = time.time(), -1, ""
    try:
        rows = _analyse(spark, archive, seq0 or 0, start + s.analysis_wait_s, s.path(ANALYSIS_ROWS) / f"{i:04d}.parquet")
    except Exception as e:  # a failed analysis is a failed read, logged with its message
        error = _one_line(_spark_error(e))
    seq1, time1 = _version(archive)
    return [i, f"{start:.3f}", f"{time.time():.3f}", seq0, seq1, time0, time1, rows, error]


def _analyse(spark, archive: str, seq0: int, deadline: float, out: Path) -> int:
    """count(), the rows collected through a mapInArrow that holds its partitions back until
    ``MIN_SPANNED_UPDATES`` updates after ``seq0`` have committed (they run one after another on
    local[1]), and a groupBy of the same DataFrame; they must agree. Writes the rows to ``out``;
    returns how many."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    df = spark.read.format("ebb").load(archive)
    partitions = df.rdd.getNumPartitions()
    counted = df.count()
    table = df.mapInArrow(_spanning(archive, seq0, max(partitions, 1), deadline), df.schema).toArrow()
    keys = df.groupBy("sensor").count().count()
    pq.write_table(table, out)
    distinct = len(pc.unique(table.column("sensor"))) if table.num_rows else 0
    if (counted, keys) != (table.num_rows, distinct):
        raise RuntimeError(f"one DataFrame, three answers: count() {counted}, {table.num_rows} rows collected; "
                           f"groupBy {keys} keys, {distinct} in the rows")
    return table.num_rows


def _spanning(archive: str, seq0: int, partitions: int, deadline: float):
    """A mapInArrow function: partition k of ``partitions`` passes its rows through once its share
    of ``MIN_SPANNED_UPDATES`` updates after ``seq0`` has committed, (k + 1) / partitions of them
    (or at ``deadline``). Waiting for updates, not for a time, makes the read span them however
    slowly the scheduler runs."""
    def partition(batches):
        from pyspark import TaskContext

        want = seq0 + -(-MIN_SPANNED_UPDATES * (TaskContext.get().partitionId() + 1) // partitions)
        while time.time() < deadline and (_version(archive)[0] or 0) < want:
            time.sleep(0.5)
        yield from batches
    return partition


def _spark_error(e: Exception) -> str:
    """The telling line of a Spark failure: the last Python exception line of a worker's
    traceback if there is one, else the message's first line."""
    lines = [x.strip() for x in str(e).splitlines() if x.strip()]
    raised = [x for x in lines if re.match(r"[\w.]+(Error|Exception|Read)\b", x)]
    return f"{type(e).__name__}: {raised[-1] if raised else (lines or [''])[0]}"


def _version(archive: str) -> tuple[int | None, int | None]:
    """(update_seq, time of the last update) of the archive's committed version."""
    from ..storage.archive import open_readonly

    with open_readonly(archive) as arc:
        st = arc.state()
        return st.update_seq, None if st.last_slot is None else arc.config.time.time_of(st.last_slot)


# -- the processes ---------------------------------------------------------------------------------
class Deployment:
    """The processes of a run, each started in a process group of its own (and killed if the
    driver dies); ``close`` kills every group still there."""

    def __init__(self, s: Settings):
        self.s = s
        self.procs: dict[str, subprocess.Popen] = {}  # the current process of each name
        self.runs: Counter = Counter()  # processes started per name (its logs are NAME-1.log, ...)
        self.started: list[subprocess.Popen] = []
        self.stopped: set[str] = set()
        self.events: list[tuple[float, str]] = []  # (wall time, what happened)
        self.t0 = time.time()

    def note(self, text: str) -> None:
        self.events.append((time.time(), text))
        print(f"[{time.time() - self.t0:6.0f} s] {text}", flush=True)

    def log(self, name: str) -> Path:
        return self.s.path(LOGS) / f"{name}-{self.runs[name]}.log"

    def start(self, name: str, argv: list[str]) -> None:
        self.runs[name] += 1
        with open(self.log(name), "wb") as log:
            p = subprocess.Popen(argv, cwd=self.s.out, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True, preexec_fn=_die_with_parent,
                                 env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.procs[name] = p
        self.started.append(p)
        self.stopped.discard(name)
        self.note(f"{name} started (pid {p.pid}): {' '.join(argv[1:])}")

    def stop(self, name: str, sig: int = signal.SIGTERM, wait_s: float = 30.0,
             while_waiting: Callable[[], object] | None = None) -> None:
        """SIGKILL goes to the whole group; another signal to the process alone, which then has
        ``wait_s`` to exit (a JVM of its own included) before the group is killed. ``while_waiting``
        is called about once a second while it winds down."""
        p = self.procs[name]
        self.stopped.add(name)
        if sig == signal.SIGKILL:
            _signal_group(p, sig)
        elif p.poll() is None:
            p.send_signal(sig)
        deadline = time.time() + wait_s
        while p.poll() is None and time.time() < deadline:
            if while_waiting:
                while_waiting()
            try:
                p.wait(max(0.0, min(1.0, deadline - time.time())))
            except subprocess.TimeoutExpired:
                pass
        if p.poll() is None:
            self.note(f"{name} still running {wait_s:.0f} s after signal {sig}: SIGKILL")
        _signal_group(p, signal.SIGKILL)
        p.wait()

    def died(self) -> list[str]:
        """Processes that exited though nobody stopped them."""
        return [n for n, p in self.procs.items() if n not in self.stopped and p.poll() is not None]

    def log_tail(self, name: str, lines: int = 5) -> str:
        text = self.log(name).read_text(errors="replace").splitlines()[-lines:]
        return " | ".join(x.strip() for x in text if x.strip())

    def close(self) -> None:
        for p in self.started:
            _signal_group(p, signal.SIGKILL)
            p.wait()


def _signal_group(p: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(p.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass  # the whole group is gone


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it when the driver dies (Linux PR_SET_PDEATHSIG)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


def _stop_event() -> threading.Event:
    """An event SIGTERM sets: how the driver asks a process of its own to finish."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    return stop


def _one_line(text: str) -> str:
    return " ".join(text.split())[:300]


# -- the driver ------------------------------------------------------------------------------------
class Soak:
    """Brings the deployment up, runs the steady phase with its restarts while sampling, and
    winds it down so that the archive holds every reading; ``checks`` judges the result."""

    def __init__(self, s: Settings):
        self.s, self.d = s, Deployment(s)
        self.samples: list[dict] = []
        self.inserted: dict[int, int] = {}  # tick time -> records the update at it inserted
        self.watching = threading.Event()  # set: the update watcher stops
        self.watcher: threading.Thread | None = None
        self.lock = threading.Lock()  # guards ``inserted``
        self.t0 = 0.0  # wall time the steady phase began
        self.scheduler_killed: tuple[float, int] = (0.0, 0)  # (wall time, updates committed by then)
        self.server_restarts: list[tuple[float, float]] = []  # (SIGTERM sent, serving again)
        self.deaths: list[str] = []
        self.warned: set[str] = set()

    def ebb(self, *args: object) -> list[str]:
        return [sys.executable, "-m", "ebb.tools.cli", *map(str, args)]

    def role(self, name: str) -> list[str]:
        return [sys.executable, "-m", "ebb.tools.soak", name, self.s.out]

    # -- phases ----------------------------------------------------------------------------------
    def setup(self) -> None:
        s = self.s
        for d in (LOGS, SCANS):
            s.path(d).mkdir(parents=True, exist_ok=True)
        s.path(SETTINGS).write_text(json.dumps(asdict(s), indent=2))
        origin = datetime.fromtimestamp(s.origin_us / 1e6, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        s.path(JOB).write_text(JOB_TEMPLATE.format(
            origin=origin, grace=s.grace, source=SOURCE, landing=LANDING, archive=ARCHIVE, delta=s.delta,
            max_lifetime=s.max_lifetime, retain=s.retain, update_log=s.update_log))
        self.d.start("producer", self.role("producer"))
        self.d.start("scheduler", self.ebb("run", JOB, "--follow"))
        self.wait_for("the archive's first update", lambda: self.sample().get("updates"), 300.0, "scheduler")
        self.watcher = threading.Thread(target=self.watch_updates, daemon=True)
        self.watcher.start()
        self.start_server()
        self.d.start("clients", self.role("clients"))
        self.t0 = time.time()
        self.d.note(f"steady phase: {s.steady_s / 60:.1f} min")

    def steady(self) -> None:
        """The restarts early on; the Spark analysis starts once the restarted scheduler has
        committed again (two JVMs starting at once on a small machine each take minutes)."""
        s = self.s
        end = self.t0 + s.steady_s
        actions = [(self.t0 + s.steady_s / 12, self.crash_scheduler), (self.t0 + s.steady_s / 8, self.restart_server)]
        next_sample = time.time()
        while time.time() < end:
            if time.time() >= next_sample:
                self.sample()
                next_sample = time.time() + s.sample_s
            while actions and actions[0][0] <= time.time():
                actions.pop(0)[1]()
            if "analysis" not in self.d.procs and not actions and self.recovered():
                self.d.start("analysis", self.role("analysis"))
            self.deaths = self.d.died()
            if self.deaths:
                self.d.note(f"{', '.join(self.deaths)} exited on its own ({self.d.log_tail(self.deaths[0])}); "
                            "ending the run")
                return
            time.sleep(max(0.0, min(next_sample, end) - time.time()))
        if "analysis" not in self.d.procs:
            self.d.note("the restarted scheduler had not committed by the end of the steady phase")
            self.d.start("analysis", self.role("analysis"))

    def recovered(self) -> bool:
        """The restarted scheduler has committed an update (by the last sample)."""
        return (self.samples[-1].get("updates") or 0) > self.scheduler_killed[1]

    def finish(self) -> None:
        """Once an analysis has finished, lets the one under way finish (no new one starts), stops
        the producer, waits until the tick of its last reading is committed and stops the scheduler
        at once, so the archive ends with the most readings live; then the clients and the server."""
        s = self.s
        try:  # at least one analysis, however late it started (not reached: the checks say so)
            self.wait_for("Spark analysis", self.analysed, s.analysis_wait_s + 120, "analysis")
        except SoakFailed as e:
            self.d.note(str(e))
        # sampled meanwhile: ticks go on committing
        self.d.stop("analysis", wait_s=s.analysis_every + 120, while_waiting=self.sample_due)
        self.d.stop("producer")
        last_tick = -(-max(int(r["max_t"]) for r in self.ledger()) // s.delta) * s.delta
        try:  # not reached: the checks say what is missing
            # polled often: a scheduler catching up commits ticks without readings many a second
            self.wait_for(f"the tick at T={last_tick} (the last reading's)",
                          lambda: (_version(str(s.path(ARCHIVE)))[1] or -1) >= last_tick,
                          s.origin_us / 1e6 + last_tick + s.grace + 180 - time.time(), "scheduler", poll_s=0.2)
        except SoakFailed as e:
            self.d.note(str(e))
        for name in ("scheduler", "clients", "server"):
            self.d.stop(name)
        self.d.note("stopped")
        self.watching.set()
        self.watcher.join()
        self.sample()

    def wait_for(self, what: str, done, timeout_s: float, proc: str, poll_s: float = 1.0) -> None:
        deadline = time.time() + timeout_s
        while not done():
            if self.d.procs[proc].poll() is not None:
                raise SoakFailed(f"{proc} exited (code {self.d.procs[proc].returncode}) while waiting for {what}: "
                                 f"{self.d.log_tail(proc)} (log: {self.s.path(LOGS)})")
            if time.time() > deadline:
                raise SoakFailed(f"no {what} after {timeout_s:.0f} s; {proc}: {self.d.log_tail(proc)}")
            time.sleep(poll_s)

    def start_server(self) -> None:
        self.d.start("server", self.ebb("serve", ARCHIVE, "--host", "127.0.0.1", "--port", self.s.port))
        self.wait_for("`ebb serve` listening", lambda: "ebb: serving" in self.d.log("server").read_text(), 60.0, "server")

    def crash_scheduler(self) -> None:
        self.scheduler_killed = (time.time(), self.samples[-1].get("updates") or 0)
        self.d.note("SIGKILL to the scheduler's process group (ebb run and its JVM)")
        self.d.stop("scheduler", signal.SIGKILL)
        self.d.start("scheduler", self.ebb("run", JOB, "--follow"))

    def restart_server(self) -> None:
        stopped = time.time()
        self.d.note("SIGTERM to ebb serve")
        self.d.stop("server")
        self.start_server()
        self.server_restarts.append((stopped, time.time()))
        self.d.note("ebb serve is serving again")

    # -- sampling --------------------------------------------------------------------------------
    def ledger(self) -> list[dict]:
        return _read_csv(self.s.path(LEDGER))

    def sample(self) -> dict:
        """One row of the time series: readings produced and archived, the archive's state,
        memory of the scheduler, its JVM and the server, and sizes on disk."""
        row = {"wall": time.time(), "events_produced": sum(int(r["readings"]) for r in self.ledger())}
        row.update(self.archive_sample())
        for name in ("scheduler", "server"):
            p = self.d.procs.get(name)
            row[f"rss_anon_{name}_mb"] = _rss_anon_mb(p.pid) if p and p.poll() is None else None
        p = self.d.procs.get("scheduler")
        jvm = _java_descendant(p.pid) if p and p.poll() is None else None
        row["rss_anon_scheduler_jvm_mb"] = _rss_anon_mb(jvm) if jvm else None
        self.samples.append(row)
        return row

    def analysed(self) -> int:
        """Analyses logged so far (a sample taken meanwhile, if one is due)."""
        self.sample_due()
        return len(_read_csv(self.s.path(ANALYSES)))

    def sample_due(self) -> None:
        """A sample, if ``sample_s`` has passed since the last."""
        if not self.samples or time.time() >= self.samples[-1]["wall"] + self.s.sample_s:
            self.sample()

    def watch_updates(self) -> None:
        """Until ``watching`` is set: the archive's update records, read four times a second, so
        that each update's inserted count is seen before the update log (``retain / Delta``
        records) trims it, even while a scheduler catching up commits several updates a second."""
        from ..storage.archive import open_readonly

        while not self.watching.wait(0.25):
            try:
                with open_readonly(str(self.s.path(ARCHIVE))) as arc:
                    records = arc.updates(self.s.update_log)
            except Exception as e:  # an engine change: say so once, go on
                self.warn_once("updates", f"reading the update log failed: {_one_line(str(e))}")
                continue
            with self.lock:
                self.inserted.update((r["time"], r["inserted"]) for r in records)

    def archive_sample(self) -> dict:
        """The archive's side of a sample (nothing before it exists)."""
        from ..storage.archive import open_readonly
        from .measure import dir_size_bytes

        archive = self.s.path(ARCHIVE)
        data = archive / "data"
        if not (archive / "EBB").exists():
            return {}
        try:
            on_disk = {f.name: f for f in data.glob("*.run")}  # listed before the state is read
            with open_readonly(str(archive)) as arc:
                st = arc.stats(update_log=64)
                referenced = arc.state().run_names()
        except Exception as e:  # an archive being created, or an engine change: say so once, go on
            self.warn_once("archive", f"sampling the archive failed: {_one_line(str(e))}")
            return {}
        with self.lock:
            self.inserted.update((r["time"], r["inserted"]) for r in st["update_log"])
            archived = sum(self.inserted.values())
        return {
            "events_archived": archived, "late_events": st.get("late_rows", 0),
            "last_update_T": st["last_update_time"], "updates": st["updates"], "live_records": st["records"],
            "data_mdb_bytes": _size(archive / "index" / "data.mdb"), "data_dir_bytes": dir_size_bytes(str(data)),
            "unreclaimed_bytes": sum(_allocated(f) for name, f in on_disk.items() if name not in referenced),
        }

    def warn_once(self, key: str, text: str) -> None:
        if key not in self.warned:
            self.warned.add(key)
            self.d.note(f"warning: {text}")


def _rss_anon_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            kb = next(int(x.split()[1]) for x in f if x.startswith("RssAnon:"))
    except (OSError, StopIteration):
        return None
    return round(kb / 1024, 1)


def _java_descendant(pid: int) -> int | None:
    """The JVM PySpark started under process ``pid`` (a child or grandchild), if any."""
    parent, comm = {}, {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            comm[int(d)] = stat[stat.index("(") + 1: stat.rindex(")")]
            parent[int(d)] = int(stat[stat.rindex(")") + 2:].split()[1])
    for p, name in comm.items():
        q = p
        while q in parent and q != pid and q > 1:
            q = parent[q]
        if q == pid and p != pid and name == "java":
            return p
    return None


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return None


def _allocated(path: Path) -> int:
    try:
        return path.stat().st_blocks * 512
    except FileNotFoundError:
        return 0  # reclaimed since it was listed


# -- the oracle ------------------------------------------------------------------------------------
class Oracle:
    """Every reading the producer landed (its ledger's files), as the rows the job archives. The
    producer writes readings after chronon 0 only, so tick 0 (the bulk load) inserts none."""

    def __init__(self, s: Settings, ledger: list[dict]):
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.s = s
        t = pa.concat_tables([pq.read_table(s.path(LANDING) / r["file"]) for r in ledger])
        us = t.column("event_time").cast(pa.int64()).to_numpy()
        self.ts = (us - s.origin_us) // 1_000_000
        self.exp = self.ts + t.column("life").to_numpy()
        self.sensor, self.value = t.column("sensor").to_numpy(), t.column("value").to_numpy()
        self.count = len(self.ts)

    def version_time(self, x: int) -> int:
        """The time of the update current at instant ``x`` (one update every Delta from 0)."""
        return x // self.s.delta * self.s.delta

    def rows_at(self, x: int) -> Counter:
        """The rows valid at ``x`` in the version current then."""
        m = (self.ts <= self.version_time(x)) & (x < self.exp)
        return Counter(zip(self.sensor[m].tolist(), self.value[m].tolist(), [SOURCE] * int(m.sum()),
                           self.ts[m].tolist(), self.exp[m].tolist()))

    def inserted_at(self, T: int) -> int:
        """Records the update at T inserts: readings with t in (T - Delta, T] (tick 0: (-S, 0])."""
        lo = T - (self.s.max_lifetime if T == 0 else self.s.delta)
        return int(((self.ts > lo) & (self.ts <= T)).sum())


def _rows(table) -> Counter:
    return Counter(zip(*(table.column(c).to_pylist() for c in ROW_COLUMNS)))


def _difference(got: Counter, want: Counter) -> str:
    missing, extra = sum((want - got).values()), sum((got - want).values())
    return f"{sum(want.values())} rows expected; {missing} missing, {extra} unexpected"


# -- the reads, analysed ---------------------------------------------------------------------------
@dataclass
class Reads:
    """The client log, analysed: which failures the server's restarts excuse, and for each update
    its first probe (the earliest-started probe answered from that update's version)."""

    start: np.ndarray  # one entry per read, sorted by start (wall time)
    ms: np.ndarray
    ok: np.ndarray
    probe: np.ndarray
    excused: np.ndarray  # failed during the server's restart: in flight at SIGTERM, or before it answered again
    first: np.ndarray  # the first probe of its update, outside the restarts
    errors: Counter  # failures not excused, by exception class

    @staticmethod
    def load(path: Path, restarts: list[tuple[float, float]]) -> "Reads":
        import numpy as np
        import pandas as pd

        r = pd.read_csv(path, keep_default_na=False).sort_values("start", kind="stable").reset_index(drop=True)
        start, ms = r["start"].to_numpy(float), r["ms"].to_numpy(float)
        ok, probe = (r["error"] == "").to_numpy(), (r["kind"] == "probe").to_numpy()
        excused = np.zeros(len(r), bool)
        cold = np.zeros(len(r), bool)  # during a restart and the first seconds after: not a version switch
        for stopped, serving in restarts:
            cold |= (start >= stopped) & (start <= serving + 5)
            for thread in np.unique(r["thread"]):
                mine = (r["thread"] == thread).to_numpy()
                back = start[mine & ok & (start >= serving)]
                until = back[0] if len(back) else np.inf
                excused |= mine & ~ok & (start + ms / 1000 >= stopped) & (start <= until)
        seq = pd.to_numeric(r["update_seq"], errors="coerce").to_numpy()
        first = np.zeros(len(r), bool)
        answered = probe & ok & ~np.isnan(seq)
        firsts = pd.Series(np.flatnonzero(answered)).groupby(seq[answered]).min()
        first[firsts.to_numpy()[1:]] = True  # the first version the clients saw was no switch
        errors = Counter(e.split(":")[0] for e in r["error"][~ok & ~excused])
        return Reads(start, ms, ok, probe, excused, first & ~cold, errors)

    def window(self, lo: float, hi: float):
        return (self.start > lo) & (self.start <= hi)

    def failed(self):
        return ~self.ok & ~self.excused


def _percentile(xs, q: float) -> float | None:
    import numpy as np

    return round(float(np.percentile(xs, q)), 3) if len(xs) else None


# -- checks ----------------------------------------------------------------------------------------
@dataclass
class Check:
    name: str
    ok: bool | None  # None: not judged in this run (said why in ``detail``)
    detail: str


class Verdict:
    """The checks at the end of a run, on its samples, logs and the archive it left."""

    def __init__(self, soak: Soak):
        self.soak, self.s = soak, soak.s
        self.ledger = soak.ledger()
        self.oracle = Oracle(self.s, self.ledger)
        self.reads = Reads.load(self.s.path(READS), soak.server_restarts)
        self.analyses = _read_csv(self.s.path(ANALYSES))
        self.last = soak.samples[-1]
        self.steady = [x for x in soak.samples if soak.t0 <= x["wall"] <= soak.t0 + self.s.steady_s]

    def all(self) -> list[Check]:
        return [self.producer_within_grace(), self.no_reading_lost(), self.archive_equals_oracle(),
                self.no_failed_flight_reads(), self.spark_analyses(), self.first_probe_after_update(),
                self.memory_flat(), self.metadata_flat(), *self.time_travel(), self.restarts_recovered()]

    def producer_within_grace(self) -> Check:
        """A file landed after the grace is harmless to the loss check if ebb still took every
        reading in (the scheduler, stalled with the machine, ran that tick after the file landed);
        once ebb counts readings late, their loss is expected and the loss check means nothing."""
        late = max(float(r["lateness_s"]) for r in self.ledger)
        held = sum(int(r["held"]) for r in self.ledger)
        after = sum(float(r["lateness_s"]) >= self.s.grace for r in self.ledger)
        counted_late = self.last.get("late_events")
        detail = (f"{len(self.ledger)} files, {held} held back; the latest landed {late:.1f} s after its oldest "
                  f"reading (grace {self.s.grace} s)")
        if after:
            detail += (f"; {after} landed after the grace (the producer stalled), "
                       f"{counted_late} readings counted late by ebb")
        return Check("producer within the grace", after == 0 or counted_late == 0, detail)

    def no_reading_lost(self) -> Check:
        T_last = self.last.get("last_update_T") or 0
        ticks = range(0, T_last + 1, self.s.delta)
        unseen = [T for T in ticks if T not in self.soak.inserted]
        wrong = [f"T={T}: {self.soak.inserted[T]} inserted, {self.oracle.inserted_at(T)} readings"
                 for T in ticks if T in self.soak.inserted and self.soak.inserted[T] != self.oracle.inserted_at(T)]
        late = self.last.get("late_events")
        ok = not unseen and not wrong and late == 0 and T_last >= max(int(r["max_t"]) for r in self.ledger)
        detail = (f"{self.oracle.count} readings produced, {sum(self.soak.inserted.values())} inserted by "
                  f"{len(ticks)} ticks up to T={T_last}, {late} counted late")
        if wrong:
            detail += f"; {len(wrong)} ticks wrong, e.g. {'; '.join(wrong[:3])}"
        if unseen:
            detail += f"; update records of {len(unseen)} ticks never seen (e.g. T={unseen[0]})"
        return Check("no reading lost", ok, detail)

    def archive_equals_oracle(self) -> Check:
        T_last = self.last.get("last_update_T") or 0
        got, error = self.scan(None, self.s.path(SCANS) / "final.parquet")
        want = self.oracle.rows_at(T_last)
        return Check("archive = oracle at the end", got == want,
                     error or f"ebb scan at T={T_last}: {_difference(got, want)}")

    def no_failed_flight_reads(self) -> Check:
        r = self.reads
        n, failed, excused = len(r.ok), int(r.failed().sum()), int(r.excused.sum())
        kinds = ", ".join(f"{k} x{v}" for k, v in r.errors.most_common(3))
        return Check("no failed Flight read", n > 0 and failed == 0,
                     f"{n} reads ({int(r.probe.sum())} probes, {int((~r.probe).sum())} scans), {failed} failed"
                     + (f" ({kinds})" if kinds else "") + f"; {excused} failed during the server's restart (allowed)")

    def spark_analyses(self) -> Check:
        """Every analysis succeeded, spanned at least 5 updates, and returned exactly the rows of
        one version between its start and its end."""
        problems = []
        for a in self.analyses:
            spanned = int(a["seq_after"]) - int(a["seq_before"])
            if a["error"]:
                problems.append(f"#{a['i']} failed ({spanned} updates in): {a['error']}")
                continue
            if spanned < MIN_SPANNED_UPDATES:
                problems.append(f"#{a['i']} spanned only {spanned} updates")
            if not self.one_version(a):
                problems.append(f"#{a['i']}: its {a['rows']} rows are no version's between T={a['time_before']} "
                                f"and T={a['time_after']}")
        spans = [int(a["seq_after"]) - int(a["seq_before"]) for a in self.analyses]
        detail = (f"{len(self.analyses)} analyses, {len(self.analyses) - sum(1 for a in self.analyses if a['error'])} "
                  f"succeeded, spanning {min(spans, default=0)}-{max(spans, default=0)} updates")
        return Check("Spark analyses across updates", bool(self.analyses) and not problems,
                     detail + ("; " + "; ".join(problems[:3]) if problems else ""))

    def one_version(self, a: dict) -> bool:
        import pyarrow.parquet as pq

        got = _rows(pq.read_table(self.s.path(ANALYSIS_ROWS) / f"{int(a['i']):04d}.parquet"))
        candidates = range(int(a["time_before"]), int(a["time_after"]) + 1, self.s.delta)
        return any(got == self.oracle.rows_at(T) for T in candidates)

    def first_probe_after_update(self) -> Check:
        r = self.reads
        ok = r.ok & r.probe
        first, steady = r.ms[ok & r.first], r.ms[ok & ~r.first]
        if not len(first) or not len(steady):
            return Check("first probe after an update", False, "no probe answered from a new version")
        f50, s50 = _percentile(first, 50), _percentile(steady, 50)
        return Check("first probe after an update", f50 <= FIRST_PROBE_FACTOR * s50,
                     f"p50 over {len(first)} updates {f50:.2f} ms ({f50 / s50:.1f}x), p90 {_percentile(first, 90):.2f} "
                     f"ms; steady p50 {s50:.2f} ms, p99 {_percentile(steady, 99):.2f} ms "
                     f"(at most {FIRST_PROBE_FACTOR:g}x)")

    def memory_flat(self) -> Check:
        """RssAnon of the scheduler and the server: the mean over the last third of the steady
        phase at most 10% above the mean over a third of it from D/6 on (minutes 20-30 against
        5-15 of 30), or from when the restarted scheduler has loaded readings again if that is
        later (its Spark session starts first, a warm-up, not growth). If that leaves less than
        two thirds of the phase, the two windows halve what is left."""
        D = self.s.steady_s
        lo = max(D / 6, self.warm_again())
        w = min(D / 3, (D - lo) / 2)
        early, late = (lo, lo + w), (D - w, D)
        parts, ok = [], True
        for name in ("scheduler", "server"):
            a, b = self.mean(f"rss_anon_{name}_mb", *early), self.mean(f"rss_anon_{name}_mb", *late)
            ok &= a is not None and b is not None and b <= FLAT * a
            parts.append(f"{name} {a} -> {b} MiB" + (f" ({b / a - 1:+.0%})" if a and b else ""))
        jvm = [self.mean("rss_anon_scheduler_jvm_mb", *w) for w in (early, late)]
        return Check("memory flat", ok, f"s {early[0]:.0f}-{early[1]:.0f} -> {late[0]:.0f}-{late[1]:.0f} of the steady "
                     f"phase: {'; '.join(parts)} (the scheduler's JVM, not judged: {jvm[0]} -> {jvm[1]} MiB)")

    def warm_again(self) -> float:
        """Seconds into the steady phase of the first sample at which the scheduler, killed and
        started again, had loaded readings again."""
        killed, _ = self.soak.scheduler_killed
        before = [x.get("events_archived") or 0 for x in self.soak.samples if x["wall"] <= killed]
        loaded = [x["wall"] for x in self.soak.samples
                  if x["wall"] > killed and (x.get("events_archived") or 0) > max(before, default=0)]
        return (loaded[0] if loaded else killed) - self.soak.t0

    def mean(self, col: str, lo: float, hi: float) -> float | None:
        xs = [x[col] for x in self.steady if lo <= x["wall"] - self.soak.t0 <= hi and x.get(col) is not None]
        return round(sum(xs) / len(xs), 1) if xs else None

    def metadata_flat(self) -> Check:
        """index/data.mdb once the retention window and the update log are full and the first
        retained version's runs have expired: at most 10% above its size then."""
        full = [x for x in self.soak.samples if (x.get("last_update_T") or -1) >= self.s.full_at and x.get("data_mdb_bytes")]
        if len(full) < 2 and self.s.steady_s < self.s.full_at:  # one sample compares nothing
            return Check("metadata flat", None, f"not judged: the run ends before T={self.s.full_at} or just after, "
                         "when the retention window, the update log and the first analyses' leases are full (the full "
                         "soak judges it)")
        if not full:
            return Check("metadata flat", False, f"the archive never reached T={self.s.full_at} (retention window "
                         "and update log full): run longer")
        base, top = full[0]["data_mdb_bytes"], max(x["data_mdb_bytes"] for x in full)
        return Check("metadata flat", top <= FLAT * base,
                     f"data.mdb {base / 1024:.0f} KiB at T={full[0]['last_update_T']} (window full), at most "
                     f"{top / 1024:.0f} KiB after ({top / base - 1:+.0%}) over {len(full)} samples")

    def time_travel(self) -> list[Check]:
        """``ebb scan --as-of x`` at 50 random instants of the retention window (two at a time)
        equals the oracle; one instant well before the window fails, naming the oldest instant."""
        import numpy as np

        T_last = self.last.get("last_update_T") or 0
        lo = max(T_last - self.s.retain + 1, 0)
        rng = np.random.default_rng(self.s.seed)
        instants = sorted(rng.choice(np.arange(lo, T_last + 1), min(TIME_TRAVEL_INSTANTS, T_last + 1 - lo), replace=False))
        with ThreadPoolExecutor(2) as pool:
            results = list(pool.map(lambda x: (x, self.scan(int(x), self.s.path(SCANS) / f"as-of-{x}.parquet")), instants))
        wrong = [f"T={x}: {err or _difference(got, self.oracle.rows_at(int(x)))}"
                 for x, (got, err) in results if err or got != self.oracle.rows_at(int(x))]
        inside = Check("time travel within the window", not wrong,
                       f"{len(instants)} instants in [{lo}, {T_last}]: {len(instants) - len(wrong)} equal to the oracle"
                       + (f"; e.g. {wrong[0]}" if wrong else ""))
        before = T_last - self.s.retain - 2 * self.s.delta
        r = subprocess.run(self.soak.ebb("scan", self.s.path(ARCHIVE), "--as-of", before, "--format", "jsonl"),
                           capture_output=True, text=True, timeout=120)
        named = [int(n) for n in re.findall(r"-?\d+", r.stderr)]
        oldest = T_last - self.s.retain
        says = any(oldest - self.s.delta <= n <= oldest + self.s.delta for n in named)
        outside = Check("time travel before the window", r.returncode != 0 and says,
                        f"--as-of {before}: exit {r.returncode}, {_one_line(r.stderr) or 'no message'} "
                        f"(expected a non-zero exit naming the oldest readable instant, about {oldest})")
        return [inside, outside]

    def scan(self, as_of: int | None, out: Path) -> tuple[Counter, str]:
        """(rows, "") of ``ebb scan [--as-of]`` written as Parquet, or (empty, its error)."""
        import pyarrow.parquet as pq

        args = ["scan", self.s.path(ARCHIVE), "--format", "parquet", "--out", out] + ([] if as_of is None else ["--as-of", as_of])
        r = subprocess.run(self.soak.ebb(*args), capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            return Counter(), f"ebb scan exit {r.returncode}: {_one_line(r.stderr)}"
        return _rows(pq.read_table(out)), ""

    def restarts_recovered(self) -> Check:
        soak = self.soak
        killed, committed = soak.scheduler_killed
        after = (self.last.get("updates") or 0) - committed
        served = int(sum(self.reads.ok & (self.reads.start > soak.server_restarts[-1][1]))) if soak.server_restarts else 0
        ok = killed > 0 and after > 0 and served > 0 and not soak.deaths
        return Check("restarts recovered", ok,
                     f"after SIGKILL the scheduler committed {after} more updates; after its restart the server "
                     f"answered {served} reads" + (f"; exited on their own: {', '.join(soak.deaths)}" if soak.deaths else ""))


def _read_csv(path: Path) -> list[dict]:
    try:
        with open(path, newline="") as f:
            return list(csv.DictReader(f))
    except FileNotFoundError:
        return []


# -- the time series and its figure ----------------------------------------------------------------
SERIES_COLUMNS = (
    "t_s", "events_produced", "events_archived", "late_events", "last_update_T", "updates", "live_records",
    "failed_reads", "failed_reads_restart", "probe_p50_ms", "probe_p99_ms", "first_probe_ms",
    "rss_anon_scheduler_mb", "rss_anon_scheduler_jvm_mb", "rss_anon_server_mb",
    "data_mdb_bytes", "data_dir_bytes", "unreclaimed_bytes",
)


def series(v: Verdict) -> list[dict]:
    """The samples, with the reads folded in: failures so far, and the probes of the last minute."""
    import numpy as np

    r, rows = v.reads, []
    failed_analyses = np.array([float(a["end"]) for a in v.analyses if a["error"]])
    for x in v.soak.samples:
        w = x["wall"]
        minute = r.window(w - 60, w) & r.ok & r.probe
        rows.append({**x, "t_s": round(w - v.soak.t0, 1),
                     "failed_reads": int((r.failed() & (r.start <= w)).sum() + (failed_analyses <= w).sum()),
                     "failed_reads_restart": int((r.excused & (r.start <= w)).sum()),
                     "probe_p50_ms": _percentile(r.ms[minute], 50), "probe_p99_ms": _percentile(r.ms[minute], 99),
                     "first_probe_ms": _percentile(r.ms[minute & r.first], 50)})
    with open(v.s.path(SERIES), "w", newline="") as f:
        w = csv.DictWriter(f, SERIES_COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    return rows


PANELS = (  # (title, unit divisor, [(column, label)]); latencies (ms) on a log scale
    ("readings", 1, [("events_produced", "produced"), ("events_archived", "archived")]),
    ("failed reads (cumulative)", 1, [("failed_reads", "failed"), ("failed_reads_restart", "during the server's restart")]),
    ("probe latency, last minute (ms)", 1, [("probe_p50_ms", "p50"), ("probe_p99_ms", "p99")]),
    ("first probe after an update (ms, p50 of the last minute)", 1, [("first_probe_ms", "first probe"), ("probe_p50_ms", "all probes p50")]),
    ("RssAnon (MiB)", 1, [("rss_anon_scheduler_mb", "scheduler (ebb run)"), ("rss_anon_server_mb", "ebb serve")]),
    ("RssAnon of the scheduler's JVM (MiB)", 1, [("rss_anon_scheduler_jvm_mb", "JVM")]),
    ("index/data.mdb (KiB)", 1024, [("data_mdb_bytes", "data.mdb")]),
    ("data directory (MiB)", 2**20, [("data_dir_bytes", "all files"),
                                      ("unreclaimed_bytes", "runs the current version does not reference")]),
)


def figure(rows: list[dict], soak: Soak) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(4, 2, figsize=(12, 12), sharex=True)
    minutes = [x["t_s"] / 60 for x in rows]
    marks = [((w - soak.t0) / 60, text) for w, text in soak.d.events if "SIG" in text]
    for ax, (title, unit, lines) in zip(axes.flat, PANELS):
        for col, label in lines:
            ax.plot(minutes, [None if x.get(col) is None else x[col] / unit for x in rows], label=label, lw=1)
        for m, _ in marks:
            ax.axvline(m, color="0.5", ls="--", lw=0.8)
        if "(ms" in title:
            ax.set_yscale("log")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in axes[-1]:
        ax.set_xlabel("minutes since the steady phase began")
    fig.suptitle(f"ebb bench soak: Delta {soak.s.delta} s, grace {soak.s.grace} s, S {soak.s.max_lifetime} s, "
                 f"retain {soak.s.retain} s, doubly 3x3 NoRebuild\n(dashed: SIGKILL of ebb run, SIGTERM of ebb serve)",
                 fontsize=10)
    fig.tight_layout()
    path = soak.s.path(FIGURE)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# -- ebb bench soak --------------------------------------------------------------------------------
def run(args) -> int:
    """``ebb bench soak``: 0 if every check passed, 1 otherwise."""
    s = settings(args)
    Path(s.out).mkdir(parents=True, exist_ok=True)
    with socket.socket() as sock:  # a free port, kept for the server's restart
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    now = int(time.time())
    s = Settings(**{**asdict(s), "origin_us": now * 1_000_000, "port": port})
    soak = Soak(s)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the processes are killed on the way out
    try:
        soak.setup()
        soak.steady()
        soak.finish()
    finally:
        soak.d.close()
    v = Verdict(soak)
    checks = v.all()
    rows = series(v)
    fig = figure(rows, soak)
    s.path(SUMMARY).write_text(json.dumps({"settings": asdict(s), "checks": [asdict(c) for c in checks],
                                           "events": soak.d.events}, indent=2))
    print(f"\nebb bench soak: {s.steady_s / 60:.1f} min steady, Delta {s.delta} s, grace {s.grace} s, S {s.max_lifetime} s, "
          f"retain {s.retain} s, doubly 3x3 NoRebuild; {s.out}")
    for c in checks:
        print(f"  {'SKIP' if c.ok is None else 'PASS' if c.ok else 'FAIL'}  {c.name:<32} {c.detail}")
    print(f"time series: {s.path(SERIES)}; figure: {fig}; logs: {s.path(LOGS)}")
    passed, failed = sum(c.ok is True for c in checks), sum(c.ok is False for c in checks)
    skipped = f", {len(checks) - passed - failed} skipped" if passed + failed < len(checks) else ""
    print(f"soak: {passed} passed, {failed} failed{skipped}")
    return 0 if failed == 0 else 1


ROLES = {"producer": produce, "clients": read_continuously, "analysis": analyse_every_minute}


def main(argv: list[str] | None = None) -> int:
    """``python -m ebb.tools.soak ROLE OUT``: one process of a soak run, started by its driver."""
    p = argparse.ArgumentParser(prog="python -m ebb.tools.soak", description="one process of `ebb bench soak`")
    p.add_argument("role", choices=sorted(ROLES), help="which process")
    p.add_argument("out", help="the run's directory (its settings.json says the rest)")
    a = p.parse_args(argv)
    s = Settings(**json.loads((Path(a.out) / SETTINGS).read_text()))
    return ROLES[a.role](s)


if __name__ == "__main__":
    sys.exit(main())
