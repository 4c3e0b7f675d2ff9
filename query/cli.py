"""The ``ebb`` command: a thin layer over ebb.storage and ebb.query.

Every failure is printed as one line, ``ebb: error: <message>``, and exits with the code of its
class in ``ebb.storage.errors`` (mapped in ``main``, the only place): 0 success; 1 error (archive
missing or damaged, I/O); 2 usage error (arguments, job file); 3 input rejected (docs/spec.md,
"Bad input": nothing was changed); 4 archive busy (another writer); 5 ``verify`` found
problems; 6 corrupt data. ``--debug`` adds the traceback.

Start-up time matters (``ebb probe`` should answer in well under a second), so modules are
imported where a command needs them: ``ebb --help`` loads neither pyarrow nor pyspark.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys

from ..storage.errors import EXIT_ERROR, EXIT_VERIFY, EbbError, RejectedBatch, UsageError
from .output import add_output_options
from .serve_cmd import add_client_options

# long-running commands, which log (query/logs.py) and take --log-format and --log-level after COMMAND too
SERVICE_COMMANDS: tuple[str, ...] = ("serve", "run")

# Subcommands that belong to other layers. Each module defines ``register(subparsers)``, which adds
# its parsers with ``set_defaults(handler=run)``; ``run(args) -> int`` does the work. They must not
# import heavy dependencies (pyspark) at module level: --help imports them all.
LAYER_COMMANDS: list[str] = ["ebb.indexer.commands", "ebb.query.serve_cmd", "ebb.query.sql_cmd", "ebb.tools.bench_cmd",
                             "ebb.tools.scaleout", "ebb.tools.migration_bench", "ebb.tools.advise_cmd"]

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


def _parser() -> argparse.ArgumentParser:
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

    def cmd(name: str, help: str, description: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, description=description, formatter_class=argparse.RawDescriptionHelpFormatter)

    c = cmd("init", "create an empty archive",
            "Create an empty archive. The time model and columns are fixed for its life (the layout can "
            "change later, with `ebb migrate`); the "
            "record schema is set by the first load (later loads may add nullable columns, never drop or "
            "retype one).\n\n"
            "Time is an integer count of chronons. A record is valid at t iff ts <= t < exp. Updates run "
            "at tau + j*Delta; S bounds lifetimes and is rounded up to a multiple of Delta.")
    c.add_argument("path", help="directory to create (must not exist or be empty)")
    c.add_argument("--layout", required=True, choices=["doubly", "wave"],
                   help="doubly: G x E sub-indices split on insertion and expiration time; "
                   "wave: n sub-indices split on one of them")
    c.add_argument("--partitioning", default="round-robin", choices=["round-robin", "chronological", "random"],
                   help="doubly only: how slots map to rows and columns (default: round-robin)")
    c.add_argument("--split", default="insertion", choices=["insertion", "expiration"],
                   help="wave only: split by insertion (R-ins/D-ins) or expiration time (R-exp/D-exp)")
    c.add_argument("--G", type=int, help="doubly: partitions of insertion time (default 2)")
    c.add_argument("--E", type=int, help="doubly: partitions of expiration time (default 2)")
    c.add_argument("--n", type=int, help="wave: number of sub-indices (default 4)")
    c.add_argument("--mode", required=True, choices=["rebuild", "norebuild"],
                   help="rebuild: rewrite each touched sub-index as one run sorted by key (REINDEX); "
                   "norebuild: each update adds one run, sectioned by expiration slot, and deletions drop "
                   "expired sections without rewriting anything (DEL)")
    c.add_argument("--max-lifetime", type=int, required=True, metavar="S", help="largest lifetime exp - ts, in chronons")
    c.add_argument("--interval", type=int, required=True, metavar="DELTA", help="time between updates, in chronons")
    c.add_argument("--start", type=int, required=True, metavar="TAU", help="time of the initial bulk load")
    c.add_argument("--key-column", default="key", help="search key column, int64 or string (default: key)")
    c.add_argument("--ts-column", default="ts", help="start-of-validity column, int64 (default: ts)")
    c.add_argument("--exp-column", default="exp", help="expiration column, int64, exclusive (default: exp)")
    c.add_argument("--accept-overlong", action="store_true",
                   help="store records whose lifetime exceeds S instead of rejecting the batch")
    c.add_argument("--data-dir", metavar="DIR",
                   help="where the run files go (default PATH/data), e.g. a file system Spark executors mount "
                   "(docs/cluster.md); the metadata stays in PATH, which must be a local disk")
    c.add_argument("--block-bytes", type=int, metavar="BYTES",
                   help="target size of a data block, the unit of reads and checksums (default: 524288)")
    c.add_argument("--time-unit", help="what one chronon is (e.g. s, ms); recorded for readers")
    c.add_argument("--origin", metavar="ISO",
                   help="the instant of chronon 0 (e.g. 2026-01-01T00:00:00Z); with a --time-unit of us, ms, s, min "
                        "or h, probes, scans and stats show times as timestamps and --as-of takes one")
    c.add_argument("--retain", type=int, default=0, metavar="CHRONONS",
                   help="history kept for reads --as-of an earlier instant: every version current at some "
                        "instant of the last CHRONONS stays readable (default 0: only the current version)")
    c.add_argument("--update-log", type=int, default=None, metavar="N",
                   help="update records kept for `ebb stats` (default 1000); older ones count only in its totals")
    c.add_argument("--seed", type=int, default=None, help="random partitioning: the hash seed (default: drawn at random)")

    c = cmd("load", "apply one periodic update from a Parquet file",
            "Apply one update at time T = TAU + j*DELTA: delete every record with exp <= T, then insert "
            "the file's records. The first load may be at TAU (the initial bulk load). The update is atomic: "
            "a bad batch is rejected whole (exit 3) and a crash leaves the archive as before or after it.")
    c.add_argument("path", help="archive directory")
    c.add_argument("input", help="Parquet file with the key, ts and exp columns and any payload columns")
    c.add_argument("--at", type=int, required=True, metavar="T", help="update time, TAU + j*DELTA, after the last update")
    c.add_argument("--quiet", action="store_true", help="print nothing but errors")
    c.add_argument("--format", choices=["table", "json"], default="table", help="how to print the update's record")

    for name, helptext in (("probe", "records with one key (or a key range) valid at a time"),
                           ("scan", "every record valid at a time")):
        c = cmd(name, helptext,
                f"{helptext[0].upper() + helptext[1:]}. Only records with ts <= AS_OF < exp are returned; "
                "AS_OF defaults to the time of the last update and may not be earlier.")
        if name == "probe":
            # PATH is optional only so that `ebb probe --server URL KEY` needs no path
            c.add_argument("path", nargs="?", help="archive directory, or the data directory of one made with --data-dir, read through the metadata published there; omit with --server")
            c.add_argument("key", help="search key (parsed as the archive's key type)")
            c.add_argument("--to", metavar="KEY2", help="probe the inclusive range KEY..KEY2 instead of one key")
            c.add_argument("--server", metavar="URL", help="ask an `ebb serve` process (grpc://HOST:PORT, grpc+tls://HOST:PORT or HOST:PORT, e.g. 127.0.0.1:8815) instead of opening PATH")
            add_client_options(c)  # --token, --tls-ca, --tls-cert, --tls-key
        else:
            c.add_argument("path", help="archive directory, or the data directory of one made with --data-dir, read through the metadata published there")
        c.add_argument("--as-of", metavar="T", help="time of validity, in chronons or, if the archive knows its time "
                       "unit and origin, an ISO 8601 timestamp (default: last update time)")
        add_output_options(c)
        c.add_argument("--raw-time", action="store_true",
                       help="show times as chronons, not timestamps (table: in place; CSV, JSON lines: no <column>_time)")

    c = cmd("stats", "sizes, slots and the I/O of every update",
            "Show the archive's configuration, each sub-index's size (records, bytes, blocks, runs) and the "
            "insertion and expiration slots it currently holds, and the update log: per update the sub-indices "
            "read and written, blocks and bytes read and written (by ebb and by the OS), records inserted, "
            "deleted and dropped as already expired, and wall time.")
    c.add_argument("path", help="archive directory, or the data directory of one made with --data-dir, read through the metadata published there")
    c.add_argument("--format", choices=["table", "json"], default="table", help="output format (default: table)")
    c.add_argument("--updates", type=int, default=10, metavar="N", help="table format: show the last N updates (default 10)")
    c.add_argument("--next", type=int, default=4, metavar="N",
                   help="the next N updates' cells, as `ebb plan --updates N` lists them (default 4)")
    c.add_argument("--plot", metavar="FILE.png",
                   help="also draw the archive: the sub-index grid with records and bytes, the bytes that expire at each "
                        "coming update, and the cells the next updates touch (needs matplotlib: pip install 'ebb[plot]')")
    c.add_argument("--raw-time", action="store_true", help="show times as chronons only, not timestamps")

    c = cmd("plan", "which sub-indices the next updates will touch",
            "List, for each of the next N updates, the sub-indices (numbered I1..In as in docs/spec.md, 'Where each record lives') "
            "that it inserts into and deletes from.")
    c.add_argument("path", help="archive directory")
    c.add_argument("--updates", type=int, default=4, metavar="N", help="how many updates to plan (default 4)")
    c.add_argument("--format", choices=["table", "json"], default="table", help="output format (default: table)")
    c.add_argument("--raw-time", action="store_true", help="show times as chronons only, not timestamps")

    c = cmd("verify", "check every invariant and checksum",
            "Check the committed state: block and metadata checksums, block directories, sort order, that no expired "
            "record is stored, that every record is in the sub-index docs/spec.md assigns it, and the "
            "manifest's sizes. Exits 5 if anything is wrong.")
    c.add_argument("path", help="archive directory")
    c.add_argument("--format", choices=["table", "json"], default="table",
                   help="json: one document {ok, problems, notes, runs_checked} (default: table)")

    c = cmd("migrate", "change the layout while the archive is in use",
            "Switch the archive to another layout between two updates, while `ebb run` or `ebb load` keep "
            "running (a migration waits for a running update to finish). Settings not given keep their value "
            "if the kind of layout stays, else take `ebb init`'s defaults.\n\n"
            "By default nothing is copied: from the next update on, records go only to the new layout; the old "
            "one is drained (each update drops its runs once every record in them has expired), so it is gone "
            "within S, having cost no I/O, only disk space: its expired records stay until their run goes (an old "
            "Rebuild layout holds them until its last record expires). Reads cover both meanwhile and never return "
            "a record twice. "
            "--copy instead rewrites every live record into the new layout at once (reads and writes all live "
            "data, and holds it in memory). `ebb stats` shows what is still draining and the migration log.")
    c.add_argument("path", help="archive directory")
    c.add_argument("--layout", choices=["doubly", "wave"], help="the new kind of layout (default: the current one)")
    c.add_argument("--partitioning", choices=["round-robin", "chronological", "random"], help="doubly: the new partitioning")
    c.add_argument("--split", choices=["insertion", "expiration"], help="wave: the new split")
    c.add_argument("--G", type=int, help="doubly: partitions of insertion time")
    c.add_argument("--E", type=int, help="doubly: partitions of expiration time")
    c.add_argument("--n", type=int, help="wave: number of sub-indices")
    c.add_argument("--mode", choices=["rebuild", "norebuild"], help="the new maintenance mode")
    c.add_argument("--seed", type=int, help="random partitioning: the hash seed (default: drawn at random)")
    c.add_argument("--copy", action="store_true", help="copy the live records now instead of draining the old layout")
    c.add_argument("--wait", type=float, default=600.0, metavar="SECONDS",
                   help="how long to wait for a running update to finish (default 600)")
    c.add_argument("--format", choices=["table", "json"], default="table", help="how to print the migration's record")

    for module in LAYER_COMMANDS:
        importlib.import_module(module).register(sub)
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

        from .logs import event

        event(logging.getLogger("ebb"), "error", f"ebb: error: {msg}", logging.ERROR, exit_code=code)
    else:
        print(f"ebb: error: {msg}", file=sys.stderr)
    return code


def exit_code(e: BaseException) -> int:
    """The exit code of an error: its class's ``exit_code`` (ebb.storage.errors)."""
    if isinstance(e, EbbError):
        return e.exit_code
    # storage's ArchiveError/ArchiveBusy/RejectedBatch derive from EbbError from format version 2
    # on; until then they are mapped here by their storage/errors.py namesakes' codes
    from ..storage import errors

    for name in ("ArchiveBusy", "RejectedBatch", "ArchiveError"):
        if name in {c.__name__ for c in type(e).__mro__}:
            return getattr(errors, name).exit_code
    return EXIT_ERROR


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    handler = getattr(args, "handler", None) or globals()[f"_cmd_{args.command}"]
    if args.log_format is not None or args.log_level is not None:
        from .logs import configure

        configure(args.log_format, args.log_level)
    json_log = args.log_format == "json"
    try:
        return int(handler(args) or 0)
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        return _fail("interrupted", 130, json_log)
    except Exception as e:
        if args.debug:
            import traceback

            traceback.print_exc()
        known = isinstance(e, (EbbError, OSError, ValueError)) or exit_code(e) != EXIT_ERROR
        msg = " ".join(str(e).split()) or type(e).__name__  # one line, whatever the message
        if not known:
            msg = f"unexpected {type(e).__name__}: {msg}" + ("" if args.debug else " (--debug shows the traceback)")
        return _fail(msg, exit_code(e), json_log)


