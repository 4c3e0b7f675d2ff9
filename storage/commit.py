"""The new version of an update or a layout switch, written into one LMDB write transaction.

``write_sequence`` commits the transaction; every new run file is durable (fsync'd, and its
directory entry too) before these are called. ``stage`` writes the new runs' descriptors, puts
replaced space on the garbage list tagged with this transaction (a replaced run's descriptor
stays until garbage collection deletes its file: kept versions and pinned reads may still plan
with it), writes the state, the update record (trimming the log to ``config.update_log``
records), the version kept for reads as of earlier instants (``config.retain``), any producer
checkpoint and, last, the root naming all of them (``manifest.seal_root``). The transaction's
commit is the update's single commit point: before it, no reader or recovery sees anything of
the update; after it, all of it.
"""

from __future__ import annotations

from .manifest import (
    ArchiveState, append_update_record, keep_version, parse_config, read_config_bytes, read_garbage,
    read_migrations, seal_root, trim_update_records, write_checkpoint, write_config, write_garbage, write_migrations,
    write_run, write_schema_history, write_state,
)
from .maintenance import SubIndexChange
from .schema import SchemaHistory


def stage(txn, state: ArchiveState, changes: list[SubIndexChange], schemas: SchemaHistory | None,
          checkpoint: dict[str, bytes] | None, record: dict, dropped_runs: list[str] = ()) -> None:
    """Writes the new version into the open write transaction ``txn`` (not yet committed).
    ``schemas``: the schema and its history, if this update set or grew it. ``dropped_runs``:
    runs leaving the version besides those of ``changes`` (drained ones)."""
    garbage = read_garbage(txn)
    garbage += [[name, txn.id(), None] for name in dropped_runs]
    for ch in changes:
        state.subindices[ch.i].runs = ch.runs
        for desc in ch.new_runs:
            write_run(txn, desc)
        garbage += [[name, txn.id(), None] for name in ch.dropped_runs]
        garbage += [[name, txn.id(), end] for name, end in ch.dead_prefixes]
    write_garbage(txn, garbage)
    if schemas is not None:
        write_schema_history(txn, schemas)
    for name, value in (checkpoint or {}).items():
        write_checkpoint(txn, name, value)
    write_state(txn, state)
    config = parse_config(read_config_bytes(txn))
    append_update_record(txn, state.update_seq, record)
    trim_update_records(txn, state.update_seq, config.update_log)
    keep_current(txn, config, state)
    seal_root(txn)


def keep_current(txn, config, state: ArchiveState) -> None:
    """Keeps the new version for reads as of instants before the next update, if the archive
    retains history (``config.retain``)."""
    if config.retain and state.last_slot is not None:
        keep_version(txn, config.time.time_of(state.last_slot), state, config.retain)


def stage_migration(txn, config, state: ArchiveState, new_runs: list, dropped_runs: list[str], record: dict) -> None:
    """Writes a layout switch into ``txn`` (not yet committed): the new configuration, the runs
    a copy wrote, those it replaced (as garbage), the state, and the migration log entry."""
    garbage = read_garbage(txn)
    for desc in new_runs:
        write_run(txn, desc)
    garbage += [[name, txn.id(), None] for name in dropped_runs]
    write_garbage(txn, garbage)
    write_config(txn, config)
    write_state(txn, state)
    keep_current(txn, config, state)
    write_migrations(txn, read_migrations(txn) + [record])
    seal_root(txn)
