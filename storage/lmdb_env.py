"""The archive's LMDB environment: one per archive, shared within a process.

LMDB forbids opening one environment twice in a process, so every ``Archive`` and reader in
this process borrows the same ``lmdb.Environment`` through ``acquire``/``release``. The
environment holds the manifest (``meta``), the update log (``updates``) and one directory
B+-tree per sub-index (``dir.NNNN``). Its reader table also tells a writer which snapshots
are still in use, so freed bucket space is reused only when no reader can see it.
"""

from __future__ import annotations

import os
import threading

import lmdb

MAP_SIZE = int(os.environ.get("EBB_MAP_SIZE", 1 << 40))  # virtual only; the file grows as used
MAX_SUBINDICES = 1024

_lock = threading.Lock()
_envs: dict[str, tuple[lmdb.Environment, int]] = {}


def acquire(index_dir: str, create: bool = False, readonly: bool = False) -> lmdb.Environment:
    """Returns this process's environment for ``index_dir``, opening it on first use.

    ``readonly`` opens it without write access: opening its databases then needs no write
    transaction, so a pure reader (a server, a Spark task) never waits for an update in progress
    in another process. LMDB allows one environment per process, so whichever mode opened it
    first is shared: check ``env.flags()["readonly"]`` before writing."""
    key = os.path.realpath(index_dir)
    with _lock:
        if key in _envs:
            env, refs = _envs[key]
            _envs[key] = (env, refs + 1)
            return env
        if not create and not os.path.exists(os.path.join(key, "data.mdb")):
            raise FileNotFoundError(f"no archive index at {index_dir}")
        env = lmdb.open(
            key,
            map_size=MAP_SIZE,
            max_dbs=MAX_SUBINDICES + 8,
            max_readers=512,
            subdir=True,
            create=create,
            readonly=readonly and not create,
            readahead=False,  # probes touch few pages; OS readahead would inflate their I/O
            max_spare_txns=4,
        )
        _envs[key] = (env, 1)
        return env


def release(env: lmdb.Environment) -> None:
    """Drops one reference; the last one closes the environment (and its memory map)."""
    key = env.path()
    with _lock:
        got, refs = _envs.get(key, (None, 0))
        if got is not env:
            return
        if refs <= 1:
            del _envs[key]
            env.close()
        else:
            _envs[key] = (env, refs - 1)


def oldest_reader_txn(env: lmdb.Environment) -> int | None:
    """The oldest snapshot (txn id) held by any live reader, or None if there is none.
    Stale entries of dead processes are cleared first."""
    env.reader_check()
    oldest = None
    for line in env.readers().splitlines()[1:]:
        parts = line.split()
        if len(parts) == 3 and parts[2].isdigit():
            t = int(parts[2])
            oldest = t if oldest is None else min(oldest, t)
    return oldest


def dir_db_name(i: int) -> bytes:
    return b"dir.%04d" % i