# -- commands ------------------------------------------------------------------------------------
def _cmd_init(a) -> int:
    from ..storage.archive import Archive
    from ..storage.config import build_config

    cfg = build_config(
        layout=a.layout, mode=a.mode, interval=a.interval, max_lifetime=a.max_lifetime, start=a.start,
        partitioning=a.partitioning, G=a.G, E=a.E, split=a.split, n=a.n, key_column=a.key_column,
        ts_column=a.ts_column, exp_column=a.exp_column, accept_overlong=a.accept_overlong,
        block_bytes=a.block_bytes, seed=a.seed, time_unit=a.time_unit, retain=a.retain, origin=a.origin,
        **({} if a.update_log is None else {"update_log": a.update_log}),
    )
    with Archive.create(a.path, cfg, data_dir=a.data_dir) as arc:
        note = f" (S rounded up to {cfg.max_lifetime})" if cfg.max_lifetime != a.max_lifetime else ""
        print(f"created {arc.path}: {cfg.layout_obj.describe()}, {cfg.mode}, n={cfg.n}, "
              f"tau={cfg.tau} Delta={cfg.delta} S={cfg.max_lifetime}{note} p={cfg.time.p}")
    return 0


def _cmd_load(a) -> int:
    from ..storage.archive import Archive

    from .progress import message_bar
    from .timefmt import Clock

    if not os.path.exists(a.input):
        raise RejectedBatch(f"input file {a.input} does not exist")
    bar, progress = message_bar("load", a.quiet)
    with Archive(a.path) as arc, bar:
        rec = arc.load_parquet(a.input, a.at, progress)
        clock = Clock.of(arc.config)
    if a.quiet:
        return 0
    if a.format == "json":
        print(json.dumps(rec, indent=2))
    else:
        print(_update_line(rec, clock))
    return 0


