"""The archive's files: names, durable writes, and reads with the I/O each access pattern needs.

Writes of data files go through ``FS`` (a ``FileSystem``), so that tests can swap in
``faults.FaultInjectionFS``, which forgets every write not yet fsync'd when it simulates a crash.
Reads follow the access pattern. Keyed reads (probes, key ranges, and the native point probe)
use a memory map of the run file with read-ahead off (``MappedSource``, ``MADV_RANDOM``): they
decode a block in place and touch (on a cold cache, read) only the pages they use, each stretch
asked for in one ``MADV_WILLNEED`` request first. Whole blocks are read with ``preadv`` into
fresh buffers that decoded blocks then view without copying (``ReadSource``): scans, merges and
verification read large contiguous spans with read-ahead on (``POSIX_FADV_SEQUENTIAL``); a keyed
read that wants most or all of a block reads it so with read-ahead off (``POSIX_FADV_RANDOM``).
Both make their system calls (open, fstat, preadv, mmap) through ``READS`` (a ``ReadEnv``), which
tests swap for ``faults.ReadFaults`` to make them fail (EIO, short reads). A failed call is a
``DataIOError``; a file shorter than its descriptor says, a ``CorruptionError``.
"""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import fcntl
import functools
import mmap
import os
import re
import resource
import secrets
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Iterator

import pyarrow as pa

from .errors import CorruptionError, DataIOError, LockHeld
from .tuning import DROP_STEP_BYTES as DROP_STEP, MAP_RESIDENT_BYTES, OPEN_FILES_MAX, OPEN_FILES_MIN, RELEASE_DELAY_S

MARKER = "EBB"  # identifies an archive directory; holds the format version
LOCK = "LOCK"  # flock'd by the one process that may update the archive
INDEX_DIR = "index"  # the LMDB environment (commit metadata)
DATA_DIR = "data"  # run files

_RUN = re.compile(r"^I(\d{4})-(\d{8})-([0-9a-f]{8})\.run$")


def run_file_name(i: int, seq: int) -> str:
    """A new, unique run file name for sub-index i (0-based, shown as I{i+1}) written by
    update ``seq``. The random part keeps names of concurrent or retried writers apart."""
    return f"I{i + 1:04d}-{seq:08d}-{secrets.token_hex(4)}.run"


def parse_run_file(name: str) -> int | None:
    """The 0-based sub-index of a run file name, or None if ``name`` is not one."""
    m = _RUN.match(name)
    return int(m.group(1)) - 1 if m else None


# -- writing ------------------------------------------------------------------------------------
class WritableFile:
    """A new file written front to back (``FileSystem.sync_files`` makes it durable)."""

    def __init__(self, path: str):
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        self.size = 0

    def write(self, data) -> None:
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            done += os.write(self._fd, view[done:])
        self.size += done

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class FileSystem:
    """The data-file operations of updates, recovery and garbage collection."""

    def create(self, path: str) -> WritableFile:
        return WritableFile(path)

    def sync_files(self, paths: list[str]) -> None:
        """Makes the contents of ``paths`` durable, several at once (the device overlaps them)."""
        def sync(path: str) -> None:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

        if len(paths) <= 1:
            for p in paths:
                sync(p)
            return
        with ThreadPoolExecutor(min(len(paths), 8)) as pool:
            list(pool.map(sync, paths))

    def sync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def remove(self, path: str) -> None:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass

    def punch_hole(self, path: str, offset: int, length: int) -> None:
        """Frees the disk space of [offset, offset + length) (reads of it then return zeros);
        a no-op where the file system cannot."""
        if length <= 0 or _fallocate is None:
            return
        fd = os.open(path, os.O_WRONLY)
        try:
            _fallocate(fd, _PUNCH_HOLE | _KEEP_SIZE, ctypes.c_int64(offset), ctypes.c_int64(length))
        finally:
            os.close(fd)


