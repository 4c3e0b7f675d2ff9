"""Arrow Flight server for one ebb archive: probes, range probes and streaming scans over gRPC.

``ArchiveFlightServer(path)`` opens the archive once (read-only use: it never takes the writer
``LOCK``, so ``ebb load`` in other processes keeps running) and serves:

- ``do_get``: tickets of ``flight_protocol`` (probe / probe_range / scan, each with ``as_of``).
  Each request opens one storage snapshot, so its answer is exactly one committed state; the
  state is reported in the first chunk's ``app_metadata``. Scans and range probes stream batch
  by batch from the run files (generators over ``ArchiveReader.scan_batches`` and
  ``probe_range_batches``), never a whole table in memory.
- ``list_flights`` / ``get_flight_info`` / ``get_schema``: what the archive holds (schema, time
  model, last update time, records and bytes in total and per sub-index) as FlightInfo, with the
  details as JSON ``app_metadata``.
- errors: a bad ticket, an unknown kind, a key of the wrong type or an ``as_of`` before the last
  update is a ``FlightServerError`` whose message says what is wrong; anything unexpected is a
  ``FlightInternalError`` (logged with its traceback here). The server keeps serving either way.
- ``token``: every call must carry ``authorization: Bearer <token>`` or it is rejected with
  ``FlightUnauthenticatedError`` (checked in middleware, so it covers every RPC).
- ``tls``: gRPC over TLS (``grpc+tls://``), and mutual TLS when a client CA is given: gRPC then
  refuses, during the handshake, every client without a certificate that CA signed.
- ``do_action("health")``: one JSON result for supervisors (``health``); every other action,
  ``do_put`` and ``do_exchange`` are refused in one line: the server is read-only.

It binds to 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import functools
import hmac
import json
import logging
import os
import re
import threading
import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator

import pyarrow as pa
import pyarrow.flight as flight

from ..storage.archive import open_readonly
from ..storage.disk_format import FORMAT_VERSION
from ..storage.errors import CorruptionError, EbbError, ReadError, UsageError, VersionReclaimed
from ..storage.read_plan import KeyRange
from ..storage.snapshot import Snapshot
from ..storage.tuning import WHOLE_RANGE_BYTES
from . import flight_protocol as proto
from .reader import ArchiveReader

if TYPE_CHECKING:
    from .request_monitor import RequestMonitor

log = logging.getLogger("ebb.flight")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8815  # the port Arrow Flight examples conventionally use
# scans and range probes in progress at once, by default: each holds up to a block per sorted
# stream of its plan plus the batches in flight (docs/serving.md, "Limits"); point probes are
# never limited
DEFAULT_MAX_HEAVY_REQUESTS = 4 * (os.cpu_count() or 1)
HEALTH_ACTION = "health"
FOLLOW_LAG_S = 10.0  # the served version may trail a commit this long before health says "degraded"
SCAN_DESCRIPTOR = proto.ReadRequest("scan").encode()


@dataclass(frozen=True)
class ServerTls:
    """PEM bytes of the server's certificate (chain) and key and, for mutual TLS, of the CA that
    signs the clients' certificates."""

    cert: bytes
    key: bytes
    client_ca: bytes | None = None


class BearerTokenMiddlewareFactory(flight.ServerMiddlewareFactory):
    """Rejects every call whose ``authorization`` header is not ``Bearer <token>``."""

    def __init__(self, token: str):
        super().__init__()
        if not token:
            raise UsageError("the token must not be empty")
        self._expected = f"Bearer {token}".encode()

    def start_call(self, info: flight.CallInfo, headers: dict[str, list]) -> None:
        values = headers.get("authorization") or headers.get("Authorization") or []
        got = values[0] if values else b""
        got = got.encode() if isinstance(got, str) else bytes(got)
        # constant-time comparison: response timing must not reveal a prefix of the token
        if not hmac.compare_digest(got, self._expected):
            raise flight.FlightUnauthenticatedError("ebb: missing or wrong token (send 'authorization: Bearer <token>')")
        return None