def _update_line(r: dict, clock=None) -> str:
    from .timefmt import time_label

    return (f"update {r['seq']} at {time_label(clock, r['time'])} (slot {r['slot']}, {r['kind']}): +{r['inserted']} -{r['deleted']} "
            f"dropped {r['dropped_expired']} expired; touched {_ids(r['subindices_touched'])}; "
            f"read {r['blocks_read']} blocks/{_size(r['bytes_read'])}, wrote {r['blocks_written']} blocks/{_size(r['bytes_written'])} "
            f"(OS: read {_size(r['os_read_bytes'])}, wrote {_size(r['os_write_bytes'])}); {r['wall_seconds'] * 1000:.1f} ms")


def _ids(xs) -> str:
    return "{" + ",".join(f"I{x}" for x in xs) + "}"


def _size(n: int) -> str:
    from .progress import human_size

    return human_size(n)


def _cmd_probe(a) -> int:
    from ..storage import keys as keycodec
    from .output import check_output, write
    from .progress import plural
    from .reader import ArchiveReader
    from .timefmt import Clock, parse_as_of

    check_output(a.format, a.out)
    if a.server is not None:
        if a.path is not None:
            raise UsageError("give either PATH or --server URL, not both")
        from .serve_cmd import run_remote_probe

        a.as_of = parse_as_of(a.as_of, None)  # the server's time model is not known here: chronons only
        return run_remote_probe(a)
    if a.path is None:
        raise UsageError("probe needs PATH KEY (or --server URL KEY)")
    with ArchiveReader(a.path, readonly=True) as r:
        cfg = r.archive.config
        as_of = parse_as_of(a.as_of, Clock.of(cfg))
        schema = r.result_schema()
        if not len(schema):
            print("(the archive is empty: nothing has been loaded)", file=sys.stderr)
            return 0
        kt = schema.field(cfg.key_column).type
        lo = keycodec.parse(a.key, kt)
        t = r.probe_range(lo, keycodec.parse(a.to, kt), as_of) if a.to is not None else r.probe(lo, as_of)
        n = write(t.to_batches(), schema, a.format, a.out, Clock.of(cfg, a.raw_time), [cfg.ts_column, cfg.exp_column])
    if a.out or a.format == "table":
        print(plural(n, "record"), file=sys.stderr)
    return 0


