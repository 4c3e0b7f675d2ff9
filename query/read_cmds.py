"""``ebb probe``, ``ebb scan``, ``ebb stats`` and ``ebb plan``: reading an archive, their
arguments (``register``) and their work, a thin layer over ``reader`` and ``output``.

Probes and scans return only the records valid at the time asked for (``ts <= AS_OF < exp``);
``stats`` and ``plan`` describe the archive and its next updates. Start-up time matters (``ebb
probe`` should answer in well under a second), so modules are imported where a command needs
them: ``ebb --help`` imports this module and loads neither pyarrow nor pyspark.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..storage.errors import UsageError
from .archive_cmds import subindex_ids, update_line
from .output import add_output_options
from .serve_cmd import add_client_options

ARCHIVE_OR_DATA_DIR = ("archive directory, or the data directory of one made with --data-dir, read through the "
                       "metadata published there")


def register(sub: argparse._SubParsersAction) -> None:
    for name, helptext in (("probe", "records with one key (or a key range) valid at a time"),
                           ("scan", "every record valid at a time")):
        c = sub.add_parser(
            name, help=helptext, formatter_class=argparse.RawDescriptionHelpFormatter,
            description=f"{helptext[0].upper() + helptext[1:]}. Only records with ts <= AS_OF < exp are returned; "
            "AS_OF defaults to the time of the last update and may not be earlier.")
        if name == "probe":
            # PATH is optional only so that `ebb probe --server URL KEY` needs no path
            c.add_argument("path", nargs="?", help=f"{ARCHIVE_OR_DATA_DIR}; omit with --server")
            c.add_argument("key", help="search key (parsed as the archive's key type)")
            c.add_argument("--to", metavar="KEY2", help="probe the inclusive range KEY..KEY2 instead of one key")
            c.add_argument("--server", metavar="URL", help="ask an `ebb serve` process (grpc://HOST:PORT, grpc+tls://HOST:PORT or HOST:PORT, e.g. 127.0.0.1:8815) instead of opening PATH")
            add_client_options(c)  # --token, --tls-ca, --tls-cert, --tls-key
        else:
            c.add_argument("path", help=ARCHIVE_OR_DATA_DIR)
        c.add_argument("--as-of", metavar="T", help="time of validity, in chronons or, if the archive knows its time "
                       "unit and origin, an ISO 8601 timestamp (default: last update time)")
        add_output_options(c)
        c.add_argument("--raw-time", action="store_true",
                       help="show times as chronons, not timestamps (table: in place; CSV, JSON lines: no <column>_time)")
        c.set_defaults(handler=probe_cmd if name == "probe" else scan_cmd)

    c = sub.add_parser(
        "stats", help="sizes, slots and the I/O of every update", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Show the archive's configuration, each sub-index's size (records, bytes, blocks, runs) and the "
        "insertion and expiration slots it currently holds, and the update log: per update the sub-indices "
        "read and written, blocks and bytes read and written (by ebb and by the OS), records inserted, "
        "deleted and dropped as already expired, and wall time.")
    c.add_argument("path", help=ARCHIVE_OR_DATA_DIR)
    c.add_argument("--format", choices=["table", "json"], default="table", help="output format (default: table)")
    c.add_argument("--updates", type=int, default=10, metavar="N", help="table format: show the last N updates (default 10)")
    c.add_argument("--next", type=int, default=4, metavar="N",
                   help="the next N updates' cells, as `ebb plan --updates N` lists them (default 4)")
    c.add_argument("--plot", metavar="FILE.png",
                   help="also draw the archive: the sub-index grid with records and bytes, the bytes that expire at each "
                        "coming update, and the cells the next updates touch (needs matplotlib: pip install 'ebb[plot]')")
    c.add_argument("--raw-time", action="store_true", help="show times as chronons only, not timestamps")
    c.set_defaults(handler=stats_cmd)

    c = sub.add_parser(
        "plan", help="which sub-indices the next updates will touch", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="List, for each of the next N updates, the sub-indices (numbered I1..In as in docs/spec.md, "
        "'Where each record lives') that it inserts into and deletes from.")
    c.add_argument("path", help="archive directory")
    c.add_argument("--updates", type=int, default=4, metavar="N", help="how many updates to plan (default 4)")
    c.add_argument("--format", choices=["table", "json"], default="table", help="output format (default: table)")
    c.add_argument("--raw-time", action="store_true", help="show times as chronons only, not timestamps")
    c.set_defaults(handler=plan_cmd)


def _read_as_of(r, a: argparse.Namespace):
    """(config, as_of, result schema) for a read of reader ``r`` as ``--as-of`` asks; None (after
    saying so) if the archive is empty."""
    from .timefmt import Clock, parse_as_of

    cfg = r.archive.config
    as_of = parse_as_of(a.as_of, Clock.of(cfg))
    schema = r.result_schema()
    if not len(schema):
        print("(the archive is empty: nothing has been loaded)", file=sys.stderr)
        return None
    return cfg, as_of, schema


def probe_cmd(a: argparse.Namespace) -> int:
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
        read = _read_as_of(r, a)
        if read is None:
            return 0
        cfg, as_of, schema = read
        kt = schema.field(cfg.key_column).type
        lo = keycodec.parse(a.key, kt)
        t = r.probe_range(lo, keycodec.parse(a.to, kt), as_of) if a.to is not None else r.probe(lo, as_of)
        n = write(t.to_batches(), schema, a.format, a.out, Clock.of(cfg, a.raw_time), [cfg.ts_column, cfg.exp_column])
    if a.out or a.format == "table":
        print(plural(n, "record"), file=sys.stderr)
    return 0


def scan_cmd(a: argparse.Namespace) -> int:
    from .output import check_output, write
    from .progress import Bar, plural
    from .reader import ArchiveReader
    from .timefmt import Clock

    check_output(a.format, a.out)  # before reading anything: a usage error (exit 2)
    with ArchiveReader(a.path, readonly=True) as r, Bar("scan", unit="rec", enabled=bool(a.out)) as bar:
        read = _read_as_of(r, a)
        if read is None:
            return 0
        cfg, as_of, schema = read
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


def stats_cmd(a: argparse.Namespace) -> int:
    from ..storage.archive import open_readonly
    from ..storage.config import ArchiveConfig
    from .progress import human_size as size
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
    print(f"layout    {s['layout']}, {ArchiveConfig(**c).mode_text}; {s['n']} sub-indices")
    print(f"time      tau={c['tau']} Delta={c['delta']} S={c['max_lifetime']} p={s['p']}"
          + (f" ({c['time_unit']})" if c.get("time_unit") else "")
          + (f"; chronon 0 is {c['origin']}" if c.get("origin") else ""))
    if s["native_point_probe"] != "on":
        print(f"probes    native point probe {s['native_point_probe']}: probes take the planned read (same answers, slower)")
    last = "no update yet" if s["last_update_time"] is None else f"last at {time_label(clock, s['last_update_time'])}"
    print(f"state     {plural(s['updates'], 'update')}, {last}; {plural(s['records'], 'record')}, {size(s['bytes'])}; "
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
              f"{plural(d['runs'], 'run')}, {plural(d['records'], 'record')} (expired ones included), {size(d['bytes'])}; "
              f"gone by {time_label(clock, d['gone_by'])}")
    print()
    print_plan(s["next_updates"], clock, "next updates (each touches the sub-indices it inserts into or deletes from):")
    timeline = s["expiry_timeline"]
    if timeline:
        soon = {u["slot"] for u in s["next_updates"]}
        freed = sum(e["bytes"] + e["draining_bytes"] for e in timeline if e["slot"] in soon)
        print(f"expiry: {size(freed)} expire over these {plural(len(soon), 'update')}, the rest by "
              f"{time_label(clock, timeline[-1]['time'])}{' (estimated)' if s['estimated'] else ''}; "
              "per update: --format json or --plot FILE.png")
    log = s["update_log"][-a.updates:] if a.updates else []
    if log:
        print(f"\nlast {plural(len(log), 'update')}:")
        for r in log:
            print("  " + update_line(r, clock))
    return 0


def print_plan(plan: list[dict], clock, title: str | None = None) -> None:
    """The table of ``ebb plan``: per update, its slot and time and the sub-indices it touches."""
    stamp = (lambda t: "") if clock is None else (lambda t: "  " + clock.stamp(t))
    width = len(stamp(plan[0]["time"])) if plan else 0
    if title:
        print(title)
    print(f"{'slot':>6} {'time':>10}{('  timestamp' if clock else '').ljust(width)}  {'insert into':<24} delete from")
    for p in plan:
        print(f"{p['slot']:>6} {p['time']:>10}{stamp(p['time'])}  {subindex_ids(p['insert_into']):<24} "
              f"{subindex_ids(p['delete_from'])}")


def plan_cmd(a: argparse.Namespace) -> int:
    from ..storage.archive import Archive
    from .timefmt import Clock

    with Archive(a.path) as arc:
        plan = arc.plan(a.updates)
        clock = Clock.of(arc.config, a.raw_time)
    if a.format == "json":
        print(json.dumps(plan, indent=2))
        return 0
    print_plan(plan, clock)
    return 0
