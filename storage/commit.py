"""The commit of an update: the new version written in one LMDB transaction, then committed.

Before ``commit`` is called every new run file is durable (fsync'd, and its directory entry
too). ``commit`` writes the new runs' descriptors, drops those of replaced runs, puts replaced
space on the garbage list tagged with this transaction, writes the state, the update record and
any producer checkpoint, and commits. The transaction's commit is the update's single commit
point: before it, no reader or recovery sees anything of the update; after it, all of it.
"""

from __future__ import annotations

from .faults import crash_point
from .manifest import (
    ArchiveState, append_update_record, delete_run, read_garbage, read_migrations, write_checkpoint, write_config,
    write_garbage, write_migrations, write_run, write_schema, write_state,
)
from .maintenance import SubIndexChange


def stage(txn, state: ArchiveState, changes: list[SubIndexChange], schema_to_write, checkpoint: dict[str, bytes] | None,
          record: dict, dropped_runs: list[str] = ()) -> None:
    """Writes the new version into the open write transaction ``txn`` (not yet committed).
    ``dropped_runs``: runs leaving the version besides those of ``changes`` (drained ones)."""
    garbage = read_garbage(txn)
    for name in dropped_runs:
        delete_run(txn, name)
        garbage.append([name, txn.id(), None])
    for ch in changes:
        state.subindices[ch.i].runs = ch.runs
        for desc in ch.new_runs:
            write_run(txn, desc)
        for name in ch.dropped_runs:
            delete_run(txn, name)
            garbage.append([name, txn.id(), None])
        garbage += [[name, txn.id(), end] for name, end in ch.dead_prefixes]
    write_garbage(txn, garbage)
    if schema_to_write is not None:
        write_schema(txn, schema_to_write)
    for name, value in (checkpoint or {}).items():
        write_checkpoint(txn, name, value)
    write_state(txn, state)
    append_update_record(txn, state.update_seq, record)


def stage_migration(txn, config, state: ArchiveState, new_runs: list, dropped_runs: list[str], record: dict) -> None:
    """Writes a layout switch into ``txn`` (not yet committed): the new configuration, the runs
    a copy wrote, those it replaced (as garbage), the state, and the migration log entry."""
    garbage = read_garbage(txn)
    for desc in new_runs:
        write_run(txn, desc)
    for name in dropped_runs:
        delete_run(txn, name)
        garbage.append([name, txn.id(), None])
    write_garbage(txn, garbage)
    write_config(txn, config)
    write_state(txn, state)
    write_migrations(txn, read_migrations(txn) + [record])


def commit(txn) -> None:
    """The single commit point (LMDB makes it durable and atomic)."""
    crash_point("update.before_commit")
    txn.commit()