def _cmd_scan(a) -> int:
    from .output import check_output, write
    from .progress import Bar, plural
    from .reader import ArchiveReader
    from .timefmt import Clock, parse_as_of

    check_output(a.format, a.out)  # before reading anything: a usage error (exit 2)
    with ArchiveReader(a.path, readonly=True) as r, Bar("scan", unit="rec", enabled=bool(a.out)) as bar:
        cfg = r.archive.config
        as_of = parse_as_of(a.as_of, Clock.of(cfg))
        schema = r.result_schema()
        if not len(schema):
            print("(the archive is empty: nothing has been loaded)", file=sys.stderr)
            return 0
        batches = r.scan_batches(as_of)  # ebb's errors keep their exit codes
        n = write(_counted(batches, bar) if bar.shown else batches, schema, a.format, a.out,
                  Clock.of(cfg, a.raw_time), [cfg.ts_column, cfg.exp_column])
    if a.out or a.format == "table":
        print(plural(n, "record"), file=sys.stderr)
    return 0


def _counted(batches, bar):
    """``batches``, moving ``bar`` by each one's rows as it is written."""
    for b in batches:
        yield b
        bar.update(b.num_rows)


def _cmd_stats(a) -> int:
    from ..storage.archive import open_readonly
    from .progress import plural
    from .timefmt import Clock, time_label

    with open_readonly(a.path) as arc:
        s = arc.stats(next_updates=a.next)  # grid, expiry timeline and plan from the same version
    clock = Clock.of(s["config"], a.raw_time)
    if a.plot:
        from .plot import draw

        draw(s, a.plot, None if clock is None else clock.stamp)
        print(f"wrote {a.plot}", file=sys.stderr)
    if a.format == "json":
        print(json.dumps(s, indent=2))
        return 0
    c = s["config"]
    print(f"archive   {s['path']}")
    print(f"layout    {s['layout']}, {c['mode']}; {s['n']} sub-indices")
    print(f"time      tau={c['tau']} Delta={c['delta']} S={c['max_lifetime']} p={s['p']}"
          + (f" ({c['time_unit']})" if c.get("time_unit") else "")
          + (f"; chronon 0 is {c['origin']}" if c.get("origin") else ""))
    if s["native_point_probe"] != "on":
        print(f"probes    native point probe {s['native_point_probe']}: probes take the planned read (same answers, slower)")
    last = "no update yet" if s["last_update_time"] is None else f"last at {time_label(clock, s['last_update_time'])}"
    print(f"state     {plural(s['updates'], 'update')}, {last}; {plural(s['records'], 'record')}, {_size(s['bytes'])}; "
          f"{plural(s.get('late_rows', 0), 'late event')} dropped (by `ebb run`)")
    if s["schema"]:
        print(f"schema    {', '.join(s['schema'])}")
    if len(s["schema_history"]) > 1:  # loads added columns: each version, what it added and when
        for v in s["schema_history"]:
            when = "first load" if v["update"] is None else f"update {v['update']} at T={v['time']}"
            print(f"  v{v['version']:<7}{'+' if v['version'] else ''}{', '.join(v['added'])} ({when})")
    print()
    print(f"{'sub':>5} {'records':>10} {'bytes':>12} {'blocks':>8}  {'insertion slots':<22} expiration slots")
    for x in s["subindices"]:
        fmt = lambda runs: ",".join(f"{a_}..{b_}" if a_ != b_ else str(a_) for a_, b_ in runs) or "-"
        print(f"{'I' + str(x['subindex']):>5} {x['records']:>10} {x['bytes']:>12} {x['blocks']:>8}  "
              f"{fmt(x['insertion_slots']):<22} {fmt(x['expiration_slots'])}")
    for k, d in enumerate(s["draining"], 1):
        print(f"draining layout {k} ({d['layout']}, replaced after slot {d['switched_after_slot']}): "
              f"{plural(d['runs'], 'run')}, {plural(d['records'], 'record')} (expired ones included), {_size(d['bytes'])}; "
              f"gone by {time_label(clock, d['gone_by'])}")
    print()
    _print_plan(s["next_updates"], clock, "next updates (each touches the sub-indices it inserts into or deletes from):")
    timeline = s["expiry_timeline"]
    if timeline:
        soon = {u["slot"] for u in s["next_updates"]}
        freed = sum(e["bytes"] + e["draining_bytes"] for e in timeline if e["slot"] in soon)
        print(f"expiry: {_size(freed)} expire over these {plural(len(soon), 'update')}, the rest by "
              f"{time_label(clock, timeline[-1]['time'])}{' (estimated)' if s['estimated'] else ''}; "
              "per update: --format json or --plot FILE.png")
    log = s["update_log"][-a.updates:] if a.updates else []
    if log:
        print(f"\nlast {plural(len(log), 'update')}:")
        for r in log:
            print("  " + _update_line(r, clock))
    return 0


