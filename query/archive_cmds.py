"""``ebb init`` and ``ebb load``: creating an archive and applying one update to it, their
arguments (``register``) and their work, a thin layer over ebb.storage.

``update_line`` is the one line an update's record becomes, as ``ebb load`` prints it and
``ebb stats`` lists the last updates. Nothing heavy is imported until a command runs: ``ebb
--help`` imports this module.
"""

from __future__ import annotations

import argparse
import json
import os

from ..storage.errors import RejectedBatch


def register(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser(
        "init", help="create an empty archive", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Create an empty archive. The time model and columns are fixed for its life (the layout can "
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
    c.add_argument("--section-slots", type=int, default=1, metavar="K",
                   help="norebuild, wave split by insertion or doubly with E = 1: expiration slots per section of "
                        "a run (default 1). K > 1: fewer sections for a probe to search where keys have records in "
                        "many of them; expired records stay on disk up to K-1 updates longer, never returned, and "
                        "scans filter them out (docs/io.md)")
    c.set_defaults(handler=init_cmd)

    c = sub.add_parser(
        "load", help="apply one periodic update from a Parquet file", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Apply one update at time T = TAU + j*DELTA: delete every record with exp <= T, then insert "
        "the file's records. The first load may be at TAU (the initial bulk load). The update is atomic: "
        "a bad batch is rejected whole (exit 3) and a crash leaves the archive as before or after it.")
    c.add_argument("path", help="archive directory")
    c.add_argument("input", help="Parquet file with the key, ts and exp columns and any payload columns")
    c.add_argument("--at", type=int, required=True, metavar="T", help="update time, TAU + j*DELTA, after the last update")
    c.add_argument("--quiet", action="store_true", help="print nothing but errors")
    c.add_argument("--format", choices=["table", "json"], default="table", help="how to print the update's record")
    c.set_defaults(handler=load_cmd)


def init_cmd(a: argparse.Namespace) -> int:
    from ..storage.archive import Archive
    from ..storage.config import build_config

    cfg = build_config(
        layout=a.layout, mode=a.mode, interval=a.interval, max_lifetime=a.max_lifetime, start=a.start,
        partitioning=a.partitioning, G=a.G, E=a.E, split=a.split, n=a.n, key_column=a.key_column,
        ts_column=a.ts_column, exp_column=a.exp_column, accept_overlong=a.accept_overlong,
        block_bytes=a.block_bytes, seed=a.seed, time_unit=a.time_unit, retain=a.retain, origin=a.origin,
        section_slots=a.section_slots, **({} if a.update_log is None else {"update_log": a.update_log}),
    )
    with Archive.create(a.path, cfg, data_dir=a.data_dir) as arc:
        note = f" (S rounded up to {cfg.max_lifetime})" if cfg.max_lifetime != a.max_lifetime else ""
        print(f"created {arc.path}: {cfg.layout_obj.describe()}, {cfg.mode_text}, n={cfg.n}, "
              f"tau={cfg.tau} Delta={cfg.delta} S={cfg.max_lifetime}{note} p={cfg.time.p}")
    return 0


def load_cmd(a: argparse.Namespace) -> int:
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
        print(update_line(rec, clock))
    return 0


def update_line(r: dict, clock=None) -> str:
    """An update's record (``Archive.load``, the update log) as one line: time, slot, records
    inserted, deleted and dropped, sub-indices touched, I/O (ebb's and the OS's) and wall time."""
    from .progress import human_size as size
    from .timefmt import time_label

    return (f"update {r['seq']} at {time_label(clock, r['time'])} (slot {r['slot']}, {r['kind']}): +{r['inserted']} -{r['deleted']} "
            f"dropped {r['dropped_expired']} expired; touched {subindex_ids(r['subindices_touched'])}; "
            f"read {r['blocks_read']} blocks/{size(r['bytes_read'])}, wrote {r['blocks_written']} blocks/{size(r['bytes_written'])} "
            f"(OS: read {size(r['os_read_bytes'])}, wrote {size(r['os_write_bytes'])}); {r['wall_seconds'] * 1000:.1f} ms")


def subindex_ids(xs) -> str:
    """Sub-index numbers as docs/spec.md names them: {I1,I3}."""
    return "{" + ",".join(f"I{x}" for x in xs) + "}"
