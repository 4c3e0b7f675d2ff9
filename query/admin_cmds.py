"""``ebb verify`` and ``ebb migrate``: checking an archive and changing its layout while it is in
use, their arguments (``register``) and their work, a thin layer over ebb.storage.

``verify`` exits 5 (``EXIT_VERIFY``) when it finds a problem. Nothing heavy is imported until a
command runs: ``ebb --help`` imports this module.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from ..storage.errors import EXIT_VERIFY

MIGRATE_DESCRIPTION = (
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


def register(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser(
        "verify", help="check every invariant and checksum", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Check the committed state: block and metadata checksums, block directories, sort order, that "
        "no expired record is stored, that every record is in the sub-index docs/spec.md assigns it, and the "
        "manifest's sizes. Exits 5 if anything is wrong.")
    c.add_argument("path", help="archive directory")
    c.add_argument("--format", choices=["table", "json"], default="table",
                   help="json: one document {ok, problems, notes, runs_checked} (default: table)")
    c.set_defaults(handler=verify_cmd)

    c = sub.add_parser("migrate", help="change the layout while the archive is in use", description=MIGRATE_DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("path", help="archive directory")
    c.add_argument("--layout", choices=["doubly", "wave"], help="the new kind of layout (default: the current one)")
    c.add_argument("--partitioning", choices=["round-robin", "chronological", "random"], help="doubly: the new partitioning")
    c.add_argument("--split", choices=["insertion", "expiration"], help="wave: the new split")
    c.add_argument("--G", type=int, help="doubly: partitions of insertion time")
    c.add_argument("--E", type=int, help="doubly: partitions of expiration time")
    c.add_argument("--n", type=int, help="wave: number of sub-indices")
    c.add_argument("--mode", choices=["rebuild", "norebuild"], help="the new maintenance mode")
    c.add_argument("--seed", type=int, help="random partitioning: the hash seed (default: drawn at random)")
    c.add_argument("--section-slots", type=int, metavar="K",
                   help="NoRebuild: expiration slots per section of a run (see `ebb init --help`; default: the "
                        "current value where the new layout allows it, else 1)")
    c.add_argument("--copy", action="store_true", help="copy the live records now instead of draining the old layout")
    c.add_argument("--wait", type=float, default=600.0, metavar="SECONDS",
                   help="how long to wait for a running update to finish (default 600)")
    c.add_argument("--format", choices=["table", "json"], default="table", help="how to print the migration's record")
    c.set_defaults(handler=migrate_cmd)


def verify_cmd(a: argparse.Namespace) -> int:
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


def migrate_cmd(a: argparse.Namespace) -> int:
    from ..storage.archive import Archive
    from ..storage.migration import migrate, target_config
    from .progress import human_size as size
    from .progress import message_bar

    bar, progress = message_bar("migrate", quiet=a.format == "json")
    with Archive(a.path) as arc, bar:
        target = target_config(arc.config, layout=a.layout, partitioning=a.partitioning, split=a.split, G=a.G,
                               E=a.E, n_wave=a.n, mode=a.mode, seed=a.seed, section_slots=a.section_slots)
        rec = migrate(arc, target, copy=a.copy, wait_s=a.wait, progress=progress)
    if a.format == "json":
        print(json.dumps(rec, indent=2))
        return 0
    print(f"migrated {a.path}: {rec['from_layout']} -> {rec['to_layout']} after update {rec['after_update']}")
    if rec["method"] == "copy":
        print(f"copied {rec['records_copied']} live records: read {size(rec['bytes_read'])}, "
              f"wrote {rec['blocks_written']} blocks/{size(rec['bytes_written'])}; {rec['wall_seconds'] * 1000:.1f} ms")
    elif rec["records_left_draining"]:
        print(f"draining: {rec['records_left_draining']} records stay where they are until they expire "
              f"(all by T={rec['drained_by']}); nothing was copied; {rec['wall_seconds'] * 1000:.1f} ms")
    else:
        print("nothing to drain: the archive held no records")
    return 0