_PUNCH_HOLE, _KEEP_SIZE = 0x02, 0x01
try:
    _fallocate = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True).fallocate
    _fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
except (OSError, AttributeError):
    _fallocate = None

FS = FileSystem()


# file systems on which LMDB's locking and memory map are unsafe (LMDB's documentation)
NETWORK_FS = frozenset({"nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "fuse.sshfs", "ceph", "glusterfs",
                        "fuse.glusterfs", "lustre", "gpfs", "beegfs", "afs", "fuse.s3fs"})


def filesystem_type(path: str) -> str | None:
    """The type of the file system holding ``path`` (or its nearest existing parent), from
    /proc/mounts; None where that cannot be told."""
    p = os.path.realpath(path)
    while not os.path.exists(p):
        p = os.path.dirname(p)
    try:
        with open("/proc/mounts") as f:
            mounts = [line.split()[1:3] for line in f]
    except OSError:
        return None
    best = None
    for mount, kind in mounts:
        mount = mount.replace("\\040", " ")
        if (p == mount or p.startswith(mount.rstrip("/") + "/")) and (best is None or len(mount) > len(best[0])):
            best = (mount, kind)
    return best[1] if best else None


def refuse_network_fs(path: str, why: str) -> None:
    """ArchiveError if ``path`` is on a network file system (checked where /proc/mounts tells)."""
    from .errors import ArchiveError

    kind = filesystem_type(path)
    if kind in NETWORK_FS:
        raise ArchiveError(f"{path} is on a {kind} file system; {why}")


