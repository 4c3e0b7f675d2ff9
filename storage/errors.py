"""ebb's one error hierarchy, and the exit code of each error in one place.

Every failure a user can cause or meet is an ``EbbError``. The CLI prints ``ebb: error: <message>``
(one line) and exits with ``exit_code``; library callers catch the class they care about. The
messages are written for the user: they say what is wrong and what to do, never a traceback.

This module imports nothing, so the CLI can map errors to exit codes without loading pyarrow.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_ERROR = 1  # the archive or its environment failed (I/O, missing file, damage found while reading)
EXIT_USAGE = 2  # bad arguments, configuration or job file
EXIT_REJECTED = 3  # the input was rejected whole; nothing was changed
EXIT_BUSY = 4  # another process holds the lock
EXIT_VERIFY = 5  # ``ebb verify`` found problems
EXIT_CORRUPT = 6  # a checksum failed: the archive's files are damaged


class EbbError(Exception):
    """Base of every error ebb raises on purpose."""

    exit_code = EXIT_ERROR


class UsageError(EbbError):
    """A bad argument or setting, found before anything was changed."""

    exit_code = EXIT_USAGE


class ConfigError(UsageError):
    """An archive configuration that cannot make a working archive."""


class ArchiveError(EbbError):
    """A problem with the archive itself: missing, of another format, or in an unusable state."""


class FormatVersionError(ArchiveError):
    """The archive was written in an on-disk format this ebb does not read."""


class ArchiveBusy(ArchiveError):
    """Another process holds the archive's writer (or scheduler) lock."""

    exit_code = EXIT_BUSY


class LockHeld(ArchiveBusy):
    """Another process holds an exclusive lock file (``files.exclusive_lock``; the message is the
    lock file's path). ``Archive.writer_lock`` turns it into an ArchiveBusy that says what to do."""


class RejectedBatch(EbbError, ValueError):
    """The batch or the update time violates the bad-input policy (docs/spec.md section 5);
    the archive was not changed."""

    exit_code = EXIT_REJECTED


class SchemaError(RejectedBatch):
    """The batch's schema cannot be stored or does not match the archive's."""


class ReadError(EbbError, ValueError):
    """A read that cannot be answered as asked (for example ``as_of`` before the last update)."""

    exit_code = EXIT_USAGE


class VersionReclaimed(ReadError):
    """The version a long read started on was reclaimed under it; running the read again reads
    the newest version. Names the archive, not its path: servers pass it on to clients."""


class DataIOError(EbbError, OSError):
    """The operating system failed a read of a data file (EIO and the like): the file may be
    intact, and nothing was returned from the failed read. An OSError too, so that code
    handling failed reads of files keeps doing so."""

    def __str__(self) -> str:
        return self.strerror  # the message alone, without OSError's "[Errno 5]"


class CorruptionError(EbbError):
    """Stored bytes fail their checksum or are malformed. Nothing was returned from them."""

    exit_code = EXIT_CORRUPT


class VerifyFailed(EbbError):
    """``ebb verify`` found problems (listed in the message)."""

    exit_code = EXIT_VERIFY
