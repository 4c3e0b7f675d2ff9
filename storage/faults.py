"""Fault injection for tests (LevelDB's fault_injection_test and FaultInjectionTestEnv, for ebb).

Crash points: ``crash_point(name)`` does nothing unless armed. With the environment variable
``EBB_CRASH_AT=name[:k]`` the k-th arrival (default the 1st) kills the process with SIGKILL, as
``kill -9`` would. In-process, ``arm(name, k)`` makes it raise ``SimulatedCrash`` instead; the
update code lets that exception through without cleaning up, as a real crash would.

``FaultInjectionFS`` replaces ``files.FS`` and remembers, for every data file, how much of it
has been fsync'd and whether its directory entry has been. ``drop_unsynced`` then does what a
power cut does to the page cache: files shrink to their synced length and files whose creation
was never made durable disappear.

``ReadFaults`` replaces ``files.READS`` (LevelDB's Env for reads): it fails the opens, ``fstat``s,
``pread``s or ``mmap``s of run files with an errno from the n-th call on, or makes every
``pread`` short.
"""

from __future__ import annotations

import errno
import os
import signal

from . import files

READ_CALLS = ("open", "fstat", "preadv", "mmap")

POINTS = (
    "update.validated",  # batch checked, nothing written yet
    "run.block_written",  # a block of a new run written, not yet fsync'd
    "update.runs_written",  # every new run durable, metadata not yet written
    "partitioned.results_in",  # every Spark task's run durable, the driver has their results
    "update.before_commit",  # metadata written in the transaction, not committed
    "update.after_commit",  # committed, replaced files not yet collected
    "gc.file_removed",  # one replaced file deleted or punched, garbage list not yet updated
    "publish.copied",  # a committed version's metadata copied for remote readers, not yet current
    "migrate.runs_written",  # a layout switch: any copied runs durable, metadata not yet written
    "migrate.before_commit",  # the switch written in the transaction, not committed
    "migrate.after_commit",  # the switch committed, replaced files not yet collected
)


class SimulatedCrash(BaseException):
    """Raised by an armed crash point in-process. A BaseException, so that no ``except
    Exception`` handler treats it as an ordinary error."""


_spec = os.environ.get("EBB_CRASH_AT", "")
_name, _, _nth = _spec.partition(":")
_remaining = int(_nth) if _nth else 1
_kill = bool(_name)


def arm(name: str | None, nth: int = 1) -> None:
    """Makes the ``nth`` arrival at crash point ``name`` raise SimulatedCrash (None disarms)."""
    global _name, _remaining, _kill
    _name, _remaining, _kill = (name or ""), nth, False


def crash_point(name: str) -> None:
    """Crashes here if armed for this point (see the module docstring)."""
    global _remaining
    if name != _name or not _name:
        return
    _remaining -= 1
    if _remaining == 0:
        if _kill:
            os.kill(os.getpid(), signal.SIGKILL)
        raise SimulatedCrash(name)


class FaultInjectionFS(files.FileSystem):
    """A FileSystem that can forget every write that was not made durable, and fill up: with
    ``space`` set, writes fail with ENOSPC once that many bytes were written in all."""

    def __init__(self, space: int | None = None):
        self.synced_size: dict[str, int] = {}
        self.unsynced_create: set[str] = set()
        self.space = space

    def create(self, path: str) -> files.WritableFile:
        f = _FillingFile(path, self) if self.space is not None else super().create(path)
        self.synced_size[path] = 0
        self.unsynced_create.add(path)
        return f

    def sync_files(self, paths: list[str]) -> None:
        super().sync_files(paths)
        for p in paths:
            self.synced_size[p] = os.path.getsize(p)

    def sync_dir(self, path: str) -> None:
        super().sync_dir(path)
        d = os.path.abspath(path)
        self.unsynced_create = {p for p in self.unsynced_create if os.path.dirname(os.path.abspath(p)) != d}

    def drop_unsynced(self) -> list[str]:
        """Undoes what a power cut would lose; returns what it did."""
        done = []
        for path, size in self.synced_size.items():
            if path in self.unsynced_create:
                if os.path.exists(path):
                    os.remove(path)
                    done.append(f"removed {os.path.basename(path)} (directory entry never synced)")
            elif os.path.exists(path) and os.path.getsize(path) > size:
                os.truncate(path, size)
                done.append(f"truncated {os.path.basename(path)} to its synced {size} bytes")
        self.synced_size.clear()
        self.unsynced_create.clear()
        return done


class _FillingFile(files.WritableFile):
    """A new file on a device with ``fs.space`` bytes left: a write beyond them stores what fits
    and fails with ENOSPC, as write(2) on a full file system does."""

    def __init__(self, path: str, fs: FaultInjectionFS):
        super().__init__(path)
        self._fs = fs

    def write(self, data) -> None:
        view = memoryview(data).cast("B")
        fits = min(len(view), self._fs.space)
        super().write(view[:fits])
        self._fs.space -= fits
        if fits < len(view):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.path)


class ReadFaults(files.ReadEnv):
    """A ReadEnv whose ``call`` (one of READ_CALLS) fails with ``errno`` from its ``nth`` use on
    (``errno`` None: every ``preadv`` returns at most ``short`` bytes, as a read interrupted by
    a signal may). ``calls`` counts the uses of each call."""

    def __init__(self, call: str, errno: int | None, nth: int = 1, short: int = 1):
        assert call in READ_CALLS and (errno is not None or call == "preadv")
        self.calls = dict.fromkeys(READ_CALLS, 0)
        self._errno, self._nth, self._short = errno, nth, short
        real = getattr(files.ReadEnv, call)

        def faulty(*args, **kw):
            self.calls[call] += 1
            if self.calls[call] < self._nth:
                return real(*args, **kw)
            if self._errno is not None:
                raise OSError(self._errno, os.strerror(self._errno))
            fd, bufs, offset = args
            return real(fd, [memoryview(bufs[0])[:self._short]], offset)

        for name in READ_CALLS:
            setattr(self, name, faulty if name == call else self._counted(name))

    def _counted(self, name: str):
        real = getattr(files.ReadEnv, name)

        def counted(*args, **kw):
            self.calls[name] += 1
            return real(*args, **kw)

        return counted
