"""The archive: create or open one, load updates into it, and ask what it holds.

This is the storage layer's public entry point. ``Archive.create`` fixes the configuration
(``ebb init``); ``load`` applies one periodic update atomically (``ebb load``) through
``write_sequence``, the one way every writer changes an archive; ``plan`` and ``stats``
describe it; ``snapshot`` gives a consistent read view whose ``plan`` and ``read`` every reader
uses. ``Archive(path)`` opens for writing; ``Archive(path, readonly=True)`` for
reading only, which never waits for an update in another process.
"""

from __future__ import annotations

import json
import os
import threading
from contextlib import contextmanager
from dataclasses import asdict
from typing import Callable, Iterator

import lmdb
import pyarrow as pa

from . import files, leases, lmdb_env, page_walk, point_probe, published
from .config import ArchiveConfig, check_config
from .errors import (
    ArchiveBusy, ArchiveError, CorruptionError, FormatVersionError, RejectedBatch, UsageError, VersionReclaimed,
)
from .files import DATA_DIR, INDEX_DIR, LOCK, MARKER, LockHeld, OpenFiles, exclusive_lock, write_durably
from .layout import compress_slots
from .manifest import (
    FORMAT_VERSION, ArchiveState, SubIndexState, read_checkpoint, read_migrations, read_state, read_update_records,
    seal_root, write_config, write_state,
)
from .metadata_cache import MetadataCache
from .read_state import ReadState
from .schema import SchemaHistory
from .snapshot import Snapshot

__all__ = ["Archive", "ArchiveError", "ArchiveBusy", "PublishedArchive", "open_readonly"]

MAX_PLANNED_UPDATES = 100_000  # ``Archive.plan``: a bound on one answer's size and time


