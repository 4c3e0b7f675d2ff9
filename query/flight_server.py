"""Arrow Flight server for one ebb archive: probes, range probes and streaming scans over gRPC.

``ArchiveFlightServer(path)`` opens the archive once (read-only use: it never takes the writer
``LOCK``, so ``ebb load`` in other processes keeps running) and serves:

- ``do_get``: tickets of ``flight_protocol`` (probe / probe_range / scan, each with ``as_of``).
  Each request opens one storage snapshot, so its answer is exactly one committed state; the
  state is reported in the first chunk's ``app_metadata``. Scans stream batch by batch from the
  run files (a generator over ``ArchiveReader.scan``), never a whole table in memory.
- ``list_flights`` / ``get_flight_info`` / ``get_schema``: what the archive holds (schema, time
  model, last update time, records and bytes in total and per sub-index) as FlightInfo, with the
  details as JSON ``app_metadata``.
- errors: a bad ticket, an unknown kind, a key of the wrong type or an ``as_of`` before the last
  update is a ``FlightServerError`` whose message says what is wrong; anything unexpected is a
  ``FlightInternalError`` (logged with its traceback here). The server keeps serving either way.
- ``token``: every call must carry ``authorization: Bearer <token>`` or it is rejected with
  ``FlightUnauthenticatedError`` (checked in middleware, so it covers every RPC).

It binds to 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import functools
import hmac
import json
import logging
import os
import re
import weakref
from typing import Any, Callable, Iterator

import pyarrow as pa
import pyarrow.flight as flight

from ..storage.archive import open_readonly
from ..storage.errors import CorruptionError, EbbError, ReadError, VersionReclaimed
from ..storage.snapshot import Snapshot
from . import flight_protocol as proto
from .reader import ArchiveReader

log = logging.getLogger("ebb.flight")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8815  # the port Arrow Flight examples conventionally use
SCAN_DESCRIPTOR = proto.ReadRequest("scan").encode()


class BearerTokenMiddlewareFactory(flight.ServerMiddlewareFactory):
    """Rejects every call whose ``authorization`` header is not ``Bearer <token>``."""

    def __init__(self, token: str):
        super().__init__()
        if not token:
            raise ValueError("the token must not be empty")
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
    if isinstance(e, (proto.BadRequest, ValueError)) and not isinstance(e, EbbError) or isinstance(e, ReadError):
        # a request the archive cannot answer as asked (ReadError: e.g. an as_of before the oldest kept version)
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

    def __init__(self, path: str, host: str = DEFAULT_HOST, port: int = 0, token: str | None = None):
        self.archive = open_readonly(path)
        self.name = os.path.basename(self.archive.path.rstrip(os.sep))
        self.host = host
        self.token_required = bool(token)
        middleware = {"auth": BearerTokenMiddlewareFactory(token)} if token else None
        try:
            super().__init__(location=flight.Location.for_grpc_tcp(_uri_host(host), port), middleware=middleware)
            # follows each new version off the request path, so no probe pays for the switch
            self.reader = ArchiveReader(self.archive, follow=True)
        except Exception:
            self.archive.close()
            raise

    @property
    def url(self) -> str:
        return f"grpc://{_uri_host(self.host)}:{self.port}"

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
        req = proto.decode(ticket.ticket)
        served = self.reader.served_snapshot(req.as_of) if req.kind == "probe" and type(req.key) is int else None
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
        if req.kind == "scan" and snap.schema is not None:
            # a client that goes away before the stream starts never runs the generator's
            # finally; closing on collection releases the snapshot (Snapshot.close is idempotent)
            weakref.finalize(stream, snap.close)
        return flight.GeneratorStream(schema, stream)

    def _batches(self, snap: Snapshot, req: proto.ReadRequest, as_of: int, close: bool) -> Iterator[pa.RecordBatch]:
        """The answer to ``req`` from ``snap``. Probes are read now (and ``snap`` closed if
        ``close``: not the follower's served snapshot); a scan is a generator that reads
        blocks as the client consumes them and closes ``snap`` when done."""
        key_type = snap.schema.field(snap.config.key_column).type
        reader = self.reader
        if req.kind == "scan":
            return _closing(reader.scan_batches(as_of, snapshot=snap), snap)
        try:
            if req.kind == "probe":
                table = reader.probe(proto.check_key("key", req.key, key_type), as_of, snapshot=snap)
            else:
                lo = proto.check_key("lo", req.lo, key_type, nullable=True)
                hi = proto.check_key("hi", req.hi, key_type, nullable=True)
                table = reader.probe_range(lo, hi, as_of, snapshot=snap)
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

    def do_action(self, context, action):
        raise _read_only(f"action {action.type!r}")

    def list_actions(self, context):
        return []

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
                for name in ("key",) if req.kind == "probe" else ("lo", "hi"):
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
                                    "(do_get, get_flight_info, get_schema and list_flights)")


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


def _closing(batches: Iterator[pa.RecordBatch], snap: Snapshot) -> Iterator[pa.RecordBatch]:
    """Streams ``batches``, then closes ``snap``. A failure while streaming (after do_get
    returned, so outside ``_rpc``) reaches the client as the same clean error."""
    try:
        yield from batches
    except Exception as e:
        raise _flight_error(e, "do_get") from None
    finally:
        snap.close()
