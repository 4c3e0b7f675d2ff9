"""What a process keeps to read an archive across snapshots: its read state.

Opening a snapshot, planning and probing would each cost far more than the read itself if they
parsed the metadata and opened files every time, so a process keeps, per archive: the run files
it has open or mapped (``files.OpenFiles``), parsed run descriptors and page sums within a byte
budget (``metadata_cache``), the parsed configuration and state of the last version it saw, the
schema and its history (parsed again only when a load has grown it), and the current version's
point-probe run set. ``Snapshot`` reads everything through this
interface; ``Archive`` owns one (``Archive.reads``), writers read the configuration through it,
and ``follower.VersionFollower`` keeps a serving process's state on the newest version.

When a new version is parsed, what only the replaced one used (maps of runs it no longer reads,
its point-probe run set) is handed to ``files.RELEASER``, off the caller's thread. The runs the
new version keeps stay prepared for its run set (``prepared_runs``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import lmdb
import pyarrow as pa

from .block_format import physical_schema
from .config import ArchiveConfig
from .files import OpenFiles
from .lmdb_env import check_pages
from .manifest import (
    ArchiveState, parse_config, parse_schema_history, parse_state, read_config_bytes, read_schema_bytes, read_state_bytes,
)
from .metadata_cache import MetadataCache
from .point_probe import ColumnLayout, PreparedRun, ProbeRuns
from .schema import SchemaHistory


@dataclass(frozen=True)
class StoredSchema:
    """A version's archive schema with its history, and how its blocks are read."""

    history: SchemaHistory
    physical: pa.Schema  # the newest schema and the hidden columns
    point_layout: ColumnLayout | None  # how point probes read runs of the newest schema (int64 keys only)

    @property
    def schema(self) -> pa.Schema:
        return self.history.schema


class ReadState:
    """One process's read state for one archive (thread-safe for readers: each field is replaced
    whole, never changed in place)."""

    def __init__(self, data_dir: str):
        self.open_files = OpenFiles(data_dir)
        self.metadata = MetadataCache()
        self._config: tuple[bytes, ArchiveConfig] | None = None
        self._state: tuple[bytes, ArchiveState] | None = None
        self._state_at: tuple | None = None  # (environment, transaction id) it was read in
        self._version: tuple | None = None  # (environment, transaction id, config, state)
        self._schema: tuple[tuple[bytes, bytes], StoredSchema] | None = None  # (as stored, parsed)
        self._schema_at: tuple | None = None  # (environment, transaction id, its StoredSchema or None)
        self._point_runs: tuple[ArchiveState, ProbeRuns] | None = None  # of the current version
        # the runs of the last run set kept, by name, that the current version still reads: the
        # next version's run set reuses them (most runs outlive many versions)
        self._prepared: dict[str, PreparedRun] = {}
        self._newest_seq_read = -1  # the newest update a snapshot reads may answer from holds
        self._newest_seq_lock = threading.Lock()

    def config(self, txn) -> ArchiveConfig:
        """The configuration of ``txn``'s version, parsed once per version (``migrate`` may
        change its layout, so writers read it in their own transaction)."""
        raw = read_config_bytes(txn)
        if self._config is None or self._config[0] != raw:
            self._config = (raw, parse_config(raw))
        return self._config[1]

    @property
    def last_config(self) -> ArchiveConfig | None:
        """The configuration last read (for an archive already closed)."""
        return None if self._config is None else self._config[1]

    def version(self, env: lmdb.Environment, txn) -> tuple[ArchiveConfig, ArchiveState]:
        """The configuration and state of ``txn``'s version (a transaction of ``env``). Every LMDB
        write transaction that commits gets a new id, so while the id is the one last seen in
        ``env`` neither is read again: a probe opens its snapshot without reading metadata."""
        seen = self._version
        if seen is not None and seen[0] is env and seen[1] == txn.id():
            return seen[2], seen[3]
        check_pages(env, txn)  # a version this process has not read yet (cheap if checked)
        config, state = self.config(txn), self._parsed_state(env, txn)
        self._version = (env, txn.id(), config, state)
        return config, state

    def mark_read(self, update_seq: int) -> None:
        """Notes that a snapshot reads may answer from holds update ``update_seq``."""
        if update_seq > self._newest_seq_read:
            with self._newest_seq_lock:  # a max that two threads' snapshots must not undo
                self._newest_seq_read = max(self._newest_seq_read, update_seq)

    @property
    def newest_update_seq_read(self) -> int:
        """The newest update (``ArchiveState.update_seq``) of a snapshot that reads through this
        read state may answer from (-1: none yet): a version older than it must not answer a read
        that comes after, or a client could see an update and then the state before it."""
        return self._newest_seq_read

    def _parsed_state(self, env, txn) -> ArchiveState:
        """The state of ``txn``'s version, parsed once per version (callers must not modify it).
        A new version lets go of what only the replaced one held, in the background; an older
        one than last seen (a transaction begun before a commit another thread has seen) is
        parsed and kept nowhere, so it cannot undo what the newer one prepared."""
        raw = read_state_bytes(txn)
        if self._state is None or self._state[0] != raw:
            state = parse_state(raw)
            seen = self._state_at
            if seen is not None and seen[0] is env and txn.id() < seen[1]:
                return state
            self._state, self._state_at = (raw, state), (env, txn.id())
            names, prepared = state.run_names(), self._prepared
            self._prepared = {n: p for n, p in prepared.items() if n in names}
            gone = [p for n, p in prepared.items() if n not in names]
            old, self._point_runs = self._point_runs, None
            self.open_files.retain(names, (old, *gone))  # older versions' runs reopen if read
            self.metadata.retain(names)
        return self._state[1]

    def schema(self, env: lmdb.Environment, txn) -> StoredSchema | None:
        """The schema of ``txn``'s version (None before the first load), parsed once per schema
        (a load may add columns) and read once per version, as ``version`` does."""
        seen = self._schema_at
        if seen is not None and seen[0] is env and seen[1] == txn.id():
            return seen[2]
        raw = read_schema_bytes(txn)
        kept = self._schema
        if raw is None:
            stored = None
        elif kept is not None and kept[0] == raw:
            stored = kept[1]
        else:
            history = parse_schema_history(raw)
            physical = physical_schema(history.schema)
            cfg = self.config(txn)
            stored = StoredSchema(history, physical,
                                  ColumnLayout.of(physical, cfg.key_column, cfg.ts_column, cfg.exp_column))
            self._schema = (raw, stored)
        self._schema_at = (env, txn.id(), stored)
        return stored

    def point_runs(self, state: ArchiveState) -> ProbeRuns | None:
        """The point-probe run set kept for ``state``, if it is the current version's."""
        kept = self._point_runs
        return kept[1] if kept is not None and kept[0] is state else None

    def keep_point_runs(self, state: ArchiveState, runs: ProbeRuns) -> None:
        """Keeps ``runs`` for the probes that follow, and its runs for the next version's run set,
        if ``state`` is still the current version."""
        if self._state is not None and self._state[1] is state:
            self._point_runs = (state, runs)
            self._prepared = {p.run.name: p for p in runs.prepared}

    @property
    def prepared_runs(self) -> dict[str, PreparedRun]:
        """The runs of the current version's last kept run set, ready to be taken by the next."""
        return self._prepared

    @property
    def holds_point_runs(self) -> bool:
        return self._point_runs is not None

    def close(self) -> None:
        """Closes every file held, at once (the archive is being closed)."""
        self._point_runs, self._prepared = None, {}
        self.open_files.close()
