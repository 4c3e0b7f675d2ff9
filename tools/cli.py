"""The ``ebb`` command: the entry point, which builds the parser from the command modules and
runs the command chosen.

Each command lives in a module of the layer it belongs to, which owns its arguments and its work:
``register(subparsers)`` adds the module's subcommands, each with ``set_defaults(handler=...)``,
and the handler, called with the parsed arguments, returns the exit code. ``COMMAND_MODULES``
lists those modules in the order ``ebb --help`` lists their commands. This module, in the top
layer, is the only one that knows them all; it adds the options every command takes (``--debug``,
and ``--log-format`` and ``--log-level`` on the service commands) and maps errors to exit codes.

Every failure is printed as one line, ``ebb: error: <message>``, and exits with the code of its
class in ``ebb.storage.errors`` (mapped in ``main``, the only place): 0 success; 1 error (archive
missing or damaged, I/O); 2 usage error (arguments, job file); 3 input rejected (docs/spec.md,
"Bad input": nothing was changed); 4 archive busy (another writer); 5 ``verify`` found
problems; 6 corrupt data. ``--debug`` adds the traceback.

Start-up time matters (``ebb probe`` should answer in well under a second), so the command
modules import what a command needs only when it runs: ``ebb --help`` loads neither pyarrow nor
pyspark.
"""

from __future__ import annotations

import argparse
import sys

from ..indexer import commands as indexer_commands
from ..indexer.advisor import advise_cmd
from ..query import admin_cmds, archive_cmds, read_cmds, serve_cmd, sql_cmd
from ..storage.errors import EXIT_ERROR, EbbError
from . import bench_cmd, migration_bench, scaleout

# Each module's ``register(subparsers)`` adds its subcommands; none may import a heavy dependency
# (pyarrow, pyspark) at module level, as --help imports them all.
COMMAND_MODULES = (
    archive_cmds,  # init, load
    read_cmds,  # probe, scan, stats, plan
    admin_cmds,  # verify, migrate
    indexer_commands,  # run, explain, demo
    serve_cmd,  # serve, health
    sql_cmd,  # sql
    bench_cmd,  # bench
    scaleout,  # bench-scaleout
    migration_bench,  # bench-migration
    advise_cmd,  # advise
)

# long-running commands, which log (query/logs.py) and take --log-format and --log-level after COMMAND too
SERVICE_COMMANDS: tuple[str, ...] = ("serve", "run")

EPILOG = """\
exit codes: 0 ok, 1 error, 2 usage (arguments, job file), 3 input rejected (archive unchanged),
            4 archive busy (another process is updating it), 5 verify found problems,
            6 corrupt data
--debug (before or after COMMAND) prints the traceback of an error.

typical session:
  ebb init /data/arc --layout doubly --partitioning round-robin --G 3 --E 3 \\
           --mode rebuild --max-lifetime 3600 --interval 60 --start 0
  ebb load /data/arc batch-0.parquet --at 0        # initial bulk load at tau
  ebb load /data/arc batch-1.parquet --at 60       # one periodic update per Delta
  ebb probe /data/arc 42 ; ebb scan /data/arc --format csv --out now.csv
  ebb stats /data/arc ; ebb plan /data/arc --updates 4 ; ebb verify /data/arc
"""


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``ebb``: its own options, then every command module's subcommands."""
    p = argparse.ArgumentParser(
        prog="ebb",
        description="ebb: an archive for data that expires. Windowed stream results are kept in "
        "doubly partitioned (or wave) indices on disk, updated every Delta by touching only a few "
        "sub-indices, and read by key probes and scans that never return expired records.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--debug", action="store_true", help="print the traceback of an error")
    _log_options(p, None)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for module in COMMAND_MODULES:
        module.register(sub)
    for c in sub.choices.values():  # `ebb stats X --debug` works as well as `ebb --debug stats X`
        c.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="print the traceback of an error")
    for name in SERVICE_COMMANDS:  # as --debug: before or after COMMAND
        _log_options(sub.choices[name], argparse.SUPPRESS)
    return p


def _log_options(p: argparse.ArgumentParser, default) -> None:
    """--log-format and --log-level (query/logs.py): on ``ebb`` itself, for any command, and on
    the service commands; either configures the ``ebb`` loggers wherever it is given."""
    p.add_argument("--log-format", choices=("text", "json"), default=default,
                   help="log records as text for a person (default) or one JSON object per line (docs/operations.md, Logs)")
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default=default,
                   help="the least severe log records shown (default info)")


def _fail(msg: str, code: int, json_log: bool = False) -> int:
    if json_log:  # --log-format json: the error is one more record of the log
        import logging

        from ..query.logs import event

        event(logging.getLogger("ebb"), "error", f"ebb: error: {msg}", logging.ERROR, exit_code=code)
    else:
        print(f"ebb: error: {msg}", file=sys.stderr)
    return code


def exit_code(e: BaseException) -> int:
    """The exit code of an error: its class's ``exit_code`` (ebb.storage.errors), else 1."""
    return e.exit_code if isinstance(e, EbbError) else EXIT_ERROR


def main(argv: list[str] | None = None) -> int:
    """Runs the command ``argv`` (default: this process's arguments) and returns its exit code.
    Run as the ``ebb`` command (no ``argv``) after a command that used a Flight client, it ends
    the process itself, without interpreter teardown (``_end``)."""
    code = _run(argv)
    if argv is None:
        _end(code)
    return code


def _end(code: int) -> None:
    """Ends a process that made a Flight client with ``code``, skipping interpreter teardown:
    there gRPC, after a failed TLS handshake, sometimes frees memory twice and aborts (exit -6
    after the right one-line error). Such a command holds no archive files or Spark context,
    so nothing of ebb's is left undone; logs and standard streams are flushed first."""
    if "ebb.query.flight_client" not in sys.modules:
        return
    from ..query.flight_client import made_a_client

    if made_a_client():
        import logging
        import os

        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except OSError:  # a closed pipe: nothing more can be said
                pass
        os._exit(code)


def _run(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    if args.log_format is not None or args.log_level is not None:
        from ..query.logs import configure

        configure(args.log_format, args.log_level)
    json_log = args.log_format == "json"
    try:
        return int(args.handler(args) or 0)
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        return _fail("interrupted", 130, json_log)
    except Exception as e:
        if args.debug:
            import traceback

            traceback.print_exc()
        known = isinstance(e, (EbbError, OSError, ValueError))
        msg = " ".join(str(e).split()) or type(e).__name__  # one line, whatever the message
        if not known:
            msg = f"unexpected {type(e).__name__}: {msg}" + ("" if args.debug else " (--debug shows the traceback)")
        return _fail(msg, exit_code(e), json_log)


if __name__ == "__main__":
    sys.exit(main())
