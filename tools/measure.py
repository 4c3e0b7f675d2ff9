"""Measuring one operation: wall time, kernel I/O counters, peak RSS, cold caches, disk limits.

- I/O: ``/proc/self/io`` (``read_bytes``/``write_bytes``: what reached or came from the block
  layer, summed over every thread of the process, so background threads of RocksDB and DuckDB
  count; ``rchar``/``wchar``: bytes passed through read/write system calls).
- Peak RSS of one operation: the kernel's high-water mark (``VmHWM`` in ``/proc/self/status``),
  reset before the operation by writing ``5`` to ``/proc/self/clear_refs`` (Linux >= 4.0).
- Cold cache: ``sync`` then ``3 > /proc/sys/vm/drop_caches`` (root only). Callers must close every
  memory map of the store first: a mapped page stays resident and would make the "cold"
  measurement warm.
- Disk limits: sequential read and write bandwidth with ``O_DIRECT`` (page cache bypassed),
  measured in the directory the stores live in.
"""

from __future__ import annotations

import mmap
import os
import time
from dataclasses import dataclass
from typing import Callable, TypeVar

from ..storage.iostats import proc_io  # the same counters ebb's update records use

T = TypeVar("T")

def reset_peak_rss() -> bool:
    """Resets the process's peak RSS so VmHWM measures from now on; False if not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int:
    """VmHWM of this process in bytes (0 if unknown)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


@dataclass
class Sample:
    """What one operation cost."""

    wall_s: float
    os_read_bytes: int
    os_write_bytes: int
    os_rchar: int
    os_wchar: int
    peak_rss_bytes: int

    def as_row(self) -> dict[str, float | int]:
        return {
            "wall_s": round(self.wall_s, 6), "os_read_bytes": self.os_read_bytes, "os_write_bytes": self.os_write_bytes,
            "os_rchar": self.os_rchar, "os_wchar": self.os_wchar, "peak_rss_bytes": self.peak_rss_bytes,
        }


def measure(fn: Callable[[], T]) -> tuple[T, Sample]:
    """Runs ``fn`` once and returns its result with the wall time, I/O and peak RSS it took."""
    reset_peak_rss()
    io0 = proc_io()
    t0 = time.perf_counter()
    out = fn()
    wall = time.perf_counter() - t0
    io1 = proc_io()
    return out, Sample(
        wall_s=wall,
        os_read_bytes=io1["read_bytes"] - io0["read_bytes"],
        os_write_bytes=io1["write_bytes"] - io0["write_bytes"],
        os_rchar=io1["rchar"] - io0["rchar"],
        os_wchar=io1["wchar"] - io0["wchar"],
        peak_rss_bytes=peak_rss_bytes(),
    )


DROP_CACHES = "/proc/sys/vm/drop_caches"


def drop_caches() -> str | None:
    """Writes back dirty pages and drops the page cache. Returns None on success, else why not."""
    os.sync()
    try:
        with open(DROP_CACHES, "w") as f:
            f.write("3\n")
        return None
    except OSError as e:
        return f"cannot write {DROP_CACHES}: {e.strerror} (cold-cache runs need root)"


def cold_cache_problem() -> str | None:
    """Why cold-cache measurements are impossible here, or None if they are possible."""
    if not os.path.exists(DROP_CACHES):
        return f"{DROP_CACHES} does not exist (not Linux, or /proc not mounted)"
    if not os.access(DROP_CACHES, os.W_OK):
        return f"{DROP_CACHES} is not writable by this user (cold-cache runs need root)"
    return None


def dir_size_bytes(path: str) -> int:
    """Space allocated on disk under ``path`` (sum of st_blocks * 512, like ``du``)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def disk_bandwidth(directory: str, size_bytes: int = 1 << 30, block_bytes: int = 8 << 20) -> dict[str, float | str]:
    """Sequential write then read bandwidth (bytes/s) of the file system holding ``directory``,
    with O_DIRECT so neither measurement is served by the page cache. Falls back to buffered I/O
    plus fsync and a cache drop if O_DIRECT is refused (and says so in ``method``)."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, ".ebb-bench-bandwidth")
    buf = mmap.mmap(-1, block_bytes)  # page-aligned, as O_DIRECT requires
    buf.write(os.urandom(block_bytes))
    blocks = max(1, size_bytes // block_bytes)
    method = "O_DIRECT"
    try:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
        except OSError:
            method = "buffered+fsync"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        t0 = time.perf_counter()
        for b in range(blocks):
            os.pwrite(fd, buf, b * block_bytes)
        os.fsync(fd)
        write_s = time.perf_counter() - t0
        os.close(fd)
        if method != "O_DIRECT":
            drop_caches()
        try:
            fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if method == "O_DIRECT" else 0))
        except OSError:
            fd = os.open(path, os.O_RDONLY)
        t0 = time.perf_counter()
        for b in range(blocks):
            os.preadv(fd, [buf], b * block_bytes)
        read_s = time.perf_counter() - t0
        os.close(fd)
    finally:
        buf.close()
        if os.path.exists(path):
            os.remove(path)
    total = blocks * block_bytes
    return {"seq_write_Bps": total / write_s, "seq_read_Bps": total / read_s, "bytes": total, "method": method}
