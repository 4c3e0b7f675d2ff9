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

import errno
import os

import lmdb

from . import files
from .faults import crash_point
from .leases import oldest_pinned
from .lmdb_env import oldest_reader_txn
from .manifest import delete_run, oldest_kept_version, read_garbage, read_state, seal_root, write_garbage


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
        seal_root(txn)
    return done


def held_bytes(env: lmdb.Environment, data_dir: str) -> int:
    """The disk bytes that replaced space still holds: the garbage list's runs and run prefixes
    that ``collect_garbage`` has not reclaimed yet because a version that may still be read (a
    reader's, a lease's, a published or kept one) references them. A whole run counts its
    allocated blocks; a dead prefix the part of it not yet punched out (a file's first data
    offset, ``SEEK_DATA``, is where an earlier punch ended). Metrics read it (``ebb_pinned_bytes``);
    it stats each file on the list, which holds a few entries per update not yet reclaimed."""
    with env.begin() as txn:
        garbage = read_garbage(txn)
    whole: set[str] = set()
    prefix: dict[str, int] = {}
    for name, _, end in garbage:
        if end is None:
            whole.add(name)
        else:  # several updates may each have dropped a longer prefix of one run
            prefix[name] = max(prefix.get(name, 0), end)
    total = 0
    for name in whole:
        try:
            total += os.stat(os.path.join(data_dir, name)).st_blocks * 512
        except FileNotFoundError:
            pass  # removed by a collection that crashed before its commit: holds nothing
    for name, end in prefix.items():
        if name in whole:
            continue
        try:
            fd = os.open(os.path.join(data_dir, name), os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            first_data = os.lseek(fd, 0, os.SEEK_DATA)
        except OSError as e:  # ENXIO: no data left at all; else a file system without SEEK_DATA
            first_data = end if e.errno == errno.ENXIO else 0
        finally:
            os.close(fd)
        total += max(0, end - first_data)
    return total