class Archive:
    """An open archive. Not thread-safe for writing; any number of snapshots may be open."""

    def __init__(self, path: str, readonly: bool = False):
        self.path = os.path.abspath(path)
        marker = os.path.join(self.path, MARKER)
        if not os.path.isfile(marker):
            raise ArchiveError(f"{path} is not an ebb archive (no {MARKER} file); create one with `ebb init`")
        try:
            with open(marker) as f:
                meta = json.load(f)
            fmt, data_dir = meta.get("format"), meta.get("data")
        except (OSError, ValueError, AttributeError):
            raise ArchiveError(f"{path}: its {MARKER} marker file is unreadable") from None
        if fmt != FORMAT_VERSION:
            raise FormatVersionError(
                f"{path} is in on-disk format version {fmt}; this ebb reads only format version {FORMAT_VERSION} "
                "(no converter: reload the data into a new archive)")
        # the run files: beside the metadata, or (``create(data_dir=...)``) on a file system that
        # Spark executors also mount
        self.data_dir = data_dir or os.path.join(self.path, DATA_DIR)
        # run files on their own (shared) file system: every commit is published there for
        # readers on machines that mount only that (``published``)
        self.publishes = data_dir is not None
        # disk bytes the last reclaim in this process gave back (``write_sequence.reclaim``): ebb run's metrics
        self.reclaimed_bytes = 0
        self.env = lmdb_env.acquire(os.path.join(self.path, INDEX_DIR), readonly=readonly)
        self.readonly = bool(self.env.flags()["readonly"])
        try:  # made at open, not by the first probe: it may map the file (``page_walk``)
            self._newest_txnid: Callable[[], int] | None = page_walk.newest_txnid_reader(
                os.path.join(self.env.path(), "data.mdb"), self.env.info)
        except BaseException:
            lmdb_env.release(self.env)
            raise
        self._init_reads()

    def _init_reads(self) -> None:
        """What reads keep across snapshots (``data_dir`` and ``env`` set: ``read_state``); then
        parses the configuration once."""
        self.reads = ReadState(self.data_dir)
        with self.env.begin() as txn:
            self.reads.config(txn)

    @property
    def open_files(self) -> OpenFiles:
        """The run files this process holds open or mapped (shared by readers and updates)."""
        return self.reads.open_files

    @property
    def metadata(self) -> MetadataCache:
        """Parsed run descriptors and page sums, within a byte budget."""
        return self.reads.metadata

    # -- lifecycle ------------------------------------------------------------------------------
    @staticmethod
    def create(path: str, config: ArchiveConfig, allow_existing: frozenset[str] | set[str] = frozenset(),
               data_dir: str | None = None) -> "Archive":
        """Creates an empty archive at ``path``, which must not exist, hold only files named in
        ``allow_existing`` (e.g. a scheduler's lock file), or be a creation that crashed before
        it finished (no marker yet), which is started over. ``data_dir``: where the run files go
        (default ``path/data``), e.g. a shared file system that Spark executors mount; it must
        be empty. The metadata (LMDB) always stays in ``path``, which must be a local disk."""
        config = check_config(config)
        if os.path.exists(os.path.join(path, MARKER)):
            raise ArchiveError(f"{path} is already an ebb archive")
        files.refuse_network_fs(path, "the archive's metadata (LMDB) must be on a local disk")
        if data_dir is not None:
            data_dir = os.path.abspath(data_dir)
            if os.path.isdir(data_dir) and os.listdir(data_dir):
                raise ArchiveError(f"the data directory {data_dir} is not empty")
            os.makedirs(data_dir, exist_ok=True)
        leftovers = set(os.listdir(path)) - set(allow_existing) if os.path.isdir(path) else set()
        if leftovers - {INDEX_DIR, DATA_DIR, LOCK, MARKER + ".tmp"}:
            raise ArchiveError(f"{path} already exists and is not empty")
        for d in (INDEX_DIR, DATA_DIR):  # an earlier creation that crashed left these: start over
            full = os.path.join(path, d)
            if os.path.isdir(full):
                for name in os.listdir(full):
                    os.remove(os.path.join(full, name))
        os.makedirs(os.path.join(path, DATA_DIR) if data_dir is None else path, exist_ok=True)
        env = lmdb_env.acquire(os.path.join(path, INDEX_DIR), create=True)
        try:
            with env.begin(write=True) as txn:
                write_config(txn, config)
                write_state(txn, ArchiveState(subindices=[SubIndexState() for _ in range(config.n)]))
                seal_root(txn)
        finally:
            lmdb_env.release(env)
        open(os.path.join(path, LOCK), "a").close()
        files.FS.sync_dir(path)
        # the archive exists once the marker is in place (written, fsync'd, renamed, dir fsync'd)
        meta = {"format": FORMAT_VERSION} if data_dir is None else {"format": FORMAT_VERSION, "data": data_dir}
        write_durably(os.path.join(path, MARKER), json.dumps(meta).encode())
        archive = Archive(path)
        if archive.publishes:  # servers on other machines can open it before the first update
            from . import write_sequence

            write_sequence.reclaim(archive)
        return archive

    def close(self) -> None:
        """Lets go of everything the archive holds: its metadata environment, its open run files
        and, once the background release has dropped them, the maps of versions it replaced."""
        if self.env is not None:
            self.reads.close()
            lmdb_env.release(self.env)
            self.env = None
            self._newest_txnid = None
            files.RELEASER.idle()  # a closed archive maps nothing (a cold measurement checks)

    def __enter__(self) -> "Archive":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @contextmanager
    def writer_lock(self, wait_s: float = 0.0) -> Iterator[None]:
        """Exclusive right to update. If another process holds it, waits up to ``wait_s``
        seconds for it, then fails with ArchiveBusy (at once by default)."""
        if self.readonly:
            raise ArchiveError(f"{self.path} is open read-only in this process (a reader opened it first); "
                               "a process that writes must open it for writing before any read-only reader")
        try:
            with exclusive_lock(os.path.join(self.path, LOCK), wait_s):
                yield
        except LockHeld:
            waited = f" (waited {wait_s:g} s)" if wait_s else ""
            raise ArchiveBusy(f"another process is updating {self.path}{waited}; try again when it finishes") from None

    # -- writing --------------------------------------------------------------------------------
    def load(self, table: pa.Table, at: int, progress: Callable[[str], None] | None = None,
             checkpoint: dict[str, bytes] | None = None, late_rows: int = 0, wait_s: float = 0.0) -> dict:
        """Applies one periodic update at time ``at`` (docs/spec.md section 2) and returns its
        record. Raises RejectedBatch (archive unchanged) for bad input. ``checkpoint`` (name ->
        bytes) and ``late_rows`` commit atomically with the update. ``wait_s``: how long to wait
        for another writer (an update, or a migration) to finish."""
        from . import write_sequence
        from .update import Update

        return write_sequence.run(self, Update(table, at, progress, checkpoint, late_rows), wait_s)

    @contextmanager
    def metadata_errors(self) -> Iterator[None]:
        """LMDB's own reports of a damaged metadata file, as a CorruptionError naming the archive."""
        try:
            yield
        except lmdb.Error as e:
            raise CorruptionError(f"{self.path}: the archive's metadata is damaged (LMDB: {e})") from None

    def load_parquet(self, path: str, at: int, progress: Callable[[str], None] | None = None) -> dict:
        """``load`` with the records of a Parquet file."""
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except (OSError, pa.ArrowInvalid) as e:
            raise RejectedBatch(f"cannot read {path} as Parquet: {e}") from None
        return self.load(table, at, progress)

    def recover(self) -> list[str]:
        """Runs crash recovery and garbage collection now (normally done by each update)."""
        from . import write_sequence
        from .recovery import recover

        with self.writer_lock(), self.metadata_errors():
            return recover(self.env, self.data_dir) + write_sequence.reclaim(self)

    # -- reading --------------------------------------------------------------------------------
    @property
    def config(self) -> ArchiveConfig:
        """The configuration of the last committed version. ``migrate`` may change its layout
        while the archive is open, so code that also reads the state reads both in one
        transaction (``reads.config``); after ``close``, the last one seen."""
        if self.env is None:
            return self.reads.last_config
        with self.env.begin() as txn:
            return self.reads.config(txn)

    def checkpoint(self, name: str) -> bytes | None:
        """The ``checkpoint[name]`` committed with the last update that set it, or None."""
        with self.env.begin() as txn:
            return read_checkpoint(txn, name)

    def snapshot(self, *, marks_read: bool = True) -> Snapshot:
        """A snapshot of the newest committed version (``Snapshot``; ``marks_read``: see there)."""
        return Snapshot(self, marks_read=marks_read)

    def newest_version(self) -> int:
        """Changes whenever a version commits (the newest LMDB transaction id): cheap to poll
        (``page_walk.newest_txnid_reader``)."""
        if self._newest_txnid is None:
            raise ArchiveError(f"{self.path}: the archive is closed")
        return self._newest_txnid()

    def state(self) -> ArchiveState:
        with self.env.begin() as txn:
            return read_state(txn)

    def _version(self) -> tuple[ArchiveConfig, ArchiveState]:
        """The configuration and state of the last committed version, read together."""
        with self.env.begin() as txn:
            return self.reads.config(txn), read_state(txn)

    def migrations(self) -> list[dict]:
        """The log of layout changes (``migrate``), oldest first."""
        with self.env.begin() as txn:
            return read_migrations(txn)

    @property
    def schema(self) -> pa.Schema | None:
        """The archive schema of the last committed version (None before the first load)."""
        history = self.schema_history
        return None if history is None else history.schema

    @property
    def schema_history(self) -> SchemaHistory | None:
        """The archive schema and every version it had (a load may add columns)."""
        env = self.env
        with env.begin() as txn:
            stored = self.reads.schema(env, txn)
        return None if stored is None else stored.history

    def held_bytes(self) -> int:
        """Disk bytes of replaced runs and run prefixes not reclaimed yet, because a version that
        may still be read (a reader's, a lease's, a published or kept one) references them."""
        from .recovery import held_bytes

        return held_bytes(self.env, self.data_dir)

    def updates(self, last: int | None = None) -> list[dict]:
        with self.env.begin() as txn:
            return read_update_records(txn, last)

    def plan(self, updates: int = 1) -> list[dict]:
        """Which sub-indices (1-based) each of the next ``updates`` updates inserts into and
        deletes from (docs/spec.md section 3). UsageError beyond ``MAX_PLANNED_UPDATES``: the
        answer is built whole, and a layout's pattern repeats far sooner."""
        return _plan(*self._version(), updates)

    def outlook(self, updates: int = 4) -> dict:
        """What the archive holds and what comes next, read from one committed version: the
        sub-index ``grid`` (G rows of insertion partitions by E columns of expiration partitions;
        one row of n for a wave index) with each cell's records and bytes, the ``expiry_timeline``
        (per coming update, the stored records and bytes that expire at it, and the bytes of
        draining runs it drops) and the ``next_updates`` (``plan(updates)``).

        A NoRebuild run is sectioned by expiration slot, so its bytes per update are exact; a
        Rebuild run's block knows only its exp range, so its bytes are spread evenly over the
        updates of that range: then ``estimated`` is true. Updates that expire nothing are left out."""
        with self.snapshot() as snap:
            return _outlook(snap, updates)

    def stats(self, update_log: int | None = None, next_updates: int = 0) -> dict:
        """Configuration, state, per-sub-index sizes and slot ranges, and the update log (the
        last ``update_log`` records, all by default). With ``next_updates``, also ``outlook``'s
        keys, computed from the same version."""
        with self.snapshot() as snap:
            cfg, state = snap.config, snap.state
            outlook = _outlook(snap, next_updates) if next_updates else {}
        layout, tm = cfg.layout_obj, cfg.time
        last = state.last_slot if state.last_slot is not None else 0
        subs = []
        for i, s in enumerate(state.subindices):
            ins = compress_slots(layout.insertion_slots_held(i, last))
            exp = compress_slots(layout.expiration_slots_held(i, last))
            subs.append({
                "subindex": i + 1, "records": s.records, "bytes": s.bytes, "blocks": s.blocks, "runs": len(s.runs),
                "min_exp": s.min_exp, "max_exp": s.max_exp, "insertion_slots": ins, "expiration_slots": exp,
                "insertion_times": [[tm.time_of(a - 1) + 1, tm.time_of(b)] for a, b in ins],
                "expiration_times": [[tm.time_of(a - 1) + 1, tm.time_of(b)] for a, b in exp],
            })
        history = self.schema_history
        schema = None if history is None else history.schema
        return {
            "path": self.path,
            "format": FORMAT_VERSION,
            "native_point_probe": point_probe.NATIVE_STATE,
            "config": asdict(cfg),
            "layout": layout.describe(),
            "n": layout.n,
            "p": tm.p,
            "last_update_time": None if state.last_slot is None else tm.time_of(state.last_slot),
            "last_slot": state.last_slot,
            "updates": state.update_seq,
            "schema": None if schema is None else [f"{f.name}: {f.type}" for f in schema],
            "schema_history": [] if history is None else history.describe(),
            "records": sum(s.records for s in state.subindices),
            "bytes": sum(s.bytes for s in state.subindices),
            "late_rows": state.late_rows,
            "subindices": subs,
            "draining": [{"layout": ArchiveConfig(**d.config).layout_obj.describe() + ", " + d.config["mode"],
                          "switched_after_slot": d.switched_after_slot, "records": d.records, "bytes": d.bytes,
                          "runs": sum(len(x.runs) for x in d.subindices),
                          "gone_by": max((r.max_exp for x in d.subindices for r in x.runs), default=None)}
                         for d in state.draining],
            "migrations": self.migrations(),
            "update_log": self.updates(update_log),
            **outlook,
        }


