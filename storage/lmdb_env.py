"""The archive's LMDB environment (the commit metadata): one per archive, shared within a process.

LMDB forbids opening one environment twice in a process, so every ``Archive`` in this process
borrows the same ``lmdb.Environment`` through ``acquire``/``release``. The environment's reader
table also tells a writer which committed versions are still being read, so replaced data is
reclaimed only when no reader can see it. LMDB must live on a local disk (its lock file is a
shared memory map), never on a network file system.
"""

from __future__ import annotations

import os
import threading

import lmdb

from . import page_walk
from .errors import ArchiveError, CorruptionError
from .tuning import LMDB_MAP_SIZE, LMDB_MAX_READERS, METADATA_READ_AHEAD_BYTES

MAP_SIZE = int(os.environ.get("EBB_MAP_SIZE", LMDB_MAP_SIZE))

_lock = threading.Lock()
_envs: dict[str, tuple[lmdb.Environment, int]] = {}


def acquire(index_dir: str, create: bool = False, readonly: bool = False) -> lmdb.Environment:
    """This process's environment for ``index_dir``, opened on first use. ``readonly`` opens it
    without write access. LMDB allows one environment per process, so whichever mode opened it
    first is shared: check ``env.flags()["readonly"]`` before writing."""
    key = os.path.realpath(index_dir)
    with _lock:
        if key in _envs:
            env, refs = _envs[key]
            _envs[key] = (env, refs + 1)
            return env
        if not create and not os.path.exists(os.path.join(key, "data.mdb")):
            raise ArchiveError(f"no archive metadata at {index_dir}")
        # max_spare_txns=0: py-lmdb's recycled read transactions failed with MDB_BAD_RSLOT when a
        # snapshot opened in one thread was closed in another (the Flight server's streams).
        # readahead on: the metadata is a few MB, and a cold probe reads its runs' descriptors
        # (with their page sums, about 0.5 KiB per block) through LMDB's map; without
        # read-ahead each of their 4 KiB pages was a separate disk read (many-keys: 35 ms
        # cold probes instead of 5 ms)
        try:
            env = lmdb.open(key, map_size=MAP_SIZE, max_dbs=0, max_readers=LMDB_MAX_READERS, subdir=True,
                            create=create, readonly=readonly and not create, readahead=True, max_spare_txns=0)
        except (lmdb.InvalidError, lmdb.CorruptedError, lmdb.PageNotFoundError) as e:  # its meta pages
            raise CorruptionError(f"the archive's metadata in {index_dir} is damaged (LMDB: {e})") from None
        except lmdb.Error as e:
            raise ArchiveError(f"cannot open the archive's metadata in {index_dir}: {e}") from None
        _read_ahead(os.path.join(key, "data.mdb"))
        try:
            with env.begin() as txn:
                check_pages(env, txn)
        except BaseException:
            env.close()
            raise
        _envs[key] = (env, 1)
        return env


_checked: dict[str, int] = {}  # the newest version whose pages were checked, by environment path


def check_pages(env: lmdb.Environment, txn) -> None:
    """Checks the pages of ``txn``'s version before LMDB walks them (``page_walk``), once per
    version and process: a damaged page is a CorruptionError, never an abort. A version older
    than the newest checked (a transaction begun before a commit another thread saw) is not."""
    path = env.path()
    if _checked.get(path, -1) >= txn.id():
        return
    # the file's map is kept for the next version's check only for an archive's environment, let
    # go with it (``release``): not for a published copy, which never changes and is deleted
    # once replaced, nor for a failed open
    kept = _envs.get(path, (None, 0))[0] is env
    page_walk.check(os.path.join(path, "data.mdb"), txn.id(), keep_map=kept)
    _checked[path] = txn.id()


def _read_ahead(path: str) -> None:
    """Asks the kernel to start reading the whole metadata file, in one request, if it is at
    most METADATA_READ_AHEAD_BYTES: a cold start then finds the state and the run descriptors in
    memory by the first read, instead of faulting them in a window at a time (many-keys: 1.3 MB
    took 1.3 ms of a cold probe), as RocksDB's open loads its tables' index and filter blocks."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        size = os.fstat(fd).st_size
        if size <= METADATA_READ_AHEAD_BYTES:
            os.posix_fadvise(fd, 0, size, os.POSIX_FADV_WILLNEED)
    finally:
        os.close(fd)


def release(env: lmdb.Environment) -> None:
    """Drops one reference; the last one closes the environment (and its memory map)."""
    key = env.path()
    with _lock:
        got, refs = _envs.get(key, (None, 0))
        if got is not env:
            return
        if refs <= 1:
            del _envs[key]
            _checked.pop(key, None)
            page_walk.forget(os.path.join(key, "data.mdb"))
            env.close()
        else:
            _envs[key] = (env, refs - 1)


def oldest_reader_txn(env: lmdb.Environment) -> int | None:
    """The oldest version (txn id) held by any live reader, or None if there is none.
    Stale entries of dead processes are cleared first."""
    env.reader_check()
    oldest = None
    for line in env.readers().splitlines()[1:]:
        parts = line.split()
        if len(parts) == 3 and parts[2].isdigit():
            t = int(parts[2])
            oldest = t if oldest is None else min(oldest, t)
    return oldest
