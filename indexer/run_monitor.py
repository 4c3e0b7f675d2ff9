"""What ``ebb run`` reports to operators about its ticks, beside what it prints for a person:
logs (query/logs.py) and metrics (query/metrics.py).

- ``--log-format json``: one ``tick`` and one ``update`` record per committed tick, carrying the
  job, the archive, the tick's T (and its time as a timestamp), its duration and counts; one
  ``tick_failed`` record for a tick that fails; the lines for a person become ``message``
  records instead of printing (a tick's own line is replaced by its ``tick`` record).
- ``--metrics-port``: ``RunMetrics`` and ``ArchiveMetrics``, set after each committed tick (the
  one writer of the archive is this process, so nothing changes between ticks but the lag).

In text mode nothing changes: ``ebb run``'s own lines stay as they are.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os

from ..query import logs
from .jobspec import TIME_UNITS_US, Job

log = logging.getLogger("ebb.run")


class RunMonitor:
    """Configures the logs now and binds the metrics endpoint (if asked for) before any tick."""

    def __init__(self, job: Job, args: argparse.Namespace):
        logs.configure(args.log_format, args.log_level)
        self.job = job
        self.name = os.path.splitext(os.path.basename(job.path))[0]
        self.archive_name = os.path.basename(os.path.abspath(job.archive.path).rstrip(os.sep))
        logs.context(job=self.name, archive=self.archive_name)
        self.json = logs.is_json()
        self.endpoint = self.run_metrics = self.archive_metrics = None
        if args.metrics_port is not None:
            from ..query import metrics

            metrics.require()
            reg = metrics.registry()
            self.endpoint = metrics.Endpoint(reg, args.metrics_host, args.metrics_port)
            self.run_metrics = metrics.RunMetrics(reg, self.archive_name, self.name)
            self.archive_metrics = metrics.ArchiveMetrics(reg, self.archive_name)
            logs.announce(log, f"ebb: metrics at {self.endpoint.url} (liveness at /healthz)", "metrics",
                          url=self.endpoint.url)

    def say(self, message: str) -> None:
        """A line for a person, as a ``message`` record (JSON mode)."""
        logs.event(log, "message", message)

    def drop(self, message: str) -> None:
        """A tick's line for a person, which its ``tick`` record replaces (JSON mode)."""

    def unix_s(self, T: int) -> float | None:
        """The wall-clock instant of event time T (None for a job in chronons)."""
        unit = TIME_UNITS_US.get(self.job.time_unit)
        return None if unit is None else (self.job.origin_us + T * unit) / 1e6

    def attach(self, scheduler) -> None:
        """Reports ``scheduler``'s ticks from now on (after what its ``on_tick`` already does; in
        JSON mode in place of its tick lines), and sets the metrics of the archive as this run
        finds it."""
        reported = scheduler.on_tick

        def on_tick(rec: dict, due: int) -> None:
            if reported is not None:
                reported(rec, due)
            self.tick(scheduler, rec)

        scheduler.on_tick = on_tick
        if self.json:
            scheduler.tick_say = self.drop
        if self.run_metrics is None or scheduler.archive is None:
            return
        last = scheduler.progress().last_slot
        if last is not None:
            self.run_metrics.committed(self.unix_s(scheduler.config.time.time_of(last)))
        self.archive_metrics.refresh(scheduler.archive)

    def tick(self, scheduler, rec: dict) -> None:
        """Reports the committed tick whose record (update record and tick figures) is ``rec``."""
        archive = scheduler.archive
        freed = archive.reclaimed_bytes
        T = rec["time"]
        if self.json:
            at = self.unix_s(T)
            stamp = None if at is None else dt.datetime.fromtimestamp(at, dt.timezone.utc).isoformat().replace("+00:00", "Z")
            seconds = round(rec["spark_seconds"] + rec["load_seconds"], 3)
            logs.event(log, "tick", f"tick {rec['tick']} T={T}: +{rec['inserted']} -{rec['deleted']}, "
                       f"{rec['late']} late, in {seconds:.2f} s", tick=rec["tick"], T=T, tick_time=stamp,
                       seconds=seconds, spark_seconds=rec["spark_seconds"], load_seconds=rec["load_seconds"],
                       files_read=rec["files_read"], new_files=rec["new_files"], results=rec["input_rows"],
                       inserted=rec["inserted"], deleted=rec["deleted"], dropped_expired=rec["dropped_expired"],
                       late=rec["late"])
            held = archive.held_bytes()
            logs.event(log, "update", f"update {rec['seq']} at T={T}: touched sub-indices {rec['subindices_touched']}, "
                       f"wrote {rec['bytes_written']} B, freed {freed} B", seq=rec["seq"], T=T,
                       slot=rec["slot"], kind=rec["kind"], seconds=rec["load_seconds"], inserted=rec["inserted"],
                       deleted=rec["deleted"], subindices_touched=rec["subindices_touched"],
                       blocks_read=rec["blocks_read"], bytes_read=rec["bytes_read"],
                       blocks_written=rec["blocks_written"], bytes_written=rec["bytes_written"],
                       freed_bytes=freed, held_bytes=held)
        m = self.run_metrics
        if m is not None:
            m.ticks.inc()
            m.archived.inc(rec["inserted"])
            m.late.inc(rec["late"])
            m.duration.observe(rec["load_seconds"])
            m.written.observe(rec["bytes_written"])
            m.freed.observe(freed)
            m.committed(self.unix_s(T))
            self.archive_metrics.refresh(archive)

    def failed(self, scheduler, error: Exception) -> None:
        """A tick failed (``ebb run`` then exits with the error's code)."""
        if self.run_metrics is not None:
            self.run_metrics.failures.inc()
        if not self.json:
            return  # the command's own `ebb: error:` line says it
        try:
            last = scheduler.progress().last_slot
        except Exception:  # an archive too damaged to say: the error itself is what matters
            last = None
        tick = 0 if last is None else last + 1
        logs.event(log, "tick_failed", f"tick {tick} failed: {' '.join(str(error).split())}", logging.ERROR,
                   tick=tick, error=type(error).__name__)

    def stopped(self, message: str) -> None:
        """The one line a stop by a signal leaves: stderr in text, a ``stop`` record in JSON."""
        logs.announce(log, message, "stop", err=True)

    def stop(self) -> None:
        if self.endpoint is not None:
            self.endpoint.stop()
