"""Python client for ``ebb serve``: the ArchiveReader calls, over Arrow Flight.

    with FlightArchiveClient("grpc://127.0.0.1:8815", token=None) as c:
        c.info()                      # layout, time model, last update, sizes (a dict)
        c.probe(42, as_of=1200)       # pyarrow.Table
        c.probe_range(10, 20)
        for batch in c.scan():        # streamed record batches
            ...
        c.health()                    # {"status": "ok", "update_seq": ..., "seconds_since_commit": ...}

    FlightArchiveClient("grpc+tls://host:8815", tls_root_certs=ca_pem)                 # TLS
    FlightArchiveClient("grpc+tls://host:8815", tls_root_certs=ca_pem,
                        cert_chain=client_pem, private_key=client_key_pem)              # mutual TLS

Every answer is one committed state of the archive; ``read`` also returns which one (the
``app_metadata`` of the stream's first chunk). Server-side errors arrive as the Flight exception
the server raised (``FlightServerError`` for a bad request, ``FlightUnauthenticatedError`` for a
missing or wrong token, ``FlightUnavailableError`` if nothing listens); ``error_message`` strips
gRPC's debug context from them for display.
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterator

# gRPC logs a failed TLS handshake on stderr at INFO level, in lines of its own around the one-line
# error the caller reports; ERROR keeps its real errors (an explicit GRPC_VERBOSITY still wins)
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import pyarrow as pa  # noqa: E402  (after GRPC_VERBOSITY, which gRPC reads when it starts)
import pyarrow.flight as flight  # noqa: E402

from ..storage.errors import UsageError
from . import flight_protocol as proto

HEALTH_ACTION = "health"  # flight_server.HEALTH_ACTION; not imported from there, which loads the storage engine


FLIGHT_SCHEMES = ("grpc", "grpc+tcp", "grpc+tls", "grpc+unix")  # the transports pyarrow.flight clients know


def server_url(address: str, tls: bool = False) -> str:
    """``grpc://HOST:PORT`` for an address given as a URL or as ``HOST:PORT`` (``[::1]:PORT``);
    ``grpc+tls://HOST:PORT`` for ``HOST:PORT`` with ``tls`` (TLS settings were given)."""
    if "://" in address:
        scheme, _, rest = address.partition("://")
        if scheme not in FLIGHT_SCHEMES or not rest:
            raise UsageError(f"server address {address!r}: the scheme must be one of {', '.join(FLIGHT_SCHEMES)} "
                             "followed by HOST:PORT (or give HOST:PORT alone)")
        if tls and scheme != "grpc+tls":
            # pyarrow would silently ignore the certificates and talk plaintext
            raise UsageError(f"server address {address!r}: TLS certificates were given, so the URL must be "
                             "grpc+tls://HOST:PORT (or give HOST:PORT alone)")
        return address
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise UsageError(f"server address {address!r} is neither grpc://HOST:PORT nor HOST:PORT")
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # a bare IPv6 address
    return f"{'grpc+tls' if tls else 'grpc'}://{host}:{port}"


def error_message(e: BaseException) -> str:
    """The server's message of a Flight error, without gRPC's debug context."""
    return str(e).split(". Detail:")[0].split(". gRPC client debug context:")[0]


# Whether this process made a Flight client: the CLI then ends without interpreter teardown
# (tools/cli.py), where gRPC, after a failed TLS handshake, sometimes frees memory twice (exit -6).
_made_a_client = False


def made_a_client() -> bool:
    """Whether this process has made a ``FlightArchiveClient``."""
    return _made_a_client


