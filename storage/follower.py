"""Following the newest committed version off the request path, for a process that serves reads.

A process that answers probes for a long time (``ebb serve``, a long-lived ``ArchiveReader``)
must not make the first probe after each update pay for the switch: parsing the new state,
mapping the new runs and building their point-probe run set (about a millisecond for a
1M-key Rebuild 2x2 archive), and letting go of the old version's maps (20 ms when done in
the probe). A ``VersionFollower`` keeps a *served* snapshot whose point probes are prepared,
and a thread that looks for a newer committed version every ``poll_s`` seconds: it opens and
prepares the new version's snapshot, then swaps it in. The snapshot it replaces stays open
until the next switch (at least one update later), so a probe that took it just before the swap
finishes on a version still pinned; then it is closed and its maps dropped by
``files.RELEASER``. Point probes that the served snapshot can answer without its LMDB
transaction (as of its own version) use it from any thread; everything else opens a snapshot
of its own as before.

Through the follower, reads never go back in time, and a point probe does not wait for a
commit's switch: the served snapshot answers while no snapshot of the archive it follows (in
``ebb serve``, no request) has read a newer update (``ReadState.newest_update_seq_read``). A
probe that arrives between a commit and the switch reads the version before the commit, as a
read that began just before it would; once a scan, a range or a probe of its own has read the
new version, probes do too (on snapshots of their own until the switch). A probe through the
follower trails the newest commit by at most one poll and one switch. Before the swap the
follower probes one key of the new version (``Snapshot.warm_point_probes``), so that the first
request's probe does not pay for a path the loader's commit pushed out of the CPU's caches.
"""

from __future__ import annotations

import logging
import threading

from .errors import EbbError
from .files import RELEASER
from .snapshot import Snapshot
from .timemodel import read_instant

POLL_SECONDS = 0.005
log = logging.getLogger("ebb.follower")


class VersionFollower:
    """A served snapshot of ``archive``'s newest version, kept prepared by a background thread."""

    def __init__(self, archive, poll_s: float = POLL_SECONDS):
        self._archive = archive
        self._poll_s = poll_s
        self._stop = threading.Event()
        self._served: Snapshot | None = None
        self._retired: Snapshot | None = None  # the one served before: probes may still hold it
        self._token = None
        self._switch()
        self._thread = threading.Thread(target=self._run, name="ebb-follow", daemon=True)
        self._thread.start()

    def snapshot_for_probe(self, as_of: int | None) -> Snapshot | None:
        """The served snapshot, if its prepared point probes answer a probe as of ``as_of``:
        None (its own version's time) or an instant before the next update could be due (a
        later one may belong to a version not yet served). None otherwise: open a snapshot."""
        snap = self._served
        if snap is None or not snap.prepared_for_probes:
            return None
        if snap.state.update_seq < self._archive.reads.newest_update_seq_read:
            return None  # a read here has seen a newer update: so must this one
        if as_of is not None and not snap.time <= read_instant(as_of) < snap.time + snap.config.delta:
            return None
        return snap

    def served_update_seq(self) -> int | None:
        """The update the follower has prepared and serves (None: none yet), even when a newer
        commit is not served yet: how far it trails is what ``ebb serve``'s health reports."""
        served = self._served
        return None if served is None else served.state.update_seq

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(5)
        for old in (self._served, self._retired):
            if old is not None:
                old.close()
        self._served = self._retired = None

    # -- the follower thread --------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.wait(self._poll_s):
            if self._archive.env is None:  # the archive was closed under us
                return
            try:
                if self._archive.newest_version() != self._token:
                    self._switch()
            except Exception as e:  # never stop following: serve nothing stale, try again next poll
                log.warning("ebb: could not prepare the newest version (%s); requests read it themselves", e)
                self._retire(None)
                self._token = None

    def _switch(self) -> None:
        """Prepares the newest version and serves it; retires the one it replaces."""
        snap = self._archive.snapshot(marks_read=False)  # no answer comes from it before the swap
        token = snap.version_token()
        try:
            snap.prepare_point_probes(read_metadata=True)
            snap.warm_point_probes()
        except (EbbError, OSError):
            pass  # left for a probe to report, in its own terms
        self._retire(snap)
        self._token = token

    def _retire(self, served: Snapshot | None) -> None:
        """Serves ``served`` (None: nothing, requests open their own snapshots); the one served
        until now is kept open until the next call, and the one before it is closed (its
        transaction ends, so its version may be reclaimed) and let go of off this thread."""
        gone = self._retired
        if gone is not None:  # before the swap: the probe that follows it has the GIL to itself
            gone.close()
            RELEASER.release([gone])
        self._retired = self._served
        self._served = served
        if served is not None:
            self._archive.reads.mark_read(served.state.update_seq)
