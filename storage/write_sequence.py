"""The one way a writer changes an archive (LevelDB's ``DBImpl::Write``, for ebb).

``run(archive, writer)`` is the sequence every writer goes through: an update (``update.Update``),
an update whose runs Spark tasks wrote (``partitioned_update.PartsCommit``) and a layout change
(``migration``). A ``Writer`` supplies only what differs; the sequence is:

1. lock: the writer lock, and LMDB's reports of damaged metadata turned into CorruptionError;
2. recover: remove run files no committed version references (``recovery.recover``);
3. ``writer.prepare``: work outside the write transaction (planning, Spark tasks); False: nothing to commit;
4. ``writer.write`` in one LMDB write transaction: plan, write the new runs (durable: ``durable``),
   stage the new version; the sequence then commits it, the single commit point. On an error
   before it, the transaction is aborted and the files the writer created are removed;
5. post-commit: the new runs' descriptors cached and their files mapped for the reads that
   follow (as RocksDB opens a compaction's output), then ``writer.committed``;
6. reclaim: publish, collect replaced space, prepare the new version's point probes.

A writer whose runs exist before it takes the lock (Spark tasks: ``runs_before_lock``) recovers
after step 5 instead, or recovery would remove them. Nothing after the commit undoes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import files, published, recovery
from .errors import CorruptionError
from .faults import SimulatedCrash
from .manifest import FORMAT_VERSION
from .run_descriptor import RunDescriptor


@dataclass
class Staged:
    """What a writer staged: the record ``run`` returns, and the runs the new version adds."""

    record: dict
    new_runs: list[RunDescriptor] = field(default_factory=list)


class Writer:
    """What differs between writers (see the module docstring). Its crash points are its own."""

    runs_before_lock = False  # its run files were written before step 1: recover after the commit

    def prepare(self, archive) -> bool:
        """Step 3, under the lock; False if there is nothing to commit (steps 4 to 6 are skipped)."""
        return True

    def write(self, archive, txn, created: list[str]) -> Staged:
        """Step 4: plans in ``txn`` (the write transaction), writes the new runs (appending each
        file's path to ``created`` once it exists), makes them ``durable`` and stages the new
        version in ``txn``, which the sequence commits."""
        raise NotImplementedError

    def committed(self, record: dict) -> None:
        """Step 5, after the commit and before reclaiming (a crash point)."""


def run(archive, writer: Writer, wait_s: float = 0.0) -> dict | None:
    """The sequence; returns the new version's record (None if ``prepare`` found nothing to
    commit). ``wait_s``: how long to wait for another writer to finish."""
    with archive.writer_lock(wait_s), archive.metadata_errors():
        if not writer.runs_before_lock:
            recovery.recover(archive.env, archive.data_dir)
        staged = commit(archive, writer) if writer.prepare(archive) else None
        if staged is not None:
            for desc in staged.new_runs:
                archive.metadata.adopt(desc)
                archive.open_files.warm(desc.name)
            writer.committed(staged.record)
        if writer.runs_before_lock:
            recovery.recover(archive.env, archive.data_dir)  # also what failed task attempts wrote
        if staged is not None:
            reclaim(archive)
    return None if staged is None else staged.record


def commit(archive, writer: Writer) -> Staged:
    """Step 4 alone (the caller holds the writer lock)."""
    txn = archive.env.begin(write=True)
    created: list[str] = []
    try:
        staged = writer.write(archive, txn, created)
        txn.commit()
    except SimulatedCrash:
        txn.abort()  # as a crash would lose it; files stay behind, as a crash leaves them
        raise
    except BaseException:
        txn.abort()
        for path in created:  # files of a version that will not commit
            files.FS.remove(path)
        raise
    return staged


def durable(data_dir: str, created: list[str]) -> None:
    """Makes new run files, and their names, durable: before the commit that references them."""
    if created:
        files.FS.sync_files(created)
        files.FS.sync_dir(data_dir)


def reclaim(archive) -> list[str]:
    """Step 6, under the writer lock: publishes the new version if the run files have their own
    data directory (``published.publish``), reclaims replaced space that no reader, local or
    published, can reference (``recovery.collect_garbage``; its bytes in ``reclaimed_bytes``),
    parses the new version once for the point probes that follow, and lets go of the files of
    the runs it replaced (the snapshot does). Returns what it reclaimed."""
    env, data_dir = archive.env, archive.data_dir
    pinned = published.publish(env, data_dir, FORMAT_VERSION) if archive.publishes else None
    before = recovery.held_bytes(env, data_dir)
    done = recovery.collect_garbage(env, data_dir, pinned)
    archive.reclaimed_bytes = before - recovery.held_bytes(env, data_dir)
    if archive.publishes:
        published.forget_deleted_runs(data_dir)
    with archive.snapshot() as snap:
        try:
            snap.prepare_point_probes()
        except (CorruptionError, OSError):
            pass  # the version committed: a damaged run is left for a read to report
    return done
