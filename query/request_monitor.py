"""What ``ebb serve`` reports about the reads it answers: per-kind counts for the metrics
endpoint (``metrics.ReadMetrics``), one summary log record per interval (event ``requests``),
and, with ``--access-log``, one record per request (event ``access``, logger ``ebb.access``).

``answer`` wraps the server's answer to one ticket: it times the request from its arrival to the
end of its answer's stream (a scan streams after ``do_get`` returns), counts the rows sent, and
notes a failure whether it happens before or while streaming. A request costs a lock, a few
additions and (with metrics) a counter increment and a histogram observation; nothing is
formatted unless the access log is on.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Iterator

import pyarrow as pa
import pyarrow.flight as flight

from . import flight_protocol as proto
from .logs import event
from .metrics import KINDS, ReadMetrics

log = logging.getLogger("ebb.serve")
access = logging.getLogger("ebb.access")

Answer = Callable[[proto.ReadRequest], tuple[pa.Schema, Iterator]]


class RequestMonitor:
    """Counts and reports the requests of one server. ``close`` logs the last interval."""

    def __init__(self, metrics: ReadMetrics | None = None, access_log: bool = False, interval_s: float = 60.0):
        self.metrics, self.access_log, self.interval_s = metrics, access_log, interval_s
        self._lock = threading.Lock()
        self._since = time.monotonic()
        self._counts: dict[str, list] = {}  # kind -> [requests, errors, rows, seconds, max seconds]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._summaries, name="ebb-requests-log", daemon=True)
        self._thread.start()

    def answer(self, context: flight.ServerCallContext, ticket: bytes, answer: Answer) -> tuple[pa.Schema, Iterator]:
        """``answer(request)`` for the decoded ``ticket``, observed; exceptions pass through."""
        t0 = time.perf_counter()
        req = None
        try:
            req = proto.decode(ticket)
            schema, stream = answer(req)
        except BaseException as e:
            self._done(context, req, t0, 0, e)
            raise
        return schema, self._streamed(context, req, t0, stream)

    def _streamed(self, context: flight.ServerCallContext, req: proto.ReadRequest, t0: float,
                  stream: Iterator) -> Iterator:
        rows, error = 0, None
        try:
            for item in stream:  # a batch, or (batch, app_metadata) for the first
                rows += (item[0] if type(item) is tuple else item).num_rows
                yield item
        except GeneratorExit:  # the client stopped reading: not a failed read
            raise
        except BaseException as e:
            error = e
            raise
        finally:
            self._done(context, req, t0, rows, error)

    def _done(self, context: flight.ServerCallContext, req: proto.ReadRequest | None, t0: float, rows: int,
              error: BaseException | None) -> None:
        seconds = time.perf_counter() - t0
        kind = "unknown" if req is None else KINDS[req.kind]
        with self._lock:
            c = self._counts.get(kind)
            if c is None:
                c = self._counts[kind] = [0, 0, 0, 0.0, 0.0]
            c[0] += 1
            c[1] += error is not None
            c[2] += rows
            c[3] += seconds
            if seconds > c[4]:
                c[4] = seconds
        if self.metrics is not None:
            self.metrics.done(kind, seconds, rows, error is not None)
        if error is not None:  # one record per failed request; a fault's traceback is ebb.flight's
            fields = self._fields(context, req, kind, seconds, rows)
            message = " ".join(str(error).split())
            event(log, "error", f"{self._line(kind, fields)} failed: {message}", logging.WARNING,
                  error=type(error).__name__, error_message=message, **fields)
        if self.access_log:
            fields = self._fields(context, req, kind, seconds, rows)
            event(access, "access", f"{self._line(kind, fields)}: {rows} row{'' if rows == 1 else 's'} in {seconds * 1000:.2f} ms from "
                  f"{fields['peer']}" + (" (failed)" if error is not None else ""), failed=error is not None, **fields)

    @staticmethod
    def _fields(context: flight.ServerCallContext, req: proto.ReadRequest | None, kind: str, seconds: float,
                rows: int) -> dict[str, Any]:
        fields: dict[str, Any] = {"kind": kind, "rows": rows, "duration_s": round(seconds, 6), "peer": context.peer()}
        if req is not None and req.kind == "probe":
            fields["key"] = req.key
        elif req is not None and req.kind == "probe_many":
            fields["keys"] = len(req.keys)
        elif req is not None and req.kind == "probe_range":
            fields["lo"], fields["hi"] = req.lo, req.hi
        if req is not None and req.as_of is not None:
            fields["as_of"] = req.as_of
        return fields

    @staticmethod
    def _line(kind: str, fields: dict[str, Any]) -> str:
        """``probe key=42 as_of=1200``: the request, for a person."""
        return " ".join([kind, *(f"{k}={fields[k]}" for k in ("key", "lo", "hi", "as_of") if k in fields)])

    def _summaries(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.summarise()

    def summarise(self) -> None:
        """Logs one ``requests`` record for the requests since the last one (none if there were none)."""
        with self._lock:
            counts, self._counts = self._counts, {}
            since, self._since = self._since, time.monotonic()
        if not counts:
            return
        kinds = {k: {"requests": n, "errors": e, "rows": r, "mean_ms": round(s / n * 1000, 3), "max_ms": round(m * 1000, 3)}
                 for k, (n, e, r, s, m) in sorted(counts.items())}
        total, errors = sum(k["requests"] for k in kinds.values()), sum(k["errors"] for k in kinds.values())
        interval = self._since - since
        text = ", ".join(f"{k} {v['requests']} ({v['errors']} failed, {v['rows']} rows, mean {v['mean_ms']:.2f} ms, "
                         f"max {v['max_ms']:.2f} ms)" for k, v in kinds.items())
        event(log, "requests", f"{total} requests in {interval:.0f} s: {text}",
              logging.WARNING if errors else logging.INFO,
              interval_s=round(interval, 3), requests=total, errors=errors, kinds=kinds)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.summarise()
