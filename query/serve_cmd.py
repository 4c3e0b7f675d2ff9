"""``ebb serve`` (an Arrow Flight server for one archive) and ``ebb probe --server`` (its client).

Registered through ``cli.LAYER_COMMANDS``; pyarrow.flight is imported only when a command runs,
because ``ebb --help`` imports this module.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import signal
import sys

from ..storage.errors import EbbError, UsageError

TOKEN_ENV = "EBB_FLIGHT_TOKEN"  # lets scripts pass the token without showing it in `ps`

DESCRIPTION = """\
Serve one archive over Arrow Flight (gRPC) until interrupted (Ctrl-C or SIGTERM).

Clients send tickets, JSON objects naming a read (never a file):
  {"kind": "probe", "key": 42, "as_of": 1200}
  {"kind": "probe_range", "lo": 10, "hi": 20}
  {"kind": "scan"}
as_of defaults to the time of the last update. Every request reads one committed state, so
answers stay exact while `ebb load` updates the archive from other processes; scans stream.
list_flights / get_flight_info describe the archive (schema, last update, sizes).

PATH may be the data directory of an archive created with --data-dir (on a machine that mounts
only that directory): each request then reads the newest version the writer published there.

With --token (or $EBB_FLIGHT_TOKEN) every call must send 'authorization: Bearer TOKEN'.
Query it with `ebb probe --server HOST:PORT KEY` (or grpc://HOST:PORT) or ebb.query.flight_client.
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    c = subparsers.add_parser("serve", help="serve an archive over Arrow Flight (probes and scans)",
                              description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("path", help="archive directory, or (on a machine that mounts only that) the data directory of an "
                                "archive made with --data-dir, read through the metadata the writer publishes there")
    c.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1: this machine only; :: or 0.0.0.0 for every interface)")
    c.add_argument("--port", type=_port, default=8815, help="TCP port (default 8815; 0 picks a free port, printed at start)")
    c.add_argument("--token", default=os.environ.get(TOKEN_ENV),
                   help=f"require 'authorization: Bearer TOKEN' on every call (default: ${TOKEN_ENV}, else no token)")
    c.set_defaults(handler=run)


def _port(text: str) -> int:
    """A TCP port number, 0 to 65535 (argparse reports anything else as a usage error)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a TCP port (0 to 65535)")
    return port


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_port_free(host: str, port: int) -> None:
    """Raises UsageError if ``host:port`` cannot be bound (gRPC would only say that the server
    "did not start properly", after printing its own log lines)."""
    import errno
    import socket

    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host.strip("[]"), port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise UsageError(f"port {port} on {host} is already in use (another `ebb serve`?); "
                                 "choose another with --port, or --port 0 for a free one") from None
            raise UsageError(f"cannot bind {host}:{port}: {e.strerror}") from None


def run(args: argparse.Namespace) -> int:
    import pyarrow as pa

    from .flight_server import ArchiveFlightServer

    if args.token is not None and not args.token.strip():
        # an empty token (e.g. an unset variable in a unit file) must not mean "no authentication"
        raise UsageError("--token (or $EBB_FLIGHT_TOKEN) is empty; give a token, or leave both unset to serve without one")
    _check_port_free(args.host, args.port)
    try:
        server = ArchiveFlightServer(args.path, host=args.host, port=args.port, token=args.token)
    except pa.ArrowException as e:
        raise UsageError(f"cannot serve on {args.host}:{args.port}: {' '.join(str(e).split())}") from None
    if not args.token and not _is_loopback(args.host):
        print(f"ebb: warning: serving on {args.host} without --token: anyone who can reach it can read the archive",
              file=sys.stderr)

    # serve() returns on a signal only if Python has a handler for it; SIGTERM has none by default
    def stop(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    auth = "token required" if args.token else "no token"
    print(f"ebb: serving {server.archive.path} at {server.url} ({auth}); Ctrl-C to stop", flush=True)
    try:
        server.serve()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    print("ebb: server stopped", file=sys.stderr)
    return 0


def run_remote_probe(a: argparse.Namespace) -> int:
    """``ebb probe --server URL KEY [--to KEY2] [--as-of T]``: the same output as a local probe."""
    import pyarrow.flight as flight

    from ..storage import keys as keycodec
    from .flight_client import FlightArchiveClient, error_message
    from .output import write

    try:
        with FlightArchiveClient(a.server, token=a.token or None) as c:
            fi = c.flight_info()
            info, schema = json.loads(fi.app_metadata), fi.schema
            if a.token and info.get("token_required") is False:
                print(f"ebb: warning: {c.url} needs no token; --token (or ${TOKEN_ENV}) was not used", file=sys.stderr)
            if not info["schema"]:
                print("(the archive is empty: nothing has been loaded)", file=sys.stderr)
                return 0
            kt = schema.field(info["key_column"]).type
            lo = keycodec.parse(a.key, kt)
            t = c.probe_range(lo, keycodec.parse(a.to, kt), a.as_of) if a.to is not None else c.probe(lo, a.as_of)
    except flight.FlightError as e:
        raise RemoteError(f"{a.server}: {error_message(e).removeprefix('ebb: ')}") from None
    n = write(t.to_batches(), t.schema, a.format, a.out)
    if a.out or a.format == "table":
        print(f"{n} records", file=sys.stderr)
    return 0


class RemoteError(EbbError):
    """The server refused or failed a request, or could not be reached (exit code 1)."""
