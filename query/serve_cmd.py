"""``ebb serve`` (an Arrow Flight server for one archive), and its clients ``ebb probe --server``
and ``ebb health --server`` with their token and TLS options.

``register`` adds both commands to the ``ebb`` parser (``tools/cli.py``); pyarrow.flight is
imported only when a command runs, because ``ebb --help`` imports this module.
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
With --tls-cert and --tls-key it speaks TLS (grpc+tls://HOST:PORT); adding --tls-client-ca
makes it mutual TLS: clients without a certificate that CA signed are refused.
Query it with `ebb probe --server HOST:PORT KEY` (or grpc://HOST:PORT) or ebb.query.flight_client;
`ebb health --server URL` checks it (exit 0 if healthy). SIGTERM or Ctrl-C stops it once the
running calls have finished, with exit code 0.
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
    c.add_argument("--tls-cert", metavar="FILE", help="serve over TLS (grpc+tls://) with this PEM certificate (chain)")
    c.add_argument("--tls-key", metavar="FILE", help="the PEM private key of --tls-cert")
    c.add_argument("--tls-client-ca", metavar="FILE",
                   help="mutual TLS: accept only clients with a certificate this PEM CA signed")
    c.add_argument("--max-heavy-requests", type=int, metavar="N", default=None,
                   help="scans and range probes served at once; more fail at once with 'ebb: busy' for the client "
                        "to retry (default: 4 per core; point probes are never limited)")
    add_metrics_options(c)
    c.add_argument("--access-log", action="store_true",
                   help="log every read: kind, key or range, rows, duration, peer (logger ebb.access; default off)")
    c.add_argument("--log-interval", type=float, default=60.0, metavar="SECONDS",
                   help="log one summary of the reads (counts, failures, latency by kind) every SECONDS (default 60)")
    c.set_defaults(handler=run)

    c = subparsers.add_parser("health", help="ask an `ebb serve` process whether it is healthy (exit 0 if so, else 1)",
                              description=HEALTH_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("--server", required=True, metavar="URL", help="grpc://HOST:PORT, grpc+tls://HOST:PORT or HOST:PORT")
    c.add_argument("--max-age", type=float, metavar="SECONDS",
                   help="also unhealthy if the archive's last commit is older than this (e.g. 3 x Delta for "
                        "an archive `ebb run --follow` feeds)")
    c.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS", help="give up after this long (default 5)")
    add_client_options(c)
    c.set_defaults(handler=run_health)


HEALTH_DESCRIPTION = """Ask a running `ebb serve` for its health (the Flight action 'health') and print the answer as one
JSON line: status ("ok", or "degraded" and why), the archive, its last update (update_seq,
last_update_time), the update probes are served from, seconds since the last commit, and the
ebb and format versions.