def _plan(cfg: ArchiveConfig, state: ArchiveState, updates: int) -> list[dict]:
    """``Archive.plan`` of the version (cfg, state)."""
    if not 1 <= updates <= MAX_PLANNED_UPDATES:
        raise UsageError(f"plan 1 to {MAX_PLANNED_UPDATES} updates at a time, not {updates}")
    layout, tm = cfg.layout_obj, cfg.time
    out = []
    if state.last_slot is None:
        out.append({"slot": 0, "time": tm.tau, "kind": "bulk", "insert_into": list(range(1, layout.n + 1)), "delete_from": []})
        start = 1
    else:
        start = state.last_slot + 1
    while len(out) < updates:
        j = start
        start += 1
        ins = [i + 1 for i in layout.insert_targets(j)]
        dele = [i + 1 for i in layout.delete_targets([j])]
        out.append({"slot": j, "time": tm.time_of(j), "kind": "periodic", "insert_into": ins, "delete_from": dele,
                    "touched": sorted(set(ins) | set(dele))})
    return out


def _outlook(snap: Snapshot, updates: int) -> dict:
    """``Archive.outlook`` of the version ``snap`` reads."""
    import numpy as np

    cfg, state = snap.config, snap.state
    tm = cfg.time
    rows, cols = (cfg.G, cfg.E) if cfg.layout == "doubly" else (1, cfg.n)
    subs = state.subindices
    grid = {"rows": rows, "columns": cols, "cells": [
        [{"subindex": r * cols + c + 1, "records": subs[r * cols + c].records, "bytes": subs[r * cols + c].bytes}
         for c in range(cols)] for r in range(rows)]}
    # every stored record expires at one of the next p updates (exp <= T_last + S), so per-slot
    # sums over that window cover it
    first = 1 if state.last_slot is None else state.last_slot + 1
    p = tm.p + (1 if state.last_slot is None else 0)  # before the bulk load: records up to T_0 + S
    per_bytes, per_rows = np.zeros(p), np.zeros(p)
    draining = np.zeros(p, dtype=np.int64)
    estimated = False
    layout = cfg.layout_obj
    for i, sub in enumerate(subs):
        if not sub.runs:
            continue
        # the window's slots whose records this sub-index holds: a Rebuild block's bytes are spread
        # evenly over those within its exp range (difference arrays, then masked)
        held = np.zeros(p, dtype=bool)
        held[np.asarray(layout.expiration_slots_held(i, first - 1), dtype=np.int64)[:p] - first] = True
        count = np.concatenate([[0], np.cumsum(held)])
        diff_bytes, diff_rows = np.zeros(p + 1), np.zeros(p + 1)
        for run in sub.runs:
            b = snap.descriptor(run.name).blocks[run.first_live:]
            lo = np.clip(np.where(b["slot"] >= 0, b["slot"], tm.slots(b["min_exp"])) - first, 0, p - 1)
            hi = np.clip(np.where(b["slot"] >= 0, b["slot"], tm.slots(b["max_exp"])) - first, 0, p - 1)
            span = np.maximum(count[hi + 1] - count[lo], 1).astype(np.float64)
            estimated = estimated or bool((span > 1).any())
            for diff, per_block in ((diff_bytes, b["length"] / span), (diff_rows, b["rows"] / span)):
                np.add.at(diff, lo, per_block)
                np.add.at(diff, hi + 1, -per_block)
        per_bytes += np.cumsum(diff_bytes)[:p] * held
        per_rows += np.cumsum(diff_rows)[:p] * held
    for d in state.draining:  # a draining run goes whole, at the first update at or after its max_exp
        for sub in d.subindices:
            for run in sub.runs:
                draining[min(max(tm.slot(run.max_exp) - first, 0), p - 1)] += run.bytes
    per_bytes, per_rows = np.rint(per_bytes), np.rint(per_rows)
    timeline = [{"slot": first + k, "time": tm.time_of(first + k), "records": int(per_rows[k]), "bytes": int(per_bytes[k]),
                 "draining_bytes": int(draining[k])}
                for k in np.flatnonzero((per_bytes > 0) | (per_rows > 0) | (draining > 0)).tolist()]
    return {"grid": grid, "expiry_timeline": timeline, "estimated": estimated,
            "next_updates": _plan(cfg, state, updates)}


