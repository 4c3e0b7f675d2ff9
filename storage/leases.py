"""Leases: a read in another process pins the version it was planned on, for a bounded time.

A snapshot pins its version through LMDB's reader table, but only while its process holds the
read transaction and only on the writer's machine. A read that outlives the transaction that
planned it (a Spark action whose tasks run later in other processes) or that runs on a machine
that mounts only the data directory takes a lease instead: a small file in
``DATA/leases/`` naming the LMDB transaction id of its version. Garbage collection treats every
live lease as a reader of that version, so the run files and blocks it needs stay.

A lease lives ``seconds`` after it was last renewed (its file's mtime): the holder renews it as
it reads (``Lease.renew``, cheap: one ``utime``) and removes it when done. A holder that dies
stops renewing, and the writer's next garbage collection after the lease has expired removes
the file and reclaims the space it pinned: space comes back within ``seconds`` plus one update.
A lease found expired on renewal means its version may already be reclaimed: the read fails
saying so, never with another version's rows.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from dataclasses import dataclass

from .errors import ReadError

LEASE_DIR = "leases"  # under the data directory
DEFAULT_SECONDS = 600.0  # a read may go this long without renewing its lease
SUFFIX = ".lease"


def lease_dir(data_dir: str) -> str:
    return os.path.join(data_dir, LEASE_DIR)


@dataclass
class Lease:
    """A pin on version ``txn`` held through the file ``path``; picklable (a Spark partition
    carries it to executors, which renew it as they read)."""

    path: str
    txn: int
    seconds: float
    renewed: float = 0.0  # monotonic time of this process's last renewal (0: never here)

    def renew(self) -> None:
        """Extends the lease by ``seconds`` from now; at most every ``seconds / 8`` it touches
        the file. ReadError if the lease has expired and been removed."""
        now = time.monotonic()
        if now - self.renewed < self.seconds / 8:
            return
        try:
            os.utime(self.path)
        except FileNotFoundError:
            raise ReadError(
                f"the version this read was planned on (LMDB transaction {self.txn}) is no longer pinned: its "
                f"lease expired after {self.seconds:g} s without being renewed, so its space may be reclaimed; "
                "run the read again") from None
        self.renewed = now

    def __getstate__(self) -> dict:
        # ``renewed`` is this process's monotonic clock: meaningless on another host
        return {**self.__dict__, "renewed": 0.0}

    def release(self) -> None:
        """Ends the lease (the pinned space is reclaimed by the next update's garbage collection)."""
        try:
            os.remove(self.path)
        except FileNotFoundError:
            pass


def take(data_dir: str, txn: int, seconds: float = DEFAULT_SECONDS) -> Lease:
    """A new lease on version ``txn``. The caller must still hold its version (an open snapshot)
    when this returns, so that garbage collection cannot have reclaimed it in between."""
    if not seconds > 0:
        raise ValueError(f"a lease must last a positive number of seconds, got {seconds!r}")
    d = lease_dir(data_dir)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, f"{uuid.uuid4().hex}{SUFFIX}")
    body = json.dumps({"txn": txn, "seconds": seconds, "host": socket.gethostname(), "pid": os.getpid()})
    with open(path + ".tmp", "w") as f:
        f.write(body)
    os.replace(path + ".tmp", path)  # a lease is never seen half-written
    return Lease(path, txn, seconds, time.monotonic())


def oldest_pinned(data_dir: str, now: float | None = None) -> int | None:
    """The oldest version (txn id) that a live lease pins, or None. Removes expired leases (and
    unreadable ones older than a minute)."""
    d = lease_dir(data_dir)
    try:
        names = os.listdir(d)
    except FileNotFoundError:
        return None
    now = time.time() if now is None else now
    oldest = None
    for name in names:
        path = os.path.join(d, name)
        try:
            mtime = os.stat(path).st_mtime
        except OSError:
            continue
        if not name.endswith(SUFFIX):  # left by a holder that died while writing its lease
            if now - mtime > 60:
                _remove(path)
            continue
        try:
            with open(path) as f:
                lease = json.load(f)
            txn, seconds = int(lease["txn"]), float(lease["seconds"])
        except FileNotFoundError:
            continue
        except (OSError, ValueError, KeyError, TypeError):
            txn, seconds = None, 60.0  # unreadable: honoured as nothing, removed after a minute
        if now - mtime > seconds:
            _remove(path)
        elif txn is not None:
            oldest = txn if oldest is None else min(oldest, txn)
    return oldest


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