Exit 0 when the status is ok (and, with --max-age, the last commit is recent enough); 1 when it
is not, or when the server cannot be reached or refuses the call (a missing token, a certificate
it does not accept): for a container HEALTHCHECK or a systemd ExecStartPost/timer.
"""


def add_client_options(c: argparse.ArgumentParser) -> None:
    """The token and TLS options of a command that talks to `ebb serve` through --server."""
    c.add_argument("--token", default=os.environ.get(TOKEN_ENV),
                   help=f"with --server: the server's token (default: ${TOKEN_ENV})")
    c.add_argument("--tls-ca", metavar="FILE",
                   help="with --server: trust this PEM CA for the server's certificate (default: the system's roots)")
    c.add_argument("--tls-cert", metavar="FILE", help="with --server: this client's PEM certificate, for mutual TLS")
    c.add_argument("--tls-key", metavar="FILE", help="with --server: the PEM private key of --tls-cert")


def read_pem(path: str | None, option: str) -> bytes | None:
    """The contents of a certificate or key file given as ``option`` (None if not given); a
    missing, unreadable or non-PEM file is a usage error naming the option."""
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise UsageError(f"{option} {path}: {e.strerror or type(e).__name__}") from None
    if b"-----BEGIN " not in data:
        raise UsageError(f"{option} {path}: not a PEM file (no '-----BEGIN' line)")
    return data


def client(a: argparse.Namespace, timeout: float | None = None):
    """A FlightArchiveClient for ``a.server`` with the token and TLS options of ``add_client_options``."""
    from .flight_client import FlightArchiveClient

    if (a.tls_cert is None) != (a.tls_key is None):
        raise UsageError("--tls-cert and --tls-key go together (a client certificate and its key)")
    return FlightArchiveClient(a.server, token=a.token or None, timeout=timeout,
                               tls_root_certs=read_pem(a.tls_ca, "--tls-ca"),
                               cert_chain=read_pem(a.tls_cert, "--tls-cert"),
                               private_key=read_pem(a.tls_key, "--tls-key"))


def add_metrics_options(c: argparse.ArgumentParser) -> None:
    """--metrics-port and --metrics-host, of `ebb serve` and `ebb run` (query/metrics.py)."""
    c.add_argument("--metrics-port", type=_port, metavar="PORT",
                   help="serve Prometheus metrics at http://HOST:PORT/metrics and liveness at /healthz "
                        "(needs prometheus_client: pip install 'ebb[metrics]'; 0 picks a free port, printed at start)")
    c.add_argument("--metrics-host", default="127.0.0.1",
                   help="address of the metrics endpoint (default 127.0.0.1: this machine only)")


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
    import logging

    import pyarrow as pa

    from .flight_server import ArchiveFlightServer
    from .logs import announce

    log = logging.getLogger("ebb.serve")

    if args.token is not None and not args.token.strip():
        # an empty token (e.g. an unset variable in a unit file) must not mean "no authentication"
        raise UsageError("--token (or $EBB_FLIGHT_TOKEN) is empty; give a token, or leave both unset to serve without one")
    tls = _server_tls(args)
    if args.log_interval <= 0:
        raise UsageError(f"--log-interval must be positive, not {args.log_interval:g}")
    if args.max_heavy_requests is not None and args.max_heavy_requests < 1:
        raise UsageError(f"--max-heavy-requests must be at least 1, not {args.max_heavy_requests}")
    _check_port_free(args.host, args.port)
    # before the server starts: a bad --metrics-port (or no prometheus_client) fails first
    watch = _Watch(args)
    try:
        server = ArchiveFlightServer(args.path, host=args.host, port=args.port, token=args.token, tls=tls,
                                     **({} if args.max_heavy_requests is None else
                                        {"max_heavy_requests": args.max_heavy_requests}))
    except pa.ArrowException as e:
        raise UsageError(f"cannot serve on {args.host}:{args.port}: {' '.join(str(e).split())}") from None
    if not args.token and not _is_loopback(args.host):
        announce(log, f"ebb: warning: serving on {args.host} without --token: anyone who can reach it can read the archive",
                 "warning", err=True, level=logging.WARNING)
    watch.attach(server)

    # serve() returns on a signal only if Python has a handler for it; SIGTERM has none by default
    stopped_by = ["SIGINT"]

    def stop(signum: int, frame) -> None:
        stopped_by[0] = signal.Signals(signum).name
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    _shutdown_on_signal(server)
    auth = "token required" if args.token else "no token"
    if tls is not None:
        auth += ", mutual TLS" if tls.client_ca is not None else ", TLS"
    try:
        # inside the try: a signal right after this line (a supervisor that waits for it) still stops cleanly
        announce(log, f"ebb: serving {server.archive.path} at {server.url} ({auth}); Ctrl-C to stop", "start",
                 url=server.url)
        server.serve()
    except KeyboardInterrupt:
        pass
    finally:
        # a second signal while the running calls finish must not cut the shutdown short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        server.close()
        watch.stop()
    announce(log, f"ebb: server stopped by {stopped_by[0]} (the running calls finished)", "stop", err=True,
             signal=stopped_by[0])
    return 0


def _shutdown_on_signal(server) -> None:
    """Shuts ``server`` down from a thread as soon as a signal with a Python handler arrives. A
    signal that lands after the start line but before ``serve()`` has set up its own handling
    would otherwise only flag Python's handler while the main thread waits in C++, forever: the
    interpreter's C-level handler writes the signal to the wakeup fd at once, whatever the main
    thread is doing."""
    import threading

    r, w = os.pipe()
    os.set_blocking(w, False)
    signal.set_wakeup_fd(w)

    def watch() -> None:
        os.read(r, 1)
        server.shutdown()

    threading.Thread(target=watch, name="ebb-signal-watch", daemon=True).start()


class _Watch:
    """What `ebb serve` reports (query/logs.py, query/metrics.py, query/request_monitor.py): logs
    configured now, the metrics endpoint bound now if asked for; ``attach`` starts reporting the
    server's reads, ``stop`` logs the last summary and closes the endpoint."""

    def __init__(self, args: argparse.Namespace):
        from .logs import configure

        configure(args.log_format, args.log_level)
        self.args = args
        self.endpoint = self.registry = self.monitor = None
        if args.metrics_port is not None:
            from . import metrics

            metrics.require()
            self.registry = metrics.registry()
            self.endpoint = metrics.Endpoint(self.registry, args.metrics_host, args.metrics_port)

    def attach(self, server) -> None:
        import logging

        from .logs import announce, context
        from .request_monitor import RequestMonitor

        context(archive=server.name)
        reads = None
        if self.registry is not None:
            from . import metrics

            reads = metrics.ReadMetrics(self.registry, server.name)
            held = metrics.ArchiveMetrics(self.registry, server.name)
            # the archive changes under other processes' updates: read it when scraped
            self.endpoint.before_scrape.append(lambda: held.refresh(server.archive))
            announce(logging.getLogger("ebb.serve"), f"ebb: metrics at {self.endpoint.url} (liveness at /healthz)",
                     "metrics", url=self.endpoint.url)
        self.monitor = server.monitor = RequestMonitor(reads, self.args.access_log, self.args.log_interval)

    def stop(self) -> None:
        if self.monitor is not None:
            self.monitor.close()
        if self.endpoint is not None:
            self.endpoint.stop()