def write_durably(path: str, data: bytes) -> None:
    """Writes a small file atomically (temporary name, fsync, rename, fsync of the directory)."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    FS.sync_dir(os.path.dirname(os.path.abspath(path)))


# -- reading ------------------------------------------------------------------------------------
class ReadEnv:
    """The system calls that read run files (LevelDB's Env, for reads). The attributes are the
    calls themselves, not wrappers, so a read pays no Python call for the indirection; tests
    replace ``READS`` with a ``faults.ReadFaults``."""

    open = staticmethod(os.open)
    fstat = staticmethod(os.fstat)
    preadv = staticmethod(os.preadv)
    mmap = mmap.mmap


READS = ReadEnv()


def read_failed(e: OSError, what: str) -> DataIOError:
    """The ebb error for a read of a run file that the operating system failed with ``e``."""
    return DataIOError(e.errno, f"{what}: the file cannot be read ({e.strerror or type(e).__name__})")


def read_exact(fd: int, offset: int, length: int, what: str) -> pa.Buffer:
    """``length`` bytes at ``offset`` in a fresh buffer; CorruptionError if the file is short,
    DataIOError if the read fails. A short read is not an error: the rest is asked for again."""
    buf = pa.allocate_buffer(length)
    view = memoryview(buf)
    done = 0
    while done < length:
        try:
            got = READS.preadv(fd, [view[done:]], offset + done)
        except OSError as e:
            raise read_failed(e, what) from None
        if got == 0:
            raise CorruptionError(f"{what}: file ends at byte {offset + done}, its descriptor needs {offset + length}")
        done += got
    return buf


class ReadSource:
    """Reads of one run file into fresh buffers (``pread``). Opened for sequential reads
    (scans, merges, verification) the kernel reads ahead; for probes read-ahead is off
    (POSIX_FADV_RANDOM), so a probe reads exactly its blocks. Whole-block reads go through
    here: a memory map faults pages one by one, which costs more than copying them; only keyed
    reads that touch a few pages of a block map it (``MappedSource``)."""

    def __init__(self, fd: int):
        self.fd = fd

    def read(self, offset: int, length: int, what: str) -> pa.Buffer:
        return read_exact(self.fd, offset, length, what)

    def close(self, _close=os.close) -> None:
        """Closes the file (once; later calls do nothing). ``os.close`` is bound early because
        at interpreter exit the ``os`` module may be gone before the last source is."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            _close(fd)

    # A source that ``OpenFiles`` let go of closes when its last reader drops it, so a read in
    # flight in another thread never sees its descriptor closed (or reused for another file).
    __del__ = close


class MappedSource:
    """A run file memory-mapped for keyed reads, with read-ahead off (MADV_RANDOM), so that a
    probe faults in (and on a cold cache reads) only the pages it touches. The map stays valid
    while any view of it lives, even after the file is deleted or the source dropped."""

    def __init__(self, fd: int, size: int):
        self.fd, self.size = -1, size  # owns ``fd`` only once mapped (the caller closes it on failure)
        self._mmap = READS.mmap(fd, size, prot=mmap.PROT_READ) if size else None
        if self._mmap is not None:
            self._mmap.madvise(mmap.MADV_RANDOM)
        self._map: pa.Buffer | None = None  # made on the first ``view``: most maps are only read natively
        self.mapped_in = False  # its resident pages were mapped in (RELEASER)
        self.fd = fd

    close = ReadSource.close  # the map itself lives on while views of it do
    __del__ = ReadSource.close

    def view(self, offset: int, length: int, what: str) -> pa.Buffer:
        """Bytes [offset, offset + length) of the file, zero-copy; CorruptionError if the file
        is shorter (checked against the file as it is now: touching a page past its end would
        kill the process), DataIOError if that cannot be told."""
        try:
            size = READS.fstat(self.fd).st_size
        except OSError as e:
            raise read_failed(e, what) from None
        if offset + length > min(self.size, size):
            raise CorruptionError(f"{what}: file ends before byte {offset + length}, its descriptor needs it")
        if self._map is None:
            self._map = pa.py_buffer(self._mmap if self._mmap is not None else b"")
        return self._map.slice(offset, length)

    def read(self, offset: int, length: int, what: str) -> pa.Buffer:
        """``read_exact`` of the mapped file, into a fresh buffer (for bytes kept apart from the
        map, such as the key filters a probe checks without a size check of the file)."""
        return read_exact(self.fd, offset, length, what)

    def native(self) -> tuple[mmap.mmap | None, int]:
        """The map (None for an empty file) and the descriptor, for native code that reads the
        map directly and checks the file's size itself (``point_probe``)."""
        return self._mmap, self.fd

    def prefetch(self, offset: int, length: int) -> None:
        """Starts reading file bytes [offset, offset + length) into the page cache in one
        request (MADV_WILLNEED), so that touching them does not fault page by page."""
        start = offset - offset % mmap.PAGESIZE
        if self._mmap is not None and 0 <= start < self.size:
            self._mmap.madvise(mmap.MADV_WILLNEED, start, min(offset + length, self.size) - start)

    def map_resident(self) -> int:
        """Maps into the process the file's pages that are in the page cache, reading nothing
        (``_point_probe.map_resident``): a probe that touches them later takes no page fault.
        The pages mapped; 0 without the native module, -1 if the kernel cannot (before 5.14)."""
        from .point_probe import _point_probe  # the native module, loaded (or turned off) there

        if self._mmap is None or _point_probe is None:
            return 0
        return _point_probe.map_resident(self._mmap)

    def drop_pages(self) -> None:
        """Unmaps this map's pages from the process, DROP_STEP bytes at a time (MADV_DONTNEED;
        the file's pages stay in the page cache, and a read that still uses the map faults
        them back). Unmapping a large map whose pages probes have touched holds the process's
        memory-map lock for tens of milliseconds, and every page fault of every other thread
        waits for it; dropping the pages first, in small steps, leaves munmap nothing to do."""
        m = self._mmap
        for off in range(0, self.size if m is not None else 0, DROP_STEP):
            m.madvise(mmap.MADV_DONTNEED, off, min(DROP_STEP, self.size - off))


class _Releaser:
    """One background thread per process that keeps a reader's maps, off the request path. It
    lets go of what a replaced version held (maps of runs it no longer reads, the point-probe
    run set), so a reader that switches versions never pays for unmapping the old one
    (``MappedSource.drop_pages``). And it maps in the resident pages of every run newly mapped
    (``MappedSource.map_resident``, up to MAP_RESIDENT_BYTES of runs a process), so that the
    probes after a commit do not fault in, one page at a time, pages the cache holds already.

    The process waits for it at exit (``atexit``): freeing a map releases the GIL around munmap,
    and a daemon thread that wants the GIL back once the interpreter is finalizing is ended by
    pthread_exit inside Arrow's C++ buffer destructor, which aborts the process ("terminate called
    without an active exception", exit status -6).

    It waits ``RELEASE_DELAY_S`` before dropping what it was handed: the version switch that hands
    it over happens inside a request (the first probe of a new version), and dropping pages takes
    the process's memory-map lock and the GIL, both of which that request needs to map the new
    runs. ``idle`` cuts the wait short."""

    def __init__(self):
        self._queue: list = []
        self._new_maps: list[MappedSource] = []
        # bytes of the runs whose resident pages were mapped in and not handed back (an upper bound:
        # a map OpenFiles evicts beyond its limit is freed without coming here)
        self._mapped_in = 0
        self._can_map_in = True  # False once the kernel said it cannot
        self._busy = False  # items taken off the queue and not yet dropped
        self._hurry = 0  # callers of ``idle`` waiting: no delay
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        atexit.register(self.idle)

    def release(self, items: list) -> None:
        """Drops ``items`` (MappedSources have their pages dropped first) in the background."""
        if not items:
            return
        with self._cv:
            self._queue.append(items)
            self._wake()

    def map_in(self, source: MappedSource) -> None:
        """Maps ``source``'s resident pages in the background, after the delay."""
        with self._cv:
            self._new_maps.append(source)
            self._wake()

    def _wake(self) -> None:
        """Starts the thread if it is not running, and tells it there is work (``_cv`` held)."""
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="ebb-release", daemon=True)
            self._thread.start()
        self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._new_maps:
                    self._cv.wait()
                self._cv.wait_for(lambda: self._hurry, RELEASE_DELAY_S)
                # all that came during the wait: versions may switch faster than once a delay
                items, self._queue, self._busy = [x for handed in self._queue for x in handed], [], True
                new, self._new_maps = self._new_maps, []
            gone = set()
            for item in items:
                if isinstance(item, MappedSource):
                    gone.add(id(item))
                    if item.mapped_in:
                        self._mapped_in -= item.size
                    try:
                        item.drop_pages()
                    except (OSError, ValueError):
                        pass  # a map already gone: nothing to drop
            for source in new:
                if not self._can_map_in or id(source) in gone or self._mapped_in + source.size > MAP_RESIDENT_BYTES:
                    continue
                try:
                    self._can_map_in = source.map_resident() >= 0
                except (OSError, ValueError, BufferError):
                    continue  # a map already gone
                source.mapped_in = self._can_map_in
                self._mapped_in += source.size if self._can_map_in else 0
            items = new = item = source = None  # the last references go here, not in a reader's thread
            with self._cv:
                self._busy = False

    def idle(self, timeout: float = 10.0) -> bool:
        """Waits until everything handed over has been released (for tests)."""
        deadline = time.monotonic() + timeout
        with self._cv:
            self._hurry += 1
            self._cv.notify_all()
        try:
            while time.monotonic() < deadline:
                with self._cv:
                    if not self._queue and not self._new_maps and not self._busy:
                        return True
                time.sleep(0.001)
            return False
        finally:
            with self._cv:
                self._hurry -= 1


