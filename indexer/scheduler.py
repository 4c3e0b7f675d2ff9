"""``ebb run``: compute each tick's results with Spark and load them, exactly once.

Tick j runs at ``T_j = tau + j*Delta`` and produces the results with ``ts`` in
``(T_{j-1}, T_j]`` (tick 0, the initial bulk load at tau, produces those in ``(tau - S, tau]``).
Ticks run in order; after downtime the missed ones run one by one (catch-up). A catch-up says
first how many ticks are due and refuses more than ``max_catchup`` (job.max_catchup, default
1,000) unless told otherwise. A tick whose input range holds no landed file has no results: it
skips Spark and only runs the archive's update (its deletions and the checkpoint), in
milliseconds.

Exactly once: the scheduler's progress (last tick, manifest of landed files with their late
thresholds) is stored in the archive as checkpoint ``scheduler`` and committed in the same LMDB
transaction as the tick's update. A crash anywhere re-runs that tick from the committed state:
nothing is lost and nothing is loaded twice. A lock file (``SCHEDULER``) keeps a second runner
off the archive; a run that ends without an archive (refused, failed before its first tick, or
with none due) removes what it created for it, so it leaves nothing behind.

Allowed lateness: by the wall clock, tick j is due only once it reads ``T_j + grace``
(``job.grace``, default one Delta), whether following or catching up, so files that land within
the grace are in their tick and a run by hand does what a follower would have done. ``--ticks``
and ``--until`` ignore the clock, and so the grace.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import hashlib
import json
import os
import shutil
import time
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterator

import pyarrow as pa

from ..query.progress import plural
from ..storage.archive import Archive, ArchiveBusy
from ..storage.errors import RejectedBatch
from ..storage.files import DATA_DIR, INDEX_DIR, LOCK, MARKER
from ..storage.config import ArchiveConfig, build_config, format_origin
from . import events
from .jobspec import TIME_UNITS_US, Job, JobError
from .landing import LandedFile, forget, new_files
from .patterns import Classification, classify
from .stopping import StopOnSignals
from .tick import TickInput, compute, frame, has_input

CHECKPOINT = "scheduler"
LOCK_FILE = "SCHEDULER"
# a tick waits this long for another writer of the archive (`ebb migrate`, or an `ebb load` by
# hand) instead of failing: a migration falls between two ticks and the run goes on
WRITER_WAIT_S = 600.0


@dataclass
class Progress:
    """What the scheduler has committed, as stored in the archive's checkpoint."""

    fingerprint: str
    last_slot: int | None = None
    late_total: int = 0
    manifests: dict[str, dict[str, LandedFile]] = field(default_factory=dict)
    forgotten: dict[str, int] = field(default_factory=dict)  # per source: files this old count as seen

    def to_bytes(self) -> bytes:
        return json.dumps({
            "fingerprint": self.fingerprint, "last_slot": self.last_slot, "late_total": self.late_total,
            "manifests": {s: {rel: lf.to_list() for rel, lf in m.items()} for s, m in self.manifests.items()},
            "forgotten": self.forgotten,
        }).encode()

    @staticmethod
    def from_bytes(raw: bytes) -> "Progress":
        d = json.loads(raw)
        return Progress(d["fingerprint"], d["last_slot"], d["late_total"],
                        {s: {rel: LandedFile.from_list(v) for rel, v in m.items()} for s, m in d["manifests"].items()},
                        d.get("forgotten", {}))

    def forget(self, read_from: int, margin_ns: int) -> None:
        """Drops the files no tick reading events from ``read_from`` on needs, once ``margin_ns``
        older than the newest of their source (``landing.forget``): the manifest, committed with
        every tick, stays the size of the last margin's files."""
        for name, known in self.manifests.items():
            watermark = forget(known, read_from, margin_ns)
            if watermark:
                self.forgotten[name] = max(self.forgotten.get(name, 0), watermark)


class LateEventsRejected(RejectedBatch):
    """Late events arrived and the job's late_policy is 'fail' (exit code 3; nothing committed)."""


class TooManyTicks(JobError):
    """More ticks are due than the catch-up bound allows (exit code 2; nothing ran)."""