def _print_plan(plan: list[dict], clock, title: str | None = None) -> None:
    """The table of ``ebb plan``: per update, its slot and time and the sub-indices it touches."""
    stamp = (lambda t: "") if clock is None else (lambda t: "  " + clock.stamp(t))
    width = len(stamp(plan[0]["time"])) if plan else 0
    if title:
        print(title)
    print(f"{'slot':>6} {'time':>10}{('  timestamp' if clock else '').ljust(width)}  {'insert into':<24} delete from")
    for p in plan:
        print(f"{p['slot']:>6} {p['time']:>10}{stamp(p['time'])}  {_ids(p['insert_into']):<24} {_ids(p['delete_from'])}")


def _cmd_plan(a) -> int:
    from ..storage.archive import Archive
    from .timefmt import Clock

    with Archive(a.path) as arc:
        plan = arc.plan(a.updates)
        clock = Clock.of(arc.config, a.raw_time)
    if a.format == "json":
        print(json.dumps(plan, indent=2))
        return 0
    _print_plan(plan, clock)
    return 0


def _cmd_verify(a) -> int:
    from ..storage.archive import Archive, open_readonly
    from ..storage.files import MARKER
    from ..storage.verify import verify
    from .progress import Bar, plural

    checked = [0]  # runs checked, as verify reports them

    def progress(done: int, total: int) -> None:
        checked[0] = done
        bar.set(done, total)

    # a data directory: its published copies and the runs they reference (issue 29)
    with (Archive(a.path) if os.path.isfile(os.path.join(a.path, MARKER)) else open_readonly(a.path)) as arc, \
            Bar("verify", unit="run") as bar:
        problems, notes = verify(arc, progress)
    if a.format == "json":
        print(json.dumps({"ok": not problems, "problems": problems, "notes": notes, "runs_checked": checked[0]}, indent=2))
        return EXIT_VERIFY if problems else 0
    for n in notes:
        print(f"note: {n}")
    for p in problems:
        print(f"PROBLEM: {p}")
    if problems:
        print(f"verify: {plural(len(problems), 'problem')} found", file=sys.stderr)
        return EXIT_VERIFY
    print(f"verify: ok ({plural(checked[0], 'run')} checked)")
    return 0


