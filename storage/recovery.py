"""Crash recovery and garbage collection of bucket files.

Nothing needs replaying after a crash: an update becomes visible only when its LMDB
transaction commits. What a crashed update may leave behind is unreferenced space: new Rebuild
files that were never committed, and NoRebuild slot files grown past their committed size.
``recover`` removes both; it runs under the writer lock before every update.
``collect_garbage`` deletes files replaced by committed updates once no reader can see them.
"""

from __future__ import annotations

import os

import lmdb

from .faults import crash_point
from .files import norebuild_file, parse_data_file, rebuild_file
from .lmdb_env import oldest_reader_txn
from .manifest import read_config, read_garbage, read_state, write_garbage


def recover(env: lmdb.Environment, meta, data_dir: str) -> list[str]:
    """Removes what uncommitted updates left in ``data_dir``. Returns what it did."""
    actions = []
    with env.begin(db=meta) as txn:
        cfg = read_config(txn, meta)
        state = read_state(txn, meta)
        pending = {g[0] for g in read_garbage(txn, meta)}
    referenced = set()
    for i, s in enumerate(state.subindices):
        if s.generation:
            referenced.add(rebuild_file(i, s.generation))
        if cfg.mode == "norebuild" and s.slots:
            referenced.add(norebuild_file(i))
    for name in sorted(os.listdir(data_dir)):
        if name in referenced or name in pending:
            continue
        if parse_data_file(name) is not None or name.endswith(".tmp"):
            os.remove(os.path.join(data_dir, name))
            actions.append(f"removed uncommitted file {name}")
    if cfg.mode == "norebuild":
        for i, s in enumerate(state.subindices):
            path = os.path.join(data_dir, norebuild_file(i))
            size = s.slots * (state.bucket_capacity or 0)
            if os.path.exists(path) and os.path.getsize(path) > size:
                os.truncate(path, size)
                actions.append(f"truncated {norebuild_file(i)} to its committed {s.slots} slots")
    return actions


def collect_garbage(env: lmdb.Environment, meta, data_dir: str) -> list[str]:
    """Deletes replaced files that no live snapshot can reference. Returns their names."""
    with env.begin(write=True, db=meta) as txn:
        garbage = read_garbage(txn, meta)
        if not garbage:
            return []
        oldest = oldest_reader_txn(env)
        done, keep = [], []
        for name, freed_by in garbage:
            if oldest is None or freed_by <= oldest:
                try:
                    os.remove(os.path.join(data_dir, name))
                except FileNotFoundError:
                    pass
                crash_point("gc.file_removed")
                done.append(name)
            else:
                keep.append([name, freed_by])
        write_garbage(txn, meta, keep)
    return done