def fingerprint(job: Job) -> str:
    """Identifies what the archive's contents mean: the query, the sources' semantics, time."""
    sem = {"query": asdict(job.query), "time_unit": job.time_unit, "origin_us": job.origin_us,
           "sources": {n: {k: v for k, v in asdict(s).items() if k != "path"} for n, s in job.sources.items()}}
    return hashlib.sha256(json.dumps(sem, sort_keys=True, default=str).encode()).hexdigest()[:16]


def grace_of(job: Job, cfg: ArchiveConfig) -> int:
    """The allowed lateness in chronons: tick T runs once the wall clock reads T + grace. The
    default, one Delta, covers a producer that lands a file at least once per tick, at the cost of
    archiving each tick one Delta later (docs/semantics.md, "Late data")."""
    return cfg.delta if job.grace is None else job.grace


def archive_config(job: Job, cls: Classification) -> ArchiveConfig:
    """The archive a job creates: its [archive] section, with ``auto`` resolved (checked and
    completed by storage's ``build_config``, as ``ebb init`` is). ``auto`` is the layout advisor's
    recommendation (layout, mode, partitioning or split, G and E or n, section slots) when a
    calibration exists (indexer/advisor/auto.py), else the update pattern's default."""
    from .advisor.auto import auto_layout

    a = job.archive
    s = a.max_lifetime or cls.max_lifetime
    # history and log sizes are the job's whatever the layout; None leaves storage's default
    kept = {"retain": a.retain, **({} if a.update_log is None else {"update_log": a.update_log})}
    advised = auto_layout(job) if a.layout == "auto" else None
    if advised is not None:
        return build_config(**advised.settings(), interval=a.interval, max_lifetime=s, start=a.start,
                            key_column=job.query.key, block_bytes=a.block_bytes, time_unit=job.time_unit,
                            origin=_origin(job), **kept)
    layout = cls.layout if a.layout == "auto" else a.layout
    p = -(-s // a.interval)
    doubly = layout == "doubly"
    return build_config(
        layout=layout, mode=a.mode, interval=a.interval, max_lifetime=s, start=a.start,
        partitioning=a.partitioning, split=a.split, G=(a.G or min(2, p)) if doubly else None,
        E=(a.E or min(2, p)) if doubly else None, n=None if doubly else (a.n or min(4, p)),
        key_column=job.query.key, block_bytes=a.block_bytes, time_unit=job.time_unit, origin=_origin(job),
        section_slots=a.section_slots, **kept,
    )


def _origin(job: Job) -> str | None:
    """The job's origin for the archive's configuration, where readers find it to show timestamps
    (none for chronon time, which has no instant)."""
    return None if job.time_unit == "chronon" else format_origin(job.origin_us)


@contextmanager
def runner_lock(path: str, data_dir: str | None = None) -> Iterator[None]:
    """Only one ``ebb run`` per archive: a second one fails at once. If there is no archive on the
    way out, what this run made is removed again: the lock file, the directories (``path``,
    ``data_dir``, their parents) and an archive creation that failed part way in a directory of
    its own; never anything that was there before."""
    made = _missing_dirs(path) + (_missing_dirs(data_dir) if data_dir else [])
    lock_file = os.path.join(path, LOCK_FILE)
    fd, lock_made = _lock(lock_file)
    try:
        yield
    finally:
        try:
            if not os.path.exists(os.path.join(path, MARKER)):
                _remove_made(path, made, lock_file if lock_made else None)
        finally:
            os.close(fd)


def _missing_dirs(path: str) -> list[str]:
    """``path`` and those of its parents that do not exist yet."""
    out, p = [], os.path.abspath(path)
    while not os.path.exists(p) and os.path.dirname(p) != p:
        out.append(p)
        p = os.path.dirname(p)
    return out


def _lock(lock_file: str) -> tuple[int, bool]:
    """flock(LOCK_EX) on ``lock_file``, created (with its directory) if needed: (fd, whether this
    call created the file). The kernel drops the lock when the process dies."""
    for _ in range(100):
        os.makedirs(os.path.dirname(lock_file), exist_ok=True)
        try:
            fd, made = os.open(lock_file, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644), True
        except FileExistsError:
            try:
                fd, made = os.open(lock_file, os.O_RDWR), False
            except FileNotFoundError:
                continue  # its runner removed it on the way out: make a new one
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ArchiveBusy(f"another `ebb run` is already running on {os.path.dirname(lock_file)}") from None
        # a runner removes its lock file before releasing it (_remove_made): a lock taken on a file
        # opened before that holds nothing, so only the file still at the path counts
        st = os.fstat(fd)
        try:
            here = os.stat(lock_file)
        except FileNotFoundError:
            here = None
        if here is not None and (here.st_dev, here.st_ino) == (st.st_dev, st.st_ino):
            return fd, made
        os.close(fd)
    raise ArchiveBusy(f"could not lock {lock_file}: other runners keep replacing it")


def _remove_made(path: str, made: list[str], lock_file: str | None) -> None:
    """Undoes a run that created no archive: its lock file (still held, see _lock), what a failed
    ``Archive.create`` left in a directory this run made, then the directories it made, deepest
    first and only if empty."""
    if lock_file is not None:
        os.remove(lock_file)
    if os.path.abspath(path) in made:  # nothing in it predates this run
        for name in (INDEX_DIR, DATA_DIR, LOCK, MARKER + ".tmp"):
            full = os.path.join(path, name)
            if os.path.isdir(full):
                shutil.rmtree(full, ignore_errors=True)
            elif os.path.exists(full):
                os.remove(full)
    for d in sorted(made, key=lambda d: d.count(os.sep), reverse=True):
        try:
            os.rmdir(d)
        except OSError:
            pass  # not empty: someone else's files are in it


class Scheduler:
    """Runs a job's ticks against its archive. Use ``with Scheduler(job) as s: s.run(...)``."""

    # set by a caller that reports ticks itself (``ebb run``): called with each committed tick's
    # record (its update record plus ``tick``, ``late``, ``files_read``...) and the ticks due in this pass
    on_tick: Callable[[dict, int], None] | None = None
    # where each tick's one-line report goes (default: ``say``); ``ebb run`` drops it in a catch-up,
    # whose summary line replaces a thousand of them
    tick_say: Callable[[str], None] | None = None

    def __init__(self, job: Job, master: str | None = None, conf: dict[str, str] | None = None,
                 say: Callable[[str], None] = print, verbose: bool = False, load_on: str | None = None,
                 part_bytes: int | None = None, clock: Callable[[], int] = time.time_ns,
                 sleep: Callable[[float], None] = time.sleep, stop: StopOnSignals | None = None):
        """``load_on``: "driver" (results collected here, loaded by this process) or "executors"
        (each tick's run files written by Spark tasks; see indexer/executor_load.py). Default:
        executors when ``master`` is a cluster, the driver in local mode. ``part_bytes``: the live
        bytes of a Rebuild sub-index one executor task rewrites (storage's PART_BYTES by default).
        ``clock`` (nanoseconds since the epoch) and ``sleep`` (seconds) are the wall clock and how
        to wait for it; tests pass their own to drive time. ``stop``: the stop signals of the
        process (``ebb run``); a tick's commit then defers them, and ``stop_message`` says what a
        stop left."""
        self.job = job
        self.load_on = load_on or ("executors" if master and not master.startswith("local") else "driver")
        if self.load_on not in ("driver", "executors"):
            raise JobError(f"load_on must be 'driver' or 'executors', not {self.load_on!r}")
        self.part_bytes = part_bytes
        self.cls = classify(job)
        self.master, self.conf, self.say, self.verbose = master, conf or {}, say, verbose
        self.clock, self.sleep = clock, sleep
        self.stop = stop
        self._running: int | None = None  # the tick under way, or the last one run until the next wait
        self._spark = None
        self._computed = False  # whether a tick has run a Spark query yet
        self._lock = None
        self.archive: Archive | None = None

    def __enter__(self) -> "Scheduler":
        self._lock = runner_lock(self.job.archive.path, self.job.archive.data_dir)
        self._lock.__enter__()
        try:
            self.archive = self._open_archive()
        except BaseException:
            self._lock.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self.archive is not None:
            self.archive.close()
        self._lock.__exit__(*exc)

    def _open_archive(self) -> Archive | None:
        """The job's archive, or None if the first tick is still to create it."""
        path = self.job.archive.path
        if not os.path.exists(os.path.join(path, "EBB")):
            return None
        arc = Archive(path)
        raw = arc.checkpoint(CHECKPOINT)
        if raw is not None and Progress.from_bytes(raw).fingerprint != fingerprint(self.job):
            arc.close()
            raise JobError(f"the job's query or sources changed since {path} was filled; its results would mix "
                           "two meanings. Point archive.path at a new archive")
        return arc

    @property
    def config(self) -> ArchiveConfig:
        """The archive's configuration (the one it will be created with, before the first tick)."""
        return self.archive.config if self.archive is not None else archive_config(self.job, self.cls)

    def _create_archive(self) -> None:
        cfg, path = self.config, self.job.archive.path
        self.say(f"creating archive {path}: {cfg.layout_obj.describe()}, {cfg.mode}, Delta={cfg.delta} S={cfg.max_lifetime}")
        # the runner lock file is already in the directory: create the archive beside it
        self.archive = Archive.create(path, cfg, allow_existing={LOCK_FILE}, data_dir=self.job.archive.data_dir)

    @property
    def spark(self):
        if self._spark is None:
            from .spark import session

            t0 = time.perf_counter()
            self.say(f"starting Spark ({self.master or 'local[*]'}; 10-30 s)...")
            # a stop waits for Spark to be up: cut off while pyspark launches it, the JVM never gets to
            # watch this process's end (its stdin) and py4j's thread keeps it running after we exit
            with self.stop.deferred() if self.stop is not None else nullcontext():
                self._spark = session(self.master, self.conf, verbose=self.verbose)
            if self.stop is not None:
                self.stop.install()  # pyspark's SparkContext took SIGINT over
            self.say(f"spark {self._spark.version} ready ({self._spark.sparkContext.master}) in {time.perf_counter() - t0:.1f} s")
            if self.stop is not None:
                self.stop.check()
        return self._spark

    def progress(self) -> Progress:
        raw = None if self.archive is None else self.archive.checkpoint(CHECKPOINT)
        return Progress.from_bytes(raw) if raw else Progress(fingerprint(self.job))

    # -- which ticks ---------------------------------------------------------------------------
    @property
    def grace(self) -> int:
        return grace_of(self.job, self.config)

    def now_slot(self) -> int:
        """The last tick due by the wall clock: tick j is due once it reads T_j + grace."""
        if self.job.time_unit == "chronon":
            raise JobError("time_unit is 'chronon': there is no wall clock to follow; use --ticks N or --until T")
        now = (self.clock() // 1000 - self.job.origin_us) // TIME_UNITS_US[self.job.time_unit]
        return (int(now) - self.grace - self.config.tau) // self.config.delta

    def due_ns(self, j: int) -> int:
        """The wall-clock instant (ns since the epoch) at which tick j becomes due."""
        T = self.config.time.time_of(j) + self.grace
        return (self.job.origin_us + T * TIME_UNITS_US[self.job.time_unit]) * 1000

    def when(self, T: int) -> str:
        """Event time T for people: ``T=3660 (2026-01-01 01:01:00 UTC)``."""
        if self.job.time_unit == "chronon":
            return f"T={T}"
        us = self.job.origin_us + T * TIME_UNITS_US[self.job.time_unit]
        try:
            stamp = dt.datetime.fromtimestamp(us / 1e6, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        except (OverflowError, ValueError, OSError):
            return f"T={T}"
        return f"T={T} ({stamp})"

    def run(self, ticks: int | None = None, until: int | None = None, follow: bool = False,
            max_catchup: int | None = None) -> int:
        """Runs ticks: the next ``ticks``, those up to time ``until``, or those due by the wall
        clock (and, with ``follow``, keeps going). Returns how many ran. Without ``ticks``, more
        than ``max_catchup`` (default: the job's) due ticks raise TooManyTicks before any runs."""
        tm = self.config.time
        limit = self.job.max_catchup if max_catchup is None else max_catchup
        done = 0
        first = True
        while True:
            nxt = 0 if self.progress().last_slot is None else self.progress().last_slot + 1
            if ticks is not None:
                last = nxt + ticks - 1 - done
            elif until is not None:
                last = (until - tm.tau) // tm.delta
            else:
                last = self.now_slot()
            due = last - nxt + 1
            if first:
                first = False
                if due <= 0:
                    self.say(f"no tick is due: the next, tick {nxt}, is at {self.when(tm.time_of(nxt))}"
                             + (self._after_grace() if ticks is None and until is None else ""))
                elif due > 1:  # a single tick's own line says the same
                    self.say(f"{due} ticks due: tick {nxt} at {self.when(tm.time_of(nxt))} to tick {last} at "
                             f"{self.when(tm.time_of(last))}")
                if ticks is None and due > limit:
                    self._refuse(due, limit, nxt, last)
            while nxt <= last:
                rec = self.run_tick(nxt)
                if self.on_tick is not None:
                    self.on_tick(rec, due)
                if self.stop is not None:
                    self.stop.check()  # a signal that came during the commit: stop after it
                done += 1
                nxt += 1
            if not follow:
                return done
            self._running = None
            self.sleep(max(0.2, min((self.due_ns(nxt) - self.clock()) / 1e9, 60)))

    def stop_message(self, signame: str) -> str:
        """The one line that says what a stop by ``signame`` left: the tick under way finished
        (its commit had begun) or was abandoned (nothing of it committed), and where the next
        start resumes. Read from the committed progress, so it is true wherever the signal fell."""
        prog = self.progress()
        nxt = 0 if prog.last_slot is None else prog.last_slot + 1
        resume = f"; the next start resumes at tick {nxt} {self.when(self.config.time.time_of(nxt))}"
        j = self._running
        if j is None:
            after = "before the first tick" if prog.last_slot is None else \
                f"between ticks, after tick {prog.last_slot} {self.when(self.config.time.time_of(prog.last_slot))}"
            return f"ebb: stopped by {signame} {after}{resume}"
        at = f"tick {j} {self.when(self.config.time.time_of(j))}"
        if prog.last_slot == j:
            return f"ebb: stopped by {signame} after {at}, whose commit was under way and finished{resume}"
        return f"ebb: stopped by {signame} during {at}: abandoned before its commit (nothing of it committed){resume}"

    def _after_grace(self) -> str:
        g = self.grace
        return f" and runs {g} {self.job.time_unit} later (job.grace)" if g else ""

    def _refuse(self, due: int, limit: int, nxt: int, last: int) -> None:
        tm = self.config.time
        job = os.path.relpath(self.job.path)
        start = (f"set archive.start nearer to now (the archive is not created yet; the tick due now is at T={tm.time_of(last)})"
                 if self.archive is None else
                 f"start a new archive (archive.path) with archive.start nearer to now (the tick due now is at T={tm.time_of(last)})")
        raise TooManyTicks(
            f"{due} ticks are due, more than the catch-up bound of {limit} (each tick is one archive update, and "
            f"records that expire meanwhile are deleted). Nothing was run. Choose: `ebb run {job} --ticks N` runs the "
            f"next N ticks; `--until T` runs those up to event time T (tick {nxt} is at T={tm.time_of(nxt)}); "
            f"`--max-catchup {due}` (or max_catchup = {due} in [job]) runs them all; or {start}")

    # -- one tick --------------------------------------------------------------------------------
    def run_tick(self, j: int) -> dict:
        """Computes and loads tick j (the next one); commits results and progress together."""
        if self.archive is None:
            self._create_archive()
        tm = self.archive.config.time
        prog = self.progress()
        expected = 0 if prog.last_slot is None else prog.last_slot + 1
        if j != expected:
            raise JobError(f"tick {j} is not the next one ({expected})")
        T = tm.time_of(j)
        self._running = j
        lo = T - tm.max_lifetime if j == 0 or prog.last_slot is None else tm.time_of(prog.last_slot)
        threshold = None if prog.last_slot is None else tm.time_of(prog.last_slot)
        t0 = time.perf_counter()
        late, new_count = self._discover(prog, threshold)
        if late and self.job.late_policy == "fail":
            raise LateEventsRejected(f"{late} late events (at or before the last processed tick {threshold}) in newly "
                                     "landed files; late_policy is 'fail'. Remove the files or set late_policy = \"drop\"")
        df = None
        if has_input(self.job, self.cls, prog.manifests, lo, T):
            if not self._computed:
                self.say(f"tick {j} T={T}: computing (the first tick also compiles the query; this can take a while)...")
            if self.load_on == "executors":
                df, info = frame(self.spark, self.job, self.cls, prog.manifests, lo, T)
                table = pa.table({})
            else:
                table, info = compute(self.spark, self.job, self.cls, prog.manifests, lo, T)
            self._computed = True
        else:  # no file holds events this tick reads: no results, and no need for Spark
            table, info = pa.table({}), TickInput(skipped=True)
        t1 = time.perf_counter()
        prog.last_slot = j
        prog.late_total += late
        if self.job.time_unit != "chronon":  # the margin is wall-clock time: files' modification times
            margin = tm.max_lifetime + self.cls.lookback + tm.delta + self.grace
            prog.forget(T - self.cls.lookback + 1, margin * TIME_UNITS_US[self.job.time_unit] * 1000)
        checkpoint = {CHECKPOINT: prog.to_bytes()}
        # a stop signal from here on waits for the commit: the results are computed, and a stop
        # inside the storage engine's write would only leave files for recovery to remove
        with self.stop.deferred() if self.stop is not None else nullcontext():
            if df is not None:  # the results stay on the executors, which write the runs
                from .executor_load import load

                rec = load(self.spark, self.archive, df, T, checkpoint, late, wait_s=WRITER_WAIT_S,
                           **({"part_bytes": self.part_bytes} if self.part_bytes else {}))
                info.rows = rec["input_rows"]
            else:
                rec = self.archive.load(table, T, checkpoint=checkpoint, late_rows=late, wait_s=WRITER_WAIT_S)
        t2 = time.perf_counter()
        rec.update(spark_seconds=round(t1 - t0, 3), load_seconds=round(t2 - t1, 3), files_read=info.files, new_files=new_count,
                   tick=j, late=late)
        source = ("no landed file in its input range, Spark skipped" if info.skipped else
                  f"{plural(info.rows, 'result')} from {plural(info.files, 'file')} ({new_count} new, "
                  f"{plural(late, 'late event')} dropped); " +
                  (f"computed and written by {rec['parts']} Spark tasks in {rec['tasks_seconds']:.2f} s, commit "
                   f"{rec['commit_seconds']:.2f} s" if df is not None else f"spark {t1 - t0:.2f} s"))
        (self.tick_say or self.say)(f"tick {j} T={T}: {source}, load {t2 - t1:.2f} s; +{rec['inserted']} -{rec['deleted']} "
                 f"(dropped {rec['dropped_expired']} expired); touched {len(rec['subindices_touched'])}/{self.archive.config.n} "
                 f"sub-indices, wrote {rec['bytes_written']} B, read {rec['bytes_read']} B")
        return rec

    def _discover(self, prog: Progress, threshold: int | None) -> tuple[int, int]:
        """Adds newly landed files to the manifests (event-time range, late threshold) and
        returns (late events in them, number of new files)."""
        from pyspark.sql import functions as F

        late_total, count = 0, 0
        for name, src in self.job.sources.items():
            known = prog.manifests.setdefault(name, {})
            fresh = new_files(src.path, known, prog.forgotten.get(name, 0))
            if not fresh:
                continue
            count += len(fresh)
            df = events.read(self.spark, src, self.job, sorted(fresh)).withColumn("__file", F.input_file_name())
            late_expr = F.sum((F.col(events.T) <= F.lit(threshold)).cast("long")) if threshold is not None else F.lit(0)
            rows = df.groupBy("__file").agg(F.min(events.T).alias("lo"), F.max(events.T).alias("hi"),
                                            late_expr.alias("late")).toArrow().to_pylist()
            by_path = {os.path.realpath(_local_path(r["__file"])): r for r in rows}
            for rel, (size, mtime) in fresh.items():
                r = by_path.get(os.path.realpath(os.path.join(src.path, rel)))
                known[rel] = LandedFile(size, mtime, r["lo"] if r else None, r["hi"] if r else None, threshold)
                late_total += int(r["late"]) if r else 0
        return late_total, count


def _local_path(uri: str) -> str:
    from urllib.parse import unquote, urlparse

    u = urlparse(uri)
    return unquote(u.path) if u.scheme in ("file", "") else uri