def _server_tls(args: argparse.Namespace):
    """The ServerTls of --tls-cert/--tls-key/--tls-client-ca (None without them), files read now
    so that a missing one is a usage error before anything starts."""
    from .flight_server import ServerTls

    if args.tls_cert is None and args.tls_key is None:
        if args.tls_client_ca is not None:
            raise UsageError("--tls-client-ca needs --tls-cert and --tls-key (mutual TLS is TLS first)")
        return None
    if args.tls_cert is None or args.tls_key is None:
        raise UsageError("--tls-cert and --tls-key go together (the server's certificate and its key)")
    return ServerTls(read_pem(args.tls_cert, "--tls-cert"), read_pem(args.tls_key, "--tls-key"),
                     read_pem(args.tls_client_ca, "--tls-client-ca"))


def run_health(a: argparse.Namespace) -> int:
    """``ebb health --server URL [--max-age S]``: prints the server's health as one JSON line;
    0 if healthy, 1 if not (also when the server cannot be reached)."""
    import pyarrow.flight as flight

    from .flight_client import error_message

    if a.max_age is not None and a.max_age <= 0:
        raise UsageError(f"--max-age must be positive, not {a.max_age}")
    try:
        with client(a, timeout=a.timeout) as c:
            h = c.health()
    except flight.FlightError as e:
        raise RemoteError(f"{a.server}: unhealthy: {error_message(e).removeprefix('ebb: ')}") from None
    age = h.get("seconds_since_commit")
    if h["status"] == "ok" and a.max_age is not None and age is not None and age > a.max_age:
        h.update(status="stale", why=f"the last commit was {age:.0f} s ago, more than --max-age {a.max_age:g}")
    print(json.dumps(h))
    return 0 if h["status"] == "ok" else 1


def run_remote_probe(a: argparse.Namespace) -> int:
    """``ebb probe --server URL KEY [--to KEY2] [--as-of T]``: the same output as a local probe."""
    import pyarrow.flight as flight

    from ..storage import keys as keycodec
    from .flight_client import error_message
    from .output import write

    try:
        with client(a) as c:
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
