"""Published metadata: copies of the commit metadata beside the run files, so that a machine
which mounts only the data directory can read the archive (``ebb serve DATA_DIR``).

LMDB must stay on the writer's local disk, so remote readers cannot share its reader table, and
the writer cannot see which versions they read. Instead, when the run files live in their own
data directory (``ebb init --data-dir``), every commit is followed by ``publish``: a compacted
copy of the committed version, taken inside one LMDB read transaction, is written to
``DATA/meta/v<txn id>/data.mdb`` and made durable, and then ``DATA/meta/CURRENT`` is switched to
it durably. The newest ``KEEP`` copies are kept, and garbage collection treats the oldest of them
as a reader (``pinned_txn``), so the run files of every kept version stay until ``KEEP`` newer
commits have been published. A remote reader opens ``CURRENT``'s copy read-only without locks
(``open_current``); the copy never changes, so that is safe on any file system. A read that
lasts longer than ``KEEP`` updates may find its blocks reclaimed and fail; it never returns rows
of another version.
"""

from __future__ import annotations

import json
import os
import shutil

import lmdb

from . import files
from .errors import ArchiveError, FormatVersionError
from .faults import crash_point
from .files import write_durably

META_DIR = "meta"  # under the data directory
CURRENT = "CURRENT"  # names the newest complete copy
KEEP = 2  # copies kept: a remote read may last this many updates


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
    os.makedirs(meta, exist_ok=True)
    with env.begin() as txn:
        name = f"v{txn.id():016d}"
        final = os.path.join(meta, name)
        if not os.path.isdir(final):
            tmp = final + ".tmp"
            shutil.rmtree(tmp, ignore_errors=True)  # left by a crash in an earlier publish
            os.makedirs(tmp)
            env.copy(tmp, compact=True, txn=txn)
            files.FS.sync_files([os.path.join(tmp, "data.mdb")])
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
    """A published copy opened read-only. No lock file: the copy never changes."""
    try:
        return lmdb.open(copy_dir, readonly=True, lock=False, subdir=True, max_dbs=0, readahead=True)
    except lmdb.Error as e:
        raise ArchiveError(f"cannot open the published metadata in {copy_dir}: {e}") from None
