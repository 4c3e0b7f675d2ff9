"""Crash recovery and reclaiming replaced space.

Nothing needs replaying after a crash: an update becomes visible only when its LMDB transaction
commits, and every file it references was made durable before that. What a crashed or failed
update (or a Spark task whose output was never committed) may leave is run files that no
committed version references; ``recover`` deletes them. It runs under the writer lock before
every update. ``collect_garbage`` reclaims runs and run prefixes replaced by committed updates
once no version that may still be read references them: one a local reader holds (LMDB's
reader table), one a lease pins (a read in another process or on another machine,
``leases``), a published copy, or a version kept for reads as of earlier instants.
"""

from __future__ import annotations

import os

import lmdb

from . import files
from .faults import crash_point
from .leases import oldest_pinned
from .lmdb_env import oldest_reader_txn
from .manifest import delete_run, oldest_kept_version, read_garbage, read_state, write_garbage


def recover(env: lmdb.Environment, data_dir: str) -> list[str]:
    """Removes files in ``data_dir`` that no committed version references. Returns what it did."""
    with env.begin() as txn:
        state = read_state(txn)
        pending = {g[0] for g in read_garbage(txn)}
    referenced = state.run_names()
    actions = []
    for name in sorted(os.listdir(data_dir)):
        if name in referenced or name in pending:
            continue
        if files.parse_run_file(name) is not None or name.endswith(".tmp"):
            files.FS.remove(os.path.join(data_dir, name))
            actions.append(f"removed uncommitted file {name}")
    return actions


def collect_garbage(env: lmdb.Environment, data_dir: str, pinned: int | None = None) -> list[str]:
    """Deletes replaced runs (and their descriptors) and punches out dead run prefixes that no
    version still readable references: not a live local reader's, nor a leased one's, nor the
    oldest kept version's, nor the version with txn id ``pinned`` or later ones (the oldest
    published copy that readers on other machines may still read: ``published.publish``).
    Returns what it reclaimed."""
    with env.begin(write=True) as txn:
        garbage = read_garbage(txn)
        if not garbage:
            return []
        kept = oldest_kept_version(txn)
        held = (oldest_reader_txn(env), pinned, oldest_pinned(data_dir), kept and kept.txn)
        oldest = min((t for t in held if t is not None), default=None)
        done, keep = [], []
        live = read_state(txn).run_names()
        for name, freed_by, end in garbage:
            if oldest is not None and freed_by > oldest:
                keep.append([name, freed_by, end])
                continue
            path = os.path.join(data_dir, name)
            if end is None:
                files.FS.remove(path)
                delete_run(txn, name)
                done.append(f"deleted replaced run {name}")
            elif name in live and os.path.exists(path):
                files.FS.punch_hole(path, 0, end)
                done.append(f"reclaimed the first {end} bytes of run {name}")
            crash_point("gc.file_removed")
        write_garbage(txn, keep)
    return done
