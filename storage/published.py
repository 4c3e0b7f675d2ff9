"""Published metadata: copies of the commit metadata beside the run files, so that a machine
which mounts only the data directory can read the archive (``ebb serve DATA_DIR``).

LMDB must stay on the writer's local disk, so remote readers cannot share its reader table, and
the writer cannot see which versions they read. Instead, when the run files live in their own
data directory (``ebb init --data-dir``), every commit is followed by ``publish``, whose cost
follows what the update changed, not the archive's size: the descriptors of runs not yet
published (immutable, like their runs) are written once each to ``DATA/meta/runs/NAME``; then a
copy of every other metadata entry of the committed version (configuration, schema, state,
kept versions, garbage list, checkpoints, the last ``PUBLISHED_UPDATES`` update records), read
inside one LMDB read transaction, is written to ``DATA/meta/v<txn id>/data.mdb``; everything is
made durable, and then ``DATA/meta/CURRENT`` is switched to it durably. The newest ``KEEP`` copies are kept, and garbage collection treats the oldest of them
as a reader (``pinned_txn``), so the run files of every kept version stay until ``KEEP`` newer
commits have been published. A remote reader opens ``CURRENT``'s copy read-only without locks
(``open_current``); the copy never changes, so that is safe on any file system. A read that
lasts longer than ``KEEP`` updates may find its blocks reclaimed and fail; it never returns rows
of another version. A reader reads descriptors from ``meta/runs`` through ``PublishedTxn``.
Descriptor files whose run file garbage collection has deleted are removed right after it.
"""

from __future__ import annotations

import json
import os
import shutil

import lmdb

from . import files
from .errors import ArchiveError, CorruptionError, FormatVersionError
from .faults import crash_point
from .files import write_durably
from .lmdb_env import check_pages

META_DIR = "meta"  # under the data directory
CURRENT = "CURRENT"  # names the newest complete copy
RUNS_DIR = "runs"  # under META_DIR: one immutable file per run descriptor
KEEP = 2  # copies kept: a remote read may last this many updates (unless it holds a lease)
PUBLISHED_UPDATES = 100  # update records in a copy (``ebb stats`` through the data directory)
_RUN_PREFIX = b"run/"


def meta_dir(data_dir: str) -> str:
    return os.path.join(data_dir, META_DIR)


def _copies(meta: str) -> list[str]:
    """Names of the complete copies in ``meta``, oldest first."""
    if not os.path.isdir(meta):
        return []
    return sorted(n for n in os.listdir(meta) if n.startswith("v") and n[1:].isdigit())


def publish(env: lmdb.Environment, data_dir: str, fmt: int) -> int:
    """Publishes the last committed version of ``env`` under ``data_dir``, durably, drops all
    but the newest ``KEEP`` copies, and returns the txn id of the oldest copy kept (which
    garbage collection must treat as a reader). Publishing a version twice does nothing more."""
    meta = meta_dir(data_dir)
    runs = os.path.join(meta, RUNS_DIR)
    os.makedirs(runs, exist_ok=True)
    with env.begin(buffers=True) as txn:
        name = f"v{txn.id():016d}"
        final = os.path.join(meta, name)
        if not os.path.isdir(final):
            tmp = final + ".tmp"
            shutil.rmtree(tmp, ignore_errors=True)  # left by a crash in an earlier publish
            os.makedirs(tmp)
            _write_descriptors(txn, runs)
            _write_copy(txn, tmp)
            files.FS.sync_files([os.path.join(tmp, "data.mdb")])
            files.FS.sync_dir(runs)
            files.FS.sync_dir(tmp)
            crash_point("publish.copied")
            os.replace(tmp, final)
            files.FS.sync_dir(meta)
    write_durably(os.path.join(meta, CURRENT), json.dumps({"format": fmt, "copy": name}).encode())
    kept = _copies(meta)
    for old in kept[:-KEEP]:
        shutil.rmtree(os.path.join(meta, old), ignore_errors=True)
    for stray in os.listdir(meta):
        if stray.endswith(".tmp") and stray != CURRENT + ".tmp":
            shutil.rmtree(os.path.join(meta, stray), ignore_errors=True)
    return int(kept[-KEEP:][0][1:])


def _write_descriptors(txn, runs: str) -> list[str]:
    """Writes the descriptor of every run in ``txn`` not published yet (as stored: sealed)."""
    have = set(os.listdir(runs))
    for stray in (n for n in have if n.endswith(".tmp")):  # left by a crash while writing one
        os.remove(os.path.join(runs, stray))
    written = []
    cur = txn.cursor()
    if cur.set_range(_RUN_PREFIX):
        for key, value in cur.iternext():
            if not bytes(key).startswith(_RUN_PREFIX):
                break
            run = bytes(key[len(_RUN_PREFIX):]).decode()
            if run not in have:
                path = os.path.join(runs, run)
                with open(path + ".tmp", "wb") as f:
                    f.write(value)
                written.append(path)
    # durable before their names: a file under its final name is always whole, so a later
    # publish may skip it
    files.FS.sync_files([p + ".tmp" for p in written])
    for path in written:
        os.replace(path + ".tmp", path)
    return written