RELEASER = _Releaser()


@functools.cache
def open_files_limit() -> int:
    """How many run files a process keeps open: half its soft descriptor limit, first raised
    toward the hard limit (no privilege needed; once per process), between OPEN_FILES_MIN and
    OPEN_FILES_MAX. Where the hard limit allows no more, 512 as before."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 2 * OPEN_FILES_MAX
    if soft != resource.RLIM_INFINITY and soft < want:
        target = want if hard == resource.RLIM_INFINITY else min(hard, want)
        if target > soft:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
                soft = target
            except (ValueError, OSError):  # a sandbox that forbids it: keep what there is
                pass
    half = OPEN_FILES_MAX if soft == resource.RLIM_INFINITY else soft // 2
    return max(OPEN_FILES_MIN, min(OPEN_FILES_MAX, half))


class OpenFiles:
    """Open run files, kept and reused (a run file's live blocks never change once written, and
    names are never reused). At most ``limit`` stay open (``open_files_limit``), and ``retain``
    lets go of the runs a new version replaced, so that a long-running process does not keep
    deleted files (and their disk space) alive. A file let go of closes once no read in flight
    uses it."""

    def __init__(self, data_dir: str, limit: int | None = None):
        self.data_dir = data_dir
        self.limit = open_files_limit() if limit is None else limit
        self._open: OrderedDict[tuple[str, str], ReadSource | MappedSource] = OrderedDict()
        self._lock = threading.Lock()  # the Flight server reads in threads

    def source(self, name: str, sequential: bool) -> ReadSource:
        """Run file ``name`` for ``pread``s, advised for sequential reads or for probes."""
        return self._get(name, "seq" if sequential else "random")

    def mapped(self, name: str) -> MappedSource:
        """Run file ``name`` memory-mapped for keyed reads."""
        return self._get(name, "map")

    def warm(self, name: str) -> None:
        """Maps run ``name`` ahead of the keyed reads that will want it (an update just wrote
        it). Never raises: it runs after the update committed, and a failure is left for a read
        to report."""
        try:
            self.mapped(name)
        except (OSError, CorruptionError):
            pass

    def retain(self, names: set[str], also: tuple = ()) -> None:
        """Lets go of every open run not in ``names`` (the runs of the current version), and of
        ``also`` (what held the old version's maps), in the background (``RELEASER``)."""
        with self._lock:
            dropped = [self._open.pop(k) for k in [k for k in self._open if k[0] not in names]]
        RELEASER.release(dropped + [x for x in also if x is not None])

    def _get(self, name: str, how: str):
        key = (name, how)
        with self._lock:
            src = self._open.get(key)
            if src is not None:
                self._open.move_to_end(key)
                return src
        try:
            fd = READS.open(os.path.join(self.data_dir, name), os.O_RDONLY)
        except FileNotFoundError:
            raise CorruptionError(f"data file {name} is missing") from None
        except OSError as e:
            raise read_failed(e, f"data file {name}") from None
        try:
            if how == "map":
                src = MappedSource(fd, READS.fstat(fd).st_size)
            else:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL if how == "seq" else os.POSIX_FADV_RANDOM)
                src = ReadSource(fd)
        except OSError as e:
            os.close(fd)
            raise read_failed(e, f"data file {name}") from None
        except BaseException:
            os.close(fd)
            raise
        with self._lock:
            self._open[key] = src
            while len(self._open) > self.limit:
                self._open.popitem(last=False)
        if how == "map":
            RELEASER.map_in(src)
        return src

    def close(self) -> None:
        """Closes every file held, at once (the archive is being closed)."""
        with self._lock:
            for src in self._open.values():
                src.close()
            self._open.clear()


# -- locks --------------------------------------------------------------------------------------
@contextmanager
def exclusive_lock(path: str, wait_s: float = 0.0) -> Iterator[None]:
    """Holds flock(LOCK_EX) on ``path`` (created if needed); raises LockHeld if another process
    still holds it after ``wait_s`` seconds (at once by default). The kernel drops the lock when
    the process dies, so a crash never leaves it held."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + wait_s
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LockHeld(path) from None
                time.sleep(0.02)  # polled: a blocking flock could not honour the deadline
        yield
    finally:
        os.close(fd)
