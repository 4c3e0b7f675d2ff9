"""The Prometheus metrics of ebb's service processes and the HTTP endpoint that serves them
(``--metrics-port``: ``/metrics``, and ``/healthz``, 200 while the process's main loop runs).

prometheus_client is optional (``pip install 'ebb[metrics]'``) and imported only here, when a
process starts the endpoint: ``ebb probe``, ``scan`` and ``stats`` never import it. Each group
below registers its metrics on the process's registry, with its labels resolved once, so that
recording one request or tick is a counter increment and a histogram observation:

- ``ArchiveMetrics`` (``ebb serve`` and ``ebb run``, label ``archive``): records and bytes per
  sub-index, bytes held by replaced runs that a readable version pins, the last update's time.
- ``RunMetrics`` (``ebb run``, labels ``archive`` and ``job``): the last committed tick and its
  lag behind the wall clock, ticks run and failed, events archived and late, and per update its
  duration, bytes written and bytes freed.
- ``ReadMetrics`` (``ebb serve``, labels ``archive`` and ``kind``: probe, range, scan): requests,
  failed requests, rows sent and latency.

docs/operations.md ("Metrics and alerts") lists every metric with its meaning and alert rules.
"""

from __future__ import annotations

import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Callable

from ..storage.errors import UsageError

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from ..storage.archive import Archive

KINDS = {"probe": "probe", "probe_many": "probe_many", "probe_range": "range", "scan": "scan"}  # ticket kind -> label
# seconds: a probe takes ~0.1 ms in process and ~1 ms over Flight; a scan seconds to minutes
READ_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
UPDATE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
BYTE_BUCKETS = tuple(4096 * 4 ** i for i in range(12))  # 4 KiB to 16 GiB


def require() -> None:
    """UsageError (exit 2) unless prometheus_client can be imported."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        raise UsageError("--metrics-port needs prometheus_client, which is not installed: "
                         "pip install 'ebb[metrics]' (or pip install prometheus_client)") from None


def registry() -> CollectorRegistry:
    from prometheus_client import CollectorRegistry, disable_created_metrics

    disable_created_metrics()  # a `_created` series per counter and histogram doubles the output for nothing
    return CollectorRegistry()


class ArchiveMetrics:
    """What the archive holds, set by ``refresh`` (after each tick in ``ebb run``; before each
    scrape in ``ebb serve``, whose archive other processes update)."""

    def __init__(self, reg: CollectorRegistry, archive: str):
        from prometheus_client import Gauge

        self.archive = archive
        self.records = Gauge("ebb_subindex_records", "Records stored in each sub-index (as `ebb stats`)",
                             ("archive", "subindex"), registry=reg)
        self.bytes = Gauge("ebb_subindex_bytes", "Bytes of the live runs of each sub-index (as `ebb stats`)",
                           ("archive", "subindex"), registry=reg)
        self.pinned = Gauge("ebb_pinned_bytes", "Disk bytes of replaced runs not reclaimed yet because a version that "
                            "may still be read (a reader's, a lease's, a published or kept one) references them",
                            ("archive",), registry=reg).labels(archive)
        # a child only once set: an archive without a time unit and origin has no such series
        self.last_update = Gauge("ebb_last_update_timestamp_seconds", "Unix time of the last committed update's T "
                                 "(only for an archive whose time unit and origin are known)", ("archive",),
                                 registry=reg)
        self._subindices = 0

    def refresh(self, archive: Archive) -> None:
        from ..storage.config import TIME_UNITS_US, origin_us

        with archive.snapshot() as snap:
            subs = [(s.records, s.bytes) for s in snap.state.subindices]
            cfg, last = snap.config, None if snap.state.last_slot is None else snap.time
        if len(subs) != self._subindices:  # a migration changed n: drop the old sub-indices' series
            self.records.clear()
            self.bytes.clear()
            self._subindices = len(subs)
        for i, (records, size) in enumerate(subs, 1):
            self.records.labels(self.archive, str(i)).set(records)
            self.bytes.labels(self.archive, str(i)).set(size)
        self.pinned.set(archive.held_bytes())
        if last is not None and cfg.origin and cfg.time_unit in TIME_UNITS_US:
            self.last_update.labels(self.archive).set((origin_us(cfg.origin) + last * TIME_UNITS_US[cfg.time_unit]) / 1e6)


class RunMetrics:
    """One job's ticks (``ebb run``)."""

    def __init__(self, reg: CollectorRegistry, archive: str, job: str):
        from prometheus_client import Counter, Gauge, Histogram

        labels, values = ("archive", "job"), (archive, job)
        self._values = values
        # children only from the first committed tick on: before it there is no time to report
        self._last_tick = Gauge("ebb_last_tick_timestamp_seconds", "Unix time of the last committed tick's T",
                                labels, registry=reg)
        self._lag = Gauge("ebb_tick_lag_seconds", "Wall-clock time minus the last committed tick's T, at the scrape "
                          "(grows until the next tick commits; about Delta + grace when on time)",
                          labels, registry=reg)
        self.ticks = Counter("ebb_ticks", "Ticks committed by this process", labels, registry=reg).labels(*values)
        self.failures = Counter("ebb_tick_failures", "Ticks that failed in this process (`ebb run` then exits)",
                                labels, registry=reg).labels(*values)
        self.archived = Counter("ebb_events_archived", "Results inserted into the archive by this process's ticks",
                                labels, registry=reg).labels(*values)
        self.late = Counter("ebb_events_late", "Late events dropped by this process's ticks (landed after their tick)",
                            labels, registry=reg).labels(*values)
        self.duration = Histogram("ebb_update_duration_seconds", "Seconds from a tick's results to its committed "
                                  "update (writing, commit, reclaiming)", labels, buckets=UPDATE_BUCKETS,
                                  registry=reg).labels(*values)
        self.written = Histogram("ebb_update_written_bytes", "Bytes of run files each update wrote", labels,
                                 buckets=BYTE_BUCKETS, registry=reg).labels(*values)
        self.freed = Histogram("ebb_update_freed_bytes", "Disk bytes each update's garbage collection gave back",
                               labels, buckets=BYTE_BUCKETS, registry=reg).labels(*values)
        self._tick_at: float | None = None

    def committed(self, tick_unix_s: float | None) -> None:
        """The last committed tick's T as a Unix time (None: the job has no wall clock)."""
        if tick_unix_s is None:
            return
        if self._tick_at is None:
            self._lag.labels(*self._values).set_function(lambda: time.time() - self._tick_at)
        self._tick_at = tick_unix_s
        self._last_tick.labels(*self._values).set(tick_unix_s)