def _write_copy(txn, copy_dir: str) -> None:
    """Writes every entry of ``txn`` but the run descriptors and the older update records into
    a new LMDB environment in ``copy_dir``."""
    cur = txn.cursor()
    updates = []
    out = lmdb.open(copy_dir, map_size=1 << 36, subdir=True, max_dbs=0, sync=False, metasync=False)
    try:
        with out.begin(write=True) as w:
            for key, value in cur.iternext():
                k = bytes(key)
                if k.startswith(_RUN_PREFIX):
                    continue
                if k.startswith(b"upd/"):
                    updates.append((k, bytes(value)))
                    continue
                w.put(k, value)
            for k, v in updates[-PUBLISHED_UPDATES:]:
                w.put(k, v)
    finally:
        out.close()
    lock = os.path.join(copy_dir, "lock.mdb")  # readers open the copy without locks
    if os.path.exists(lock):
        os.remove(lock)


def forget_deleted_runs(data_dir: str) -> None:
    """Removes published descriptors whose run file garbage collection has deleted (no kept
    copy, lease or local reader can read those runs any more); after each collection."""
    runs = runs_dir(data_dir)
    for run in os.listdir(runs) if os.path.isdir(runs) else ():
        if not run.endswith(".tmp") and not os.path.exists(os.path.join(data_dir, run)):
            try:
                os.remove(os.path.join(runs, run))
            except FileNotFoundError:
                pass


class PublishedTxn:
    """A read transaction of a published copy whose run descriptors are read from
    ``meta/runs`` (the manifest's readers see the same sealed values as in the archive)."""

    def __init__(self, txn, runs_dir: str):
        self._txn, self._runs = txn, runs_dir

    def get(self, key: bytes, default=None):
        if key.startswith(_RUN_PREFIX):
            try:
                with open(os.path.join(self._runs, key[len(_RUN_PREFIX):].decode()), "rb") as f:
                    return f.read()
            except FileNotFoundError:
                return default
        return self._txn.get(key, default)

    def __getattr__(self, name):  # cursor, id, abort, stat: the copy's transaction
        return getattr(self._txn, name)


def copies(data_dir: str) -> list[str]:
    """The directories of the complete copies published in ``data_dir``, oldest first."""
    meta = meta_dir(data_dir)
    return [os.path.join(meta, n) for n in _copies(meta)]


def runs_dir(data_dir: str) -> str:
    return os.path.join(meta_dir(data_dir), RUNS_DIR)


def is_published(data_dir: str) -> bool:
    """Whether ``data_dir`` holds published metadata (a data directory ``ebb serve`` can open)."""
    return os.path.isfile(os.path.join(meta_dir(data_dir), CURRENT))


def current_copy(data_dir: str, fmt: int) -> str:
    """The directory of the newest published copy; ArchiveError if there is none or it is
    unreadable, FormatVersionError if it was written by another format version."""
    path = os.path.join(meta_dir(data_dir), CURRENT)
    try:
        with open(path) as f:
            meta = json.load(f)
        version, name = meta.get("format"), meta["copy"]
    except (OSError, ValueError, KeyError, AttributeError):
        raise ArchiveError(f"{data_dir}: its published metadata pointer {path} is missing or unreadable") from None
    if version != fmt:
        raise FormatVersionError(f"{data_dir} was published in on-disk format version {version}; this ebb reads only "
                                 f"format version {fmt}")
    if not isinstance(name, str) or os.sep in name or not name.startswith("v"):
        raise ArchiveError(f"{data_dir}: its published metadata pointer names {name!r}, not a copy")
    return os.path.join(meta_dir(data_dir), name)


def open_copy(copy_dir: str) -> lmdb.Environment:
    """A published copy opened read-only, its pages checked. No lock file: the copy never
    changes."""
    try:
        env = lmdb.open(copy_dir, readonly=True, lock=False, subdir=True, max_dbs=0, readahead=True)
    except (lmdb.InvalidError, lmdb.CorruptedError, lmdb.PageNotFoundError) as e:  # its meta pages
        raise CorruptionError(f"the published metadata in {copy_dir} is damaged (LMDB: {e})") from None
    except lmdb.Error as e:
        raise ArchiveError(f"cannot open the published metadata in {copy_dir}: {e}") from None
    try:
        with env.begin() as txn:
            check_pages(env, txn)  # before LMDB walks a page of it
    except BaseException:
        env.close()
        raise
    return env
