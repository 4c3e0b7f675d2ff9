"""Logging for ebb's service processes (``ebb serve``, ``ebb run``): text for a person, or one
JSON object per line for a log pipeline (``--log-format``, ``--log-level``).

Every ebb logger is under ``ebb`` (``ebb.run``, ``ebb.serve``, ``ebb.flight``, ``ebb.access``);
``configure`` gives that tree one handler on stderr and leaves the root logger alone, so Spark's
py4j and other libraries stay as quiet as they were. A record made by ``event`` carries an event
name (tick, update, requests, access, error, ...) and its fields; ``context`` adds fields to
every record of the process (``archive``, ``job``).

- text: ``2026-01-01T00:00:00.123Z INFO ebb.serve: <message>``. The lines ``ebb run`` prints for
  a person (``announce``) stay on stdout, as they were before logging existed.
- json: ``{"time": ..., "level": "info", "logger": "ebb.run", "event": "tick", "message": ...,
  "archive": ..., "job": ..., <the event's fields>}``; an exception adds ``error`` (its class)
  and ``traceback``. ``announce`` lines are records too (event ``message`` unless named).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
import traceback
from typing import Any

FORMATS = ("text", "json")
LEVELS = ("debug", "info", "warning", "error")
ROOT = "ebb"

_context: dict[str, Any] = {}  # fields of every record of this process
_format = "text"


def configure(fmt: str | None, level: str | None) -> None:
    """Sends the ``ebb`` loggers' records at ``level`` (default info) and above to stderr in
    ``fmt`` (default text). Idempotent: a second call replaces the first's handler."""
    global _format
    _format = fmt or "text"
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if _format == "json" else TextFormatter())
    log = logging.getLogger(ROOT)
    for old in list(log.handlers):
        log.removeHandler(old)
    log.addHandler(handler)
    log.setLevel((level or "info").upper())
    log.propagate = False  # the root logger's handlers (if a library set any) would print it twice


def is_json() -> bool:
    return _format == "json"


def context(**fields: Any) -> None:
    """Adds ``fields`` (e.g. ``archive``, ``job``) to every later record of this process."""
    _context.update(fields)


def event(log: logging.Logger, name: str, message: str, level: int = logging.INFO, **fields: Any) -> None:
    """Logs ``message`` as event ``name`` with ``fields`` (in JSON, each a key of the line)."""
    if log.isEnabledFor(level):
        log.log(level, message, extra={"event": name, "fields": fields})


def announce(log: logging.Logger, message: str, name: str = "message", err: bool = False, level: int = logging.INFO,
             **fields: Any) -> None:
    """A line for the person running the command: printed to stdout (stderr if ``err``) in text,
    whatever the level, as before logging existed; an ``event`` in JSON."""
    if _format == "json":
        event(log, name, message, level, **fields)
    else:
        print(message, file=sys.stderr if err else sys.stdout, flush=True)


def _utc(created: float) -> str:
    return dt.datetime.fromtimestamp(created, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = f"{_utc(record.created)} {record.levelname} {record.name}: {record.getMessage()}"
        if record.exc_info:
            line += "\n" + "".join(traceback.format_exception(*record.exc_info)).rstrip()
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {"time": _utc(record.created), "level": record.levelname.lower(), "logger": record.name,
                               "event": getattr(record, "event", "error" if record.levelno >= logging.ERROR else "message"),
                               "message": record.getMessage(), **_context}
        out.update(getattr(record, "fields", {}))
        if record.exc_info:
            out["error"] = record.exc_info[0].__name__
            out["traceback"] = "".join(traceback.format_exception(*record.exc_info))
        return json.dumps(out, default=str)