def _cmd_migrate(a) -> int:
    from ..storage.archive import Archive
    from ..storage.migration import migrate, target_config
    from .progress import message_bar

    bar, progress = message_bar("migrate", quiet=a.format == "json")
    with Archive(a.path) as arc, bar:
        target = target_config(arc.config, layout=a.layout, partitioning=a.partitioning, split=a.split, G=a.G,
                               E=a.E, n_wave=a.n, mode=a.mode, seed=a.seed)
        rec = migrate(arc, target, copy=a.copy, wait_s=a.wait, progress=progress)
    if a.format == "json":
        print(json.dumps(rec, indent=2))
        return 0
    print(f"migrated {a.path}: {rec['from_layout']} -> {rec['to_layout']} after update {rec['after_update']}")
    if rec["method"] == "copy":
        print(f"copied {rec['records_copied']} live records: read {_size(rec['bytes_read'])}, "
              f"wrote {rec['blocks_written']} blocks/{_size(rec['bytes_written'])}; {rec['wall_seconds'] * 1000:.1f} ms")
    elif rec["records_left_draining"]:
        print(f"draining: {rec['records_left_draining']} records stay where they are until they expire "
              f"(all by T={rec['drained_by']}); nothing was copied; {rec['wall_seconds'] * 1000:.1f} ms")
    else:
        print("nothing to drain: the archive held no records")
    return 0


if __name__ == "__main__":
    sys.exit(main())