class FlightArchiveClient:
    """A connection to one ``ebb serve`` process (cheap to create; use one per thread)."""

    def __init__(self, url: str, token: str | None = None, timeout: float | None = None,
                 tls_root_certs: bytes | None = None, cert_chain: bytes | None = None,
                 private_key: bytes | None = None):
        """TLS (``grpc+tls://`` URLs): ``tls_root_certs``, PEM of the CA to trust (default: the
        system's roots); ``cert_chain`` and ``private_key``, PEM of this client's certificate
        and key, for a server that requires mutual TLS."""
        if (cert_chain is None) != (private_key is None):
            raise UsageError("a client certificate needs its key, and a key its certificate")
        tls = any(x is not None for x in (tls_root_certs, cert_chain))
        self.url = server_url(url, tls=tls)
        global _made_a_client
        _made_a_client = True
        self._client = flight.FlightClient(self.url, tls_root_certs=tls_root_certs, cert_chain=cert_chain,
                                           private_key=private_key)
        headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
        self._options = flight.FlightCallOptions(timeout=timeout, headers=headers)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> "FlightArchiveClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- metadata -------------------------------------------------------------------------------
    def flight_info(self) -> flight.FlightInfo:
        """The FlightInfo of a whole scan: schema, record and byte totals, and ``info`` as JSON."""
        return self._client.get_flight_info(flight.FlightDescriptor.for_command(proto.ReadRequest("scan").encode()), self._options)

    def info(self) -> dict[str, Any]:
        """What the archive holds: layout, time model, schema, last update, records and bytes."""
        return json.loads(self.flight_info().app_metadata)

    def schema(self) -> pa.Schema:
        """The record schema (empty before the first load)."""
        # from GetFlightInfo rather than GetSchema: pyarrow's client reports every GetSchema
        # failure (a missing token too) as a bare OSError instead of the Flight error class
        return self.flight_info().schema

    def flights(self) -> list[flight.FlightInfo]:
        return list(self._client.list_flights(options=self._options))

    def health(self) -> dict[str, Any]:
        """The server's ``health`` action: status ("ok", or "degraded" and ``why``), archive,
        ``update_seq``, ``last_update_time``, ``served_update_seq``, ``seconds_since_commit``,
        ``ebb_version``, ``format_version``."""
        results = list(self._client.do_action(flight.Action(HEALTH_ACTION, b""), self._options))
        return json.loads(results[0].body.to_pybytes())

    # -- reads ----------------------------------------------------------------------------------
    def probe(self, key: Any, as_of: int | None = None) -> pa.Table:
        """Records with this key valid at ``as_of`` (default: the server's last update time)."""
        return self.read(proto.ReadRequest("probe", as_of, key=key))[0]

    def probe_many(self, keys, as_of: int | None = None) -> pa.Table:
        """Records of every key of ``keys`` valid at ``as_of``, ordered by (key, exp, ts), in one
        request (at most ``flight_protocol.MAX_PROBE_KEYS`` keys)."""
        keys = keys.tolist() if hasattr(keys, "tolist") else list(keys)
        return self.read(proto.ReadRequest("probe_many", as_of, keys=tuple(keys)))[0]

    def probe_range(self, lo: Any, hi: Any, as_of: int | None = None) -> pa.Table:
        """Records with lo <= key <= hi valid at ``as_of``; None is an open bound."""
        return self.read(proto.ReadRequest("probe_range", as_of, lo=lo, hi=hi))[0]

    def scan(self, as_of: int | None = None) -> Iterator[pa.RecordBatch]:
        """Every record valid at ``as_of``, streamed as record batches."""
        reader = self._client.do_get(flight.Ticket(proto.ReadRequest("scan", as_of).encode()), self._options)
        for chunk in reader:
            if chunk.data is not None and chunk.data.num_rows:
                yield chunk.data

    def scan_table(self, as_of: int | None = None) -> pa.Table:
        return self.read(proto.ReadRequest("scan", as_of))[0]

    def read(self, request: proto.ReadRequest) -> tuple[pa.Table, dict[str, Any]]:
        """Runs one request; returns its rows and the state that answered them
        (``update_seq``, ``last_update_time``, ``as_of``)."""
        reader = self._client.do_get(flight.Ticket(request.encode()), self._options)
        batches: list[pa.RecordBatch] = []
        state: dict[str, Any] = {}
        for chunk in reader:
            if chunk.app_metadata is not None and not state:
                state = json.loads(chunk.app_metadata.to_pybytes())
            if chunk.data is not None and chunk.data.num_rows:
                batches.append(chunk.data)
        return pa.Table.from_batches(batches, schema=reader.schema), state
