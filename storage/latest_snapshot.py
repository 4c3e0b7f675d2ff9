"""The newest version's prepared point probes, kept from one probe to the next while no version
commits: for a reader that does not follow versions (``follower``).

Opening a snapshot for each point probe (an LMDB read transaction, the version's state looked
up, the transaction ended) is about a third of a warm probe's cost. ``LatestSnapshot`` keeps the
last snapshot whose point probes were prepared, with its version's token
(``Snapshot.version_token``). While ``Archive.newest_version`` (one call, no transaction) still
returns that token, no version has committed since, so that snapshot's version is still the
newest, and a point probe as of it or later is answered from its prepared run set, which needs
no transaction (``Snapshot.prepared_for_probes``): the answer a fresh snapshot would give.

The kept snapshot is closed, so it pins nothing: an idle reader holds no version back from
garbage collection. The price is that a version committing while a probe is under way may let
garbage collection punch out blocks of the kept version under it (run files stay mapped, and a
deleted file's map stays valid, so nothing else changes). Punched pages read as zeros, which
fail their page sums, so such a probe fails rather than answering wrongly; ``ArchiveReader``
then asks a fresh snapshot (``outdated``). If no version committed meanwhile, the failure is
the data's and is raised.
"""

from __future__ import annotations

from .snapshot import Snapshot

MANY = object()  # ``for_probe``'s key for a probe of many keys


class LatestSnapshot:
    """The last prepared snapshot of ``archive``'s newest version, with its version's token."""

    def __init__(self, archive):
        self._archive = archive
        self._kept: tuple[object, Snapshot] | None = None  # one attribute: swapped atomically

    def keep(self, snap: Snapshot) -> None:
        """Keeps ``snap`` (still open: its token is read here; the caller closes it) if its point
        probes are prepared: a probe through it built its run set."""
        if snap.prepared_for_probes:
            self._kept = (snap.version_token(), snap)

    def for_probe(self, as_of: int | None, key=MANY) -> Snapshot | None:
        """The kept snapshot if no version has committed since it was kept and its prepared point
        probes answer ``key`` (``MANY``: a probe of many keys, whose types ``Snapshot.probe_many``
        checks) as of ``as_of`` (None: its own time; or any later instant); else None: open a
        snapshot."""
        kept = self._kept
        if kept is None:
            return None
        token, snap = kept
        if as_of is not None and as_of < snap.time:
            return None
        if not (snap.prepared_for_probes if key is MANY else snap.probes_natively(key)):
            return None
        if self._archive.newest_version() != token:
            self._kept = None
            return None
        return snap

    def outdated(self, snap: Snapshot) -> bool:
        """Whether a version has committed since ``snap`` was kept (so garbage collection may have
        reclaimed what a probe of it read): ask a fresh snapshot. Drops it if so."""
        kept = self._kept
        if kept is not None and kept[1] is snap and self._archive.newest_version() == kept[0]:
            return False
        self._kept = None
        return True

    def clear(self) -> None:
        self._kept = None