class PublishedArchive(Archive):
    """Read access to an archive through the metadata published in its data directory
    (``published``), for a machine that mounts only that directory. Each snapshot opens the
    newest published version, so reads follow the writer's commits."""

    def __init__(self, data_dir: str):
        self.path = self.data_dir = os.path.abspath(data_dir)
        self.readonly, self.publishes = True, False
        self._pointer = os.path.join(published.meta_dir(self.data_dir), published.CURRENT)
        self._seen: tuple | None = None  # (inode, mtime) of the pointer when ``_env`` was opened
        self._env: lmdb.Environment | None = None
        self.copy_dir = ""  # the published copy ``env`` reads
        self._switch = threading.RLock()  # a snapshot and the copy it names are taken together
        self._closed = False
        self._init_reads()

    @property
    def env(self) -> lmdb.Environment | None:
        """The newest published copy (None once closed). The pointer is replaced by a rename on
        every publish, so a new inode means a new version. A copy this drops stays open while
        a snapshot still reads it (its transaction holds it)."""
        if self._closed:
            return None
        with self._switch:
            return self._newest()

    def _newest(self) -> lmdb.Environment:
        for attempt in range(3):
            try:
                st = os.stat(self._pointer)
            except FileNotFoundError:
                raise ArchiveError(f"{self.path}: no published metadata ({self._pointer} is missing)") from None
            seen = (st.st_ino, st.st_mtime_ns)
            if seen == self._seen:
                return self._env
            copy_dir = published.current_copy(self.data_dir, FORMAT_VERSION)
            try:
                env = published.open_copy(copy_dir)
            except ArchiveError:
                if attempt == 2 or os.path.isdir(copy_dir):
                    raise
                continue  # the writer published twice since we read the pointer and dropped that copy
            self._env, self._seen, self.copy_dir = env, seen, copy_dir
            return env
        raise AssertionError("unreachable")

    def snapshot(self, *, marks_read: bool = True) -> Snapshot:
        return _PublishedSnapshot(self, marks_read=marks_read)

    def newest_version(self) -> str:
        """Changes whenever a newer copy is published (its directory)."""
        with self._switch:
            self._newest()
            return self.copy_dir

    def writer_lock(self, wait_s: float = 0.0):
        raise ArchiveError(f"{self.path} is a data directory read through its published metadata; updates go "
                           "through the archive directory on the machine that runs `ebb run`")

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.reads.close()
            self._env = None  # closes once the last snapshot on it is gone
            files.RELEASER.idle()


