"""The newest version's prepared point probes, kept from one probe to the next while no version
commits: for a reader that does not follow versions (``follower``).

Opening a snapshot for each point probe (an LMDB read transaction, the version's state looked
up, the transaction ended) is about a third of a warm probe's cost. ``LatestSnapshot`` keeps the
last snapshot whose point probes were prepared, with its version's token
(``Snapshot.version_token``). While ``Archive.newest_version`` (one call, no transaction) still
returns that token, no version has committed since, so that snapshot's version is still the
newest, and a point probe as of it or later is answered from its prepared run set, which needs
no transaction (``Snapshot.prepared_probe``): the answer a fresh snapshot would give, in one
native call with no Python layer between (a warm probe is about 20 µs, so each layer counts).

The kept snapshot is closed, so it pins nothing: an idle reader holds no version back from
garbage collection. The price is that a version committing while a probe is under way may let
garbage collection punch out blocks of the kept version under it (run files stay mapped, and a
deleted file's map stays valid, so nothing else changes). Punched pages read as zeros, which
fail their page sums, so such a probe fails rather than answering wrongly, and returns None
(``outdated``): the reader asks a fresh snapshot. If no version committed meanwhile, the failure is
the data's and is raised.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import pyarrow as pa

from .errors import CorruptionError, DataIOError, VersionReclaimed
from .point_probe import PreparedProbe
from .point_probe import probe as point_probe
from .snapshot import Snapshot
from .timemodel import MAX_TIME, read_instant

Answer = tuple[pa.Table, list[tuple[int, int, int]]]  # a probe's table, and (sub-index, blocks, bytes) searched


class _Kept(NamedTuple):
    token: object  # ``Snapshot.version_token`` of the kept version
    snap: Snapshot  # closed: answers only through its prepared run set
    probes: PreparedProbe


class LatestSnapshot:
    """The last prepared snapshot of ``archive``'s newest version, with its version's token."""

    def __init__(self, archive):
        self._archive = archive
        self._kept: _Kept | None = None  # one attribute: swapped atomically

    def keep(self, snap: Snapshot) -> None:
        """Keeps ``snap`` (still open: its token is read here; the caller closes it) if its point
        probes are prepared: a probe through it built its run set."""
        probes = snap.prepared_probe()
        if probes is not None:
            self._kept = _Kept(snap.version_token(), snap, probes)

    def probe(self, key, as_of: int | None) -> Answer | None:
        """``Snapshot.probe`` of ``key`` as of ``as_of`` (None: the kept version's time; or any
        later instant) by the kept snapshot, if it answers it natively and no version has
        committed since it was kept; else None: open a snapshot. Called for every point probe,
        so it goes straight to the native probe of the kept run set."""
        kept = self._kept
        if kept is None:
            return None
        probes = kept.probes
        if as_of is None:
            t = probes.time
        else:  # an earlier instant is another version's: ``Snapshot``'s to read
            t = as_of if type(as_of) is int and as_of <= MAX_TIME else read_instant(as_of)
            if t < probes.time:
                return None
        if not probes.accepts(key):
            return None
        return self._answered(kept, point_probe, probes.runs, key, t, probes.schema, probes.what)

    def probe_many(self, keys, as_of: int | None) -> Answer | None:
        """``Snapshot.probe_many`` of ``keys`` by the kept snapshot, on the same terms as ``probe``
        (the key types are checked by ``Snapshot.probe_many``)."""
        kept = self._kept
        if kept is None or as_of is not None and read_instant(as_of) < kept.probes.time:
            return None
        return self._answered(kept, kept.snap.probe_many, keys, as_of)

    def _answered(self, kept: _Kept, call: Callable[..., Answer], *args) -> Answer | None:
        """``call(*args)`` if no version has committed since ``kept`` was kept; None if one has,
        before the call or while it read blocks that garbage collection may then have reclaimed
        under it (they fail their page sums): ask a fresh snapshot."""
        if self._archive.newest_version() != kept.token:
            self._kept = None
            return None
        try:
            return call(*args)
        except (CorruptionError, DataIOError, VersionReclaimed):
            if not self.outdated(kept):
                raise  # the data's own damage or read error
            return None

    def outdated(self, kept: _Kept) -> bool:
        """Whether a version has committed since ``kept`` was kept. Drops it if so."""
        if self._kept is kept and self._archive.newest_version() == kept.token:
            return False
        self._kept = None
        return True

    def clear(self) -> None:
        self._kept = None
