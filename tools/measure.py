"""Measuring one operation: wall time, kernel I/O counters, peak anonymous memory, cold caches,
disk limits.

- Two ways to time: ``measure`` runs an operation inside the harness (garbage collected and
  allocators trimmed just before, a memory-sampling thread running beside), which costs about
  0.1 ms of its own in the timed span and evicts CPU caches: nothing next to an update or a scan
  (tens of milliseconds to seconds) or a cold probe (milliseconds of disk reads), but as much as a
  warm probe itself. ``measure_short`` is for such sub-millisecond, read-only operations: the
  time is of one plain ``time.perf_counter()`` around the call alone, and the I/O and memory
  come from a second run of the same call through ``measure``.

- I/O: ``/proc/self/io`` (``read_bytes``/``write_bytes``: what reached or came from the block
  layer, summed over every thread of the process, so background threads of RocksDB and DuckDB
  count; ``rchar``/``wchar``: bytes passed through read/write system calls).
- Peak anonymous memory of one operation: the largest ``RssAnon`` (``/proc/self/status``: the
  process's resident pages that are not file-backed, i.e. heap, Arrow buffers, numpy arrays,
  and not the page-cache pages of mapped files, which VmHWM counts) seen by a background
  thread sampling every ``ANON_SAMPLE_S`` while the operation runs, plus one sample at its start
  and end. The kernel keeps no high-water mark of anonymous memory alone, and this machine's
  memory cgroup (v1) reports a peak only of usage including the page cache, so sampling it is. A
  peak shorter than the sampling interval can be missed; allocations large enough to matter take
  longer than that to fault in. Before each operation (untimed) Python's garbage is collected, and
  Arrow's memory pool and glibc's heap (``malloc_trim``) return their free memory to the OS, so an
  operation is not charged for what an earlier one (a 5 GB bulk load, a scan) left cached in an
  allocator.
- Cold cache: ``sync`` then ``3 > /proc/sys/vm/drop_caches`` (root only). Callers must close every
  file and memory map of the store first (``open_handles`` lists any left): a mapped page stays
  resident and would make the "cold" measurement warm.
- Disk limits: sequential read and write bandwidth with ``O_DIRECT`` (page cache bypassed),
  measured in the directory the stores live in.
"""

from __future__ import annotations

import gc
import mmap
import os
import threading
import time
from dataclasses import dataclass, replace
from typing import Callable, TypeVar

from ..storage.iostats import proc_io  # the same counters ebb's update records use

T = TypeVar("T")
ANON_SAMPLE_S = 0.002


class AnonPeak:
    """Context manager: ``base`` is RssAnon (bytes) of process ``pid`` on entry, ``peak`` the
    largest value sampled until exit (0 for both where /proc/self/status is unavailable); ``rchar`` is what the
    sampling itself read, to be taken off the operation's ``rchar``."""

    def __init__(self, interval_s: float = ANON_SAMPLE_S, pid: int | str = "self"):
        self.interval_s, self.pid = interval_s, pid
        self.base = self.peak = self.rchar = 0
        self._stop = threading.Event()
        self._fd = -1
        self._thread: threading.Thread | None = None

    def _sample(self) -> int:
        if self._fd < 0:
            return 0
        status = os.pread(self._fd, 8192, 0)
        self.rchar += len(status)
        i = status.find(b"RssAnon:")
        return int(status[i + 8: status.index(b"kB", i)]) * 1024 if i >= 0 else 0

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak = max(self.peak, self._sample())

    def __enter__(self) -> "AnonPeak":
        try:
            self._fd = os.open(f"/proc/{self.pid}/status", os.O_RDONLY)
        except OSError:
            return self
        self.base = self.peak = self._sample()
        self._thread = threading.Thread(target=self._run, name="ebb-bench-anon", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._sample())
        os.close(self._fd)
        self._fd = -1


def release_unused_memory() -> None:
    """Collects Python's garbage and returns the free memory that allocators keep cached to the
    OS: Arrow's pool, and glibc's heap (numpy and Python allocate there, and glibc keeps the
    freed top of the heap and freed chunks below it until ``malloc_trim``)."""
    import pyarrow as pa

    gc.collect()
    pa.default_memory_pool().release_unused()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _glibc():
    """glibc, for ``malloc_trim``; None on other C libraries."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


_LIBC = _glibc()


@dataclass
class Sample:
    """What one operation cost."""

    wall_s: float
    os_read_bytes: int
    os_write_bytes: int
    os_rchar: int
    os_wchar: int
    peak_anon_bytes: int
    base_anon_bytes: int

    def as_row(self) -> dict[str, float | int]:
        return {
            "wall_s": round(self.wall_s, 6), "os_read_bytes": self.os_read_bytes, "os_write_bytes": self.os_write_bytes,
            "os_rchar": self.os_rchar, "os_wchar": self.os_wchar, "peak_anon_bytes": self.peak_anon_bytes,
            "base_anon_bytes": self.base_anon_bytes,
        }


def measure(fn: Callable[[], T]) -> tuple[T, Sample]:
    """Runs ``fn`` once and returns its result with the wall time, I/O and peak anonymous memory
    it took.

    The harness's own cost lands partly in the timed span: the garbage collection and allocator
    trim just before it leave the CPU caches cold, and the sampler thread wakes every
    ``ANON_SAMPLE_S`` to read /proc/self/status, beside the operation (on a 2-core machine it
    competes with it). That is about 0.08-0.1 ms per operation, which does not matter for what
    this is used on: updates and scans take tens of milliseconds (the quick workload) to seconds,
    and their peak memory is what needs the sampler. Time sub-millisecond reads with
    ``measure_short`` instead."""
    release_unused_memory()
    io0 = proc_io()
    with AnonPeak() as anon:
        t0 = time.perf_counter()
        out = fn()
        wall = time.perf_counter() - t0
    io1 = proc_io()
    return out, Sample(
        wall_s=wall,
        os_read_bytes=io1["read_bytes"] - io0["read_bytes"],
        os_write_bytes=io1["write_bytes"] - io0["write_bytes"],
        os_rchar=io1["rchar"] - io0["rchar"] - anon.rchar,
        os_wchar=io1["wchar"] - io0["wchar"],
        peak_anon_bytes=anon.peak,
        base_anon_bytes=anon.base,
    )


def timed(fn: Callable[[], T]) -> tuple[T, float]:
    """``fn()`` and its wall time in seconds, from ``time.perf_counter()`` around the call alone
    (no garbage collection before, no sampler beside)."""
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def measure_short(fn: Callable[[], T]) -> tuple[T, Sample]:
    """For a sub-millisecond, read-only operation (a warm probe): runs ``fn`` timed alone
    (``timed``), then once more through ``measure`` for the I/O and peak memory, which a read
    that changes nothing repeats alike (but for disk reads: the second run finds in the page
    cache what the first brought there, and a warm read should read nothing from disk). Returns the first run's result, and the second run's
    sample with the first run's wall time."""
    out, wall = timed(fn)
    _, s = measure(fn)
    return out, replace(s, wall_s=wall)


def open_handles(path: str) -> list[str]:
    """Files under ``path`` this process still holds open or mapped (from /proc/self/fd and
    /proc/self/maps); empty if none or if /proc is unavailable."""
    root = os.path.realpath(path) + os.sep
    held = set()
    try:
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            if target.startswith(root):
                held.add(target)
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(maxsplit=5)
                if len(parts) == 6 and parts[5].strip().startswith(root):
                    held.add(parts[5].strip())
    except OSError:
        return []
    return sorted(held)


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