def open_readonly(path: str) -> Archive:
    """An archive opened for reading only: an archive directory (``Archive(path, readonly=True)``),
    or the data directory of an archive with its own data directory, through the metadata
    published there (``PublishedArchive``)."""
    if os.path.isfile(os.path.join(path, MARKER)):
        return Archive(path, readonly=True)
    if published.is_published(path):
        return PublishedArchive(path)
    raise ArchiveError(f"{path} is not an ebb archive (no {MARKER} file), nor the data directory of one (no "
                       f"{published.META_DIR}/{published.CURRENT}); create an archive with `ebb init`")


class _PublishedSnapshot(Snapshot):
    """A snapshot of a published copy. A published copy is pinned only while it is among the
    newest ``published.KEEP``, so a read that must last longer calls ``hold``, which takes a
    lease (``leases``) if the data directory is writable here; a read whose blocks are gone says
    its version was reclaimed, not "corruption"."""

    def __init__(self, archive: PublishedArchive, marks_read: bool = True):
        self._lease: leases.Lease | None = None
        with archive._switch:
            super().__init__(archive, marks_read)
            self._copy_dir = archive.copy_dir
        self.txn = published.PublishedTxn(self.txn, published.runs_dir(archive.data_dir))

    @property
    def version_txn(self) -> int:
        # a compacted copy restarts LMDB's transaction ids: the writer's is in the copy's name
        return int(os.path.basename(self._copy_dir)[1:])

    def version_token(self) -> str:
        return self._copy_dir  # what ``PublishedArchive.newest_version`` names

    def hold(self) -> None:
        if self._lease is not None:
            return
        try:
            self._lease = self.lease()
        except OSError:
            return  # a read-only mount: the read lasts as long as the published copies do

    def lease(self, as_of=None, seconds=leases.DEFAULT_SECONDS) -> leases.Lease:
        lease = super().lease(as_of, seconds)
        if not os.path.isdir(self._copy_dir):  # dropped before the lease was seen: maybe reclaimed
            lease.release()
            self._reclaimed()
        return lease

    def read(self, task):
        if self._lease is not None:
            self._lease.renew()
        try:
            yield from super().read(task)
        except CorruptionError:
            self._reclaimed()
            raise

    def native_probe(self, key, as_of=None, subindices=None):
        try:
            return super().native_probe(key, as_of, subindices)
        except CorruptionError:
            self._reclaimed()
            raise

    def close(self) -> None:
        if self._lease is not None:
            self._lease.release()
            self._lease = None
        super().close()

    def _reclaimed(self) -> None:
        """ReadError if this snapshot's version was reclaimed (the failure is not corruption)."""
        if not os.path.isdir(self._copy_dir) and self._lease is None:
            name = os.path.basename(self._archive.path.rstrip(os.sep))
            raise VersionReclaimed(f"archive {name}: the version this read started on (update {self.state.update_seq}) "
                                   f"was reclaimed after {published.KEEP} newer updates were published; run the read "
                                   "again") from None