def _rpc(method: Callable) -> Callable:
    """Maps exceptions to Flight errors (see ``_flight_error``)."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except Exception as e:
            raise _flight_error(e, method.__name__) from None

    return wrapper


def _flight_error(e: Exception, where: str) -> flight.FlightError:
    """The error a client gets for ``e``: a client's mistake is a FlightServerError with its
    message; a fault of the archive or the server a FlightInternalError that names the problem
    without a file path or a traceback (those are logged here, for the operator)."""
    if isinstance(e, flight.FlightError):
        return e
    if isinstance(e, VersionReclaimed):  # not the client's mistake: the same request will succeed
        return flight.FlightUnavailableError(f"ebb: retry: {e}")
    if isinstance(e, ReadError):
        # a request the archive cannot answer as asked: a bad ticket (flight_protocol.BadRequest),
        # a key of the wrong type, an as_of before the oldest kept version
        return flight.FlightServerError(f"ebb: bad request: {e}")
    log.exception("ebb flight: %s failed", where)
    if isinstance(e, FileNotFoundError):
        what = "a data file of the archive has vanished"
    elif isinstance(e, CorruptionError):
        what = "the archive's data failed a checksum"
    elif isinstance(e, EbbError):  # the storage's own words, without the server's paths
        what = re.sub(r"(?<![\w.])/\S+", "<file>", " ".join(str(e).split()))
    elif isinstance(e, OSError):
        what = f"the archive's files cannot be read ({e.strerror or type(e).__name__})"
    else:
        what = f"{type(e).__name__}"
    return flight.FlightInternalError(f"ebb: the server cannot answer ({where}): {what}; its operator should run "
                                      "`ebb verify` on the archive (details are in the server's log)")


def describe(snap: Snapshot, name: str) -> dict[str, Any]:
    """What the archive holds in the committed state of ``snap`` (no file paths)."""
    cfg, st = snap.config, snap.state
    subs = [{"subindex": i + 1, "records": s.records, "bytes": s.bytes, "blocks": s.blocks}
            for i, s in enumerate(st.subindices)]
    return {
        "archive": name,
        "layout": cfg.layout_obj.describe(),
        "mode": cfg.mode,
        "n": cfg.n,
        "tau": cfg.tau,
        "delta": cfg.delta,
        "max_lifetime": cfg.max_lifetime,
        "time_unit": cfg.time_unit,
        "key_column": cfg.key_column,
        "ts_column": cfg.ts_column,
        "exp_column": cfg.exp_column,
        "schema": None if snap.schema is None else [f"{f.name}: {f.type}" for f in snap.schema],
        "update_seq": st.update_seq,
        "last_update_time": None if st.last_slot is None else snap.time,
        # every stored record has ts <= last update < exp, so this is also the row count of a
        # scan as of the last update
        "records": sum(s["records"] for s in subs),
        "bytes": sum(s["bytes"] for s in subs),
        "blocks": sum(s["blocks"] for s in subs),
        "subindices": subs,
    }


class ArchiveFlightServer(flight.FlightServerBase):
    """Serves the archive at ``path`` (and only it). Runs as soon as it is constructed; call
    ``serve()`` to block, ``shutdown()`` to stop."""

    # reports every read (counts, latency, access log: query/request_monitor.py); `ebb serve`
    # sets it before serving, and without it a read pays for nothing
    monitor: RequestMonitor | None = None

    def __init__(self, path: str, host: str = DEFAULT_HOST, port: int = 0, token: str | None = None,
                 tls: ServerTls | None = None, max_heavy_requests: int = DEFAULT_MAX_HEAVY_REQUESTS):
        """``tls``: serve gRPC over TLS with this certificate and key; with its ``client_ca``,
        mutual TLS (every client must present a certificate that CA signed).
        ``max_heavy_requests``: scans and range probes in progress at once; one more fails at
        once with FlightUnavailableError "ebb: busy: ..." (point probes are never limited)."""
        if max_heavy_requests < 1:
            raise UsageError(f"max_heavy_requests must be at least 1, not {max_heavy_requests}")
        self.max_heavy_requests = max_heavy_requests
        self._heavy = threading.BoundedSemaphore(max_heavy_requests)
        self.archive = open_readonly(path)
        self.name = os.path.basename(self.archive.path.rstrip(os.sep))
        self.host = host
        self.token_required = bool(token)
        self.tls = tls
        middleware = {"auth": BearerTokenMiddlewareFactory(token)} if token else None
        if tls is None:
            where, secure = flight.Location.for_grpc_tcp(_uri_host(host), port), {}
        else:
            where = flight.Location.for_grpc_tls(_uri_host(host), port)
            secure = {"tls_certificates": [(tls.cert, tls.key)], "verify_client": tls.client_ca is not None,
                      "root_certificates": tls.client_ca}
        try:
            super().__init__(location=where, middleware=middleware, **secure)
            # follows each new version off the request path, so no probe pays for the switch
            self.reader = ArchiveReader(self.archive, follow=True)
        except Exception:
            self.archive.close()
            raise

    @property
    def url(self) -> str:
        return f"{'grpc' if self.tls is None else 'grpc+tls'}://{_uri_host(self.host)}:{self.port}"

    def close(self) -> None:
        """Stops serving (waits for running calls) and closes the archive. Idempotent."""
        if self.archive.env is not None:
            self.shutdown()
            self.reader.close()
            self.archive.close()

    def __enter__(self) -> "ArchiveFlightServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- reads ----------------------------------------------------------------------------------
    @_rpc
    def do_get(self, context: flight.ServerCallContext, ticket: flight.Ticket) -> flight.FlightDataStream:
        monitor = self.monitor
        if monitor is None:
            return flight.GeneratorStream(*self._answer(proto.decode(ticket.ticket)))
        return flight.GeneratorStream(*monitor.answer(context, ticket.ticket, self._answer))

    def _answer(self, req: proto.ReadRequest) -> tuple[pa.Schema, Iterator]:
        """``_read``, within the limit on heavy requests: a scan or range probe holds one of the
        ``max_heavy_requests`` slots until its stream ends or is dropped, and finds none free
        fails at once (a client may retry; waiting would tie up a gRPC thread per caller)."""
        if req.kind == "probe":
            return self._read(req)
        if not self._heavy.acquire(blocking=False):
            raise flight.FlightUnavailableError(f"ebb: busy: {self.max_heavy_requests} heavy requests (scans and range "
                                                "probes) in progress; retry")
        slot = _Slot(self._heavy)
        try:
            schema, stream = self._read(req)
        except BaseException:
            slot.release()
            raise
        held = _holding(stream, slot)
        weakref.finalize(held, slot.release)  # a stream dropped before it starts never runs its finally
        return schema, held

    def _read(self, req: proto.ReadRequest) -> tuple[pa.Schema, Iterator]:
        """The schema and the stream (batches, the first with the state's metadata) answering ``req``."""
        served = self.reader.served_snapshot(req.as_of) if req.kind == "probe" else None
        if served is not None and not served.probes_natively(req.key):
            served = None  # not a key of the archive's type: refused, in its terms, on a snapshot of its own
        snap = served or self.archive.snapshot()
        try:
            as_of = snap.check_as_of(req.as_of)
            if snap.schema is None:  # nothing loaded yet: an empty answer, still tagged with its state
                schema = pa.schema([])
                batches: Iterator[pa.RecordBatch] = iter(())
                snap.close()
            else:
                schema = snap.schema
                batches = self._batches(snap, req, as_of, close=served is None)
            meta = proto.stream_metadata(snap.state.update_seq, None if snap.state.last_slot is None else snap.time, as_of)
        except BaseException:
            if served is None:
                snap.close()
            raise
        stream = _tagged(batches, schema, meta)
        if req.kind not in ("probe", "probe_many") and snap.schema is not None:
            # a client that goes away before the stream starts never runs the generator's
            # finally; closing on collection releases the snapshot (Snapshot.close is idempotent)
            weakref.finalize(stream, snap.close)
        return schema, stream

    def _batches(self, snap: Snapshot, req: proto.ReadRequest, as_of: int, close: bool) -> Iterator[pa.RecordBatch]:
        """The answer to ``req`` from ``snap``. Probes are read now (and ``snap`` closed if
        ``close``: not the follower's served snapshot); a scan or a range probe is a generator
        that reads blocks as the client consumes them, in memory bounded independently of the
        answer's size, and closes ``snap`` when done."""
        key_type = snap.schema.field(snap.config.key_column).type
        reader = self.reader
        if req.kind == "scan":
            return _closing(reader.scan_batches(as_of, snapshot=snap), snap)
        if req.kind == "probe_range":
            lo = proto.check_key("lo", req.lo, key_type, nullable=True)
            hi = proto.check_key("hi", req.hi, key_type, nullable=True)
            if sum(task.bytes for task in snap.plan(KeyRange(lo, hi), as_of)) <= WHOLE_RANGE_BYTES:
                try:  # small: read whole and sorted once, 2-4x faster than the streamed merge
                    return iter(reader.probe_range(lo, hi, as_of, snapshot=snap).to_batches())
                finally:
                    snap.close()
            return _closing(reader.probe_range_batches(lo, hi, as_of, snapshot=snap), snap)
        try:
            if req.kind == "probe_many":
                table = reader.probe_many(proto.check_keys(req.keys, key_type), as_of, snapshot=snap)
            else:
                table = reader.probe(proto.check_key("key", req.key, key_type), as_of, snapshot=snap)
        finally:
            if close:
                snap.close()
        return iter(table.to_batches())

    # -- metadata -------------------------------------------------------------------------------
    @_rpc
    def list_flights(self, context: flight.ServerCallContext, criteria: bytes) -> Iterator[flight.FlightInfo]:
        yield self._info(flight.FlightDescriptor.for_command(SCAN_DESCRIPTOR), proto.decode(SCAN_DESCRIPTOR))

    @_rpc
    def get_flight_info(self, context: flight.ServerCallContext, descriptor: flight.FlightDescriptor) -> flight.FlightInfo:
        return self._info(descriptor, self._request_of(descriptor))

    @_rpc
    def get_schema(self, context: flight.ServerCallContext, descriptor: flight.FlightDescriptor) -> flight.SchemaResult:
        self._request_of(descriptor)
        schema = self.archive.schema
        return flight.SchemaResult(schema if schema is not None else pa.schema([]))

    # -- what a read-only server does not do: a one-line error, never pyarrow's default traceback.
    # (pyarrow's Python servers can send gRPC's UNIMPLEMENTED only with a traceback attached, so
    # these fail as FlightServerError.)
    def do_put(self, context, descriptor, reader, writer):
        raise _read_only("do_put")

    def do_exchange(self, context, descriptor, reader, writer):
        raise _read_only("do_exchange")

    def do_action(self, context: flight.ServerCallContext, action: flight.Action) -> Iterator[bytes]:
        if action.type != HEALTH_ACTION:
            raise _read_only(f"action {action.type!r}")
        return iter([json.dumps(self.health()).encode()])

    def list_actions(self, context: flight.ServerCallContext) -> list[tuple[str, str]]:
        return [(HEALTH_ACTION, "JSON: status (ok or degraded, and why), the last update, the version served, "
                                "seconds since the last commit")]

    # -- health ---------------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        """The ``health`` action's answer. "degraded" when the newest committed state cannot be
        read, or when the version the follower serves has lagged it for longer than
        ``FOLLOW_LAG_S`` (the follower normally switches within milliseconds of a commit).
        Whether the archive is fresh enough is the caller's judgement (``seconds_since_commit``;
        ``ebb health --max-age``): the server does not know how often its writer should commit."""
        out: dict[str, Any] = {"status": "ok", "archive": self.name, "ebb_version": _ebb_version(),
                               "format_version": FORMAT_VERSION}
        try:
            with self.archive.snapshot() as snap:
                seq, last = snap.state.update_seq, None if snap.state.last_slot is None else snap.time
            # every commit writes the LMDB data file this server reads (the published copy's, for
            # a data directory), and nothing else does: its age is the time since the last commit
            age = time.time() - os.path.getmtime(os.path.join(self.archive.env.path(), "data.mdb"))
        except Exception as e:  # the health check reports what is wrong instead of failing (logged by _flight_error)
            return {**out, "status": "degraded", "why": str(_flight_error(e, "health")).removeprefix("ebb: ")}
        # without a prepared served version (nothing loaded yet) requests read the newest one themselves
        served_seq = self.reader.followed_update_seq()
        served_seq = seq if served_seq is None else served_seq
        out.update(update_seq=seq, last_update_time=last, served_update_seq=served_seq,
                   seconds_since_commit=round(max(age, 0.0), 3))
        if served_seq < seq and age > FOLLOW_LAG_S:
            out.update(status="degraded", why=f"the follower serves update {served_seq}, {seq - served_seq} behind "
                                              f"the newest commit of {age:.0f} s ago (see the server's log)")
        return out

    def _request_of(self, descriptor: flight.FlightDescriptor) -> proto.ReadRequest:
        if descriptor.descriptor_type != flight.DescriptorType.CMD:
            raise proto.BadRequest("use a command descriptor holding a ticket, e.g. {\"kind\": \"scan\"}; "
                                   "path descriptors are not served")
        return proto.decode(descriptor.command)

    def _info(self, descriptor: flight.FlightDescriptor, req: proto.ReadRequest) -> flight.FlightInfo:
        with self.archive.snapshot() as snap:
            info = describe(snap, self.name)
            info["token_required"] = self.token_required
            schema = snap.schema if snap.schema is not None else pa.schema([])
            if snap.schema is not None and req.kind != "scan":
                key_type = snap.schema.field(snap.config.key_column).type
                if req.kind == "probe_many":
                    proto.check_keys(req.keys, key_type)
                for name in {"probe": ("key",), "probe_range": ("lo", "hi")}.get(req.kind, ()):
                    proto.check_key(name, getattr(req, name), key_type, nullable=req.kind == "probe_range")
            if req.as_of is not None:
                snap.check_as_of(req.as_of)
        whole = req.kind == "scan" and req.as_of is None
        # an empty location list means "this same server"
        endpoint = flight.FlightEndpoint(req.encode(), [])
        return flight.FlightInfo(schema, descriptor, [endpoint],
                                 total_records=info["records"] if whole else -1,
                                 total_bytes=info["bytes"] if whole else -1,
                                 app_metadata=json.dumps(info).encode())


def _read_only(what: str) -> flight.FlightServerError:
    return flight.FlightServerError(f"ebb: {what} is not supported: `ebb serve` is read-only "
                                    f"(do_get, get_flight_info, get_schema, list_flights and the action {HEALTH_ACTION!r})")


def _ebb_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ebb")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def _uri_host(host: str) -> str:
    """A host as it appears in a URI: IPv6 addresses in brackets."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _tagged(batches: Iterator[pa.RecordBatch], schema: pa.Schema, meta: bytes) -> Iterator:
    """Yields ``batches`` with ``meta`` attached to the first; an empty answer is one empty batch
    so that the client still learns which state answered."""
    first = True
    for b in batches:
        if first:
            first = False
            yield b, meta
        else:
            yield b
    if first:
        yield pa.RecordBatch.from_pylist([], schema=schema), meta


class _Slot:
    """One slot of a semaphore, released once however many times ``release`` is called (by the
    stream's end and by its finalizer, from any thread)."""

    def __init__(self, semaphore: threading.BoundedSemaphore):
        self._semaphore: threading.BoundedSemaphore | None = semaphore
        self._lock = threading.Lock()

    def release(self) -> None:
        with self._lock:
            semaphore, self._semaphore = self._semaphore, None
        if semaphore is not None:
            semaphore.release()


def _holding(stream: Iterator, slot: _Slot) -> Iterator:
    """Yields ``stream``, then releases ``slot`` (also if the client goes away mid-stream)."""
    try:
        yield from stream
    finally:
        slot.release()


def _closing(batches: Iterator[pa.RecordBatch], snap: Snapshot) -> Iterator[pa.RecordBatch]:
    """Streams ``batches``, then closes ``snap``. A failure while streaming (after do_get
    returned, so outside ``_rpc``) reaches the client as the same clean error."""
    try:
        yield from batches
    except Exception as e:
        raise _flight_error(e, "do_get") from None
    finally:
        snap.close()
