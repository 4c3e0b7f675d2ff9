"""Names and durable writes of the archive's files (docs/format.md lists them all)."""

from __future__ import annotations

import fcntl
import mmap
import os
import re
from contextlib import contextmanager
from typing import Iterator

import numpy as np

MARKER = "EBB"  # identifies an archive directory; holds the format version
LOCK = "LOCK"  # flock'd by the one process that may update the archive
INDEX_DIR = "index"  # the LMDB environment
DATA_DIR = "data"  # bucket files

_RB = re.compile(r"^I(\d{4})-(\d{6})\.rb$")
_NR = re.compile(r"^I(\d{4})\.nr$")


def rebuild_file(i: int, generation: int) -> str:
    """Rebuild bucket file of sub-index i (0-based; shown as I{i+1})."""
    return f"I{i + 1:04d}-{generation:06d}.rb"


def norebuild_file(i: int) -> str:
    """NoRebuild slot file of sub-index i (0-based)."""
    return f"I{i + 1:04d}.nr"


def parse_data_file(name: str) -> tuple[str, int, int] | None:
    """("rb", i, generation) or ("nr", i, 0) for a data file name, else None."""
    m = _RB.match(name)
    if m:
        return ("rb", int(m.group(1)) - 1, int(m.group(2)))
    m = _NR.match(name)
    if m:
        return ("nr", int(m.group(1)) - 1, 0)
    return None


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: np.ndarray | bytes, offset: int) -> int:
    """pwrite until every byte is written; returns bytes written."""
    view = memoryview(data).cast("B")
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], offset + done)
    return done


class LockHeld(Exception):
    """Another process holds an exclusive lock file."""


@contextmanager
def exclusive_lock(path: str) -> Iterator[None]:
    """Holds flock(LOCK_EX) on ``path`` (created if needed); raises LockHeld at once instead of
    waiting. The kernel drops the lock when the process dies, so a crash never leaves it held."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LockHeld(path) from None
        yield
    finally:
        os.close(fd)


class MappedFile:
    """A read-only memory map of a bucket file, exposed as a numpy uint8 array.

    The map is advised MADV_RANDOM: a probe faults in only the pages of its buckets instead of
    the device's read-ahead window around each (megabytes per sub-index). Sequential readers
    call ``prefetch`` on the range they are about to read. ``close`` releases the mapping;
    callers must not keep views of ``array`` past it (the codec copies what it decodes)."""

    def __init__(self, path: str):
        self._fd = os.open(path, os.O_RDONLY)
        size = os.fstat(self._fd).st_size
        self._mm = mmap.mmap(self._fd, size, prot=mmap.PROT_READ) if size else None
        if self._mm is not None and hasattr(mmap, "MADV_RANDOM"):
            self._mm.madvise(mmap.MADV_RANDOM)
        self.array = np.frombuffer(self._mm, dtype=np.uint8) if self._mm else np.zeros(0, np.uint8)

    def prefetch(self, start: int, end: int) -> None:
        """Asks the kernel to read [start, end) ahead (a scan's next chunk)."""
        if self._mm is None or not hasattr(mmap, "MADV_WILLNEED") or end <= start:
            return
        lo = start - start % mmap.PAGESIZE
        self._mm.madvise(mmap.MADV_WILLNEED, lo, min(end, len(self._mm)) - lo)

    def close(self) -> None:
        self.array = None
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:
                pass  # a view is still alive (e.g. in a traceback); the map closes when it is freed
            self._mm = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