class ReadMetrics:
    """Reads answered by ``ebb serve``, by kind."""

    def __init__(self, reg: CollectorRegistry, archive: str):
        from prometheus_client import Counter, Histogram

        labels = ("archive", "kind")
        requests = Counter("ebb_read_requests", "Read requests (do_get) answered or failed", labels, registry=reg)
        errors = Counter("ebb_read_errors", "Read requests that failed (a bad request, or a fault of the archive or "
                         "the server)", labels, registry=reg)
        rows = Counter("ebb_read_rows", "Rows sent", labels, registry=reg)
        seconds = Histogram("ebb_read_duration_seconds", "Seconds from a request to the end of its answer's stream",
                            labels, buckets=READ_BUCKETS, registry=reg)
        # a ticket that cannot be decoded has no kind: "unknown"
        self.by_kind = {k: (requests.labels(archive, k), errors.labels(archive, k), rows.labels(archive, k),
                            seconds.labels(archive, k)) for k in (*KINDS.values(), "unknown")}

    def done(self, kind: str, seconds: float, rows: int, failed: bool) -> None:
        requests, errors, sent, latency = self.by_kind[kind]
        requests.inc()
        if failed:
            errors.inc()
        if rows:
            sent.inc(rows)
        latency.observe(seconds)


class Endpoint:
    """Serves ``/metrics`` (``reg``, after calling each of ``before_scrape``) and ``/healthz`` (200
    "ok" while the main thread runs and ``stop`` has not been called; else 503) on ``host:port``
    from a daemon thread. Port 0 picks a free one (``port`` says which)."""

    def __init__(self, reg: CollectorRegistry, host: str, port: int):
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        self.live = True
        self.before_scrape: list[Callable[[], None]] = []
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    for refresh in endpoint.before_scrape:
                        refresh()
                    self._answer(200, CONTENT_TYPE_LATEST, generate_latest(reg))
                elif path == "/healthz":
                    ok = endpoint.live and threading.main_thread().is_alive()
                    self._answer(200 if ok else 503, "text/plain", b"ok\n" if ok else b"stopping\n")
                else:
                    self._answer(404, "text/plain", b"not found: /metrics or /healthz\n")

            def _answer(self, status: int, ctype: str, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args) -> None:
                pass  # a scrape every few seconds is not worth a log line

        class Server(ThreadingHTTPServer):
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
            daemon_threads = True

        try:
            self._server = Server((host.strip("[]"), port), Handler)
        except OSError as e:
            raise UsageError(f"cannot serve metrics on {host}:{port}: {e.strerror or e}"
                             + ("; choose another --metrics-port" if port else "")) from None
        self.host, self.port = host, self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="ebb-metrics", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        return f"http://{host}:{self.port}/metrics"

    def stop(self) -> None:
        """``/healthz`` answers 503 from now on; then the endpoint closes."""
        self.live = False
        self._server.shutdown()
        self._server.server_close()
