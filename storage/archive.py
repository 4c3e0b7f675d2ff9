"""The archive: create or open one, load updates into it, and ask what it holds.

This is the storage layer's public entry point. ``Archive.create`` fixes the configuration
(``ebb init``); ``load`` applies one periodic update atomically (``ebb load``); ``plan``,
``stats`` and ``verify`` describe it; ``snapshot`` gives a consistent read view to the
query layer.
"""

from __future__ import annotations

import json
import os
import secrets
from contextlib import contextmanager
from dataclasses import asdict
from typing import Callable, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from . import lmdb_env, update
from .files import DATA_DIR, INDEX_DIR, LOCK, MARKER, LockHeld, exclusive_lock
from .layout import compress_slots
from .manifest import (
    FORMAT_VERSION, META_DB, UPDATES_DB, ArchiveConfig, ArchiveState, SubIndexState, read_checkpoint,
    read_config, read_schema, read_state, read_update_records,
)
from .recovery import collect_garbage, recover
from .snapshot import Snapshot
from .validate import RejectedBatch


class ArchiveError(Exception):
    """A problem with the archive itself (missing, busy, misconfigured)."""


class ArchiveBusy(ArchiveError):
    """Another process holds the writer lock."""


def validate_config(cfg: ArchiveConfig) -> None:
    """Raises ArchiveError if the configuration cannot make a working archive."""
    p = cfg.time.p
    if cfg.mode not in ("rebuild", "norebuild"):
        raise ArchiveError(f"--mode must be rebuild or norebuild, got {cfg.mode!r}")
    if cfg.layout == "doubly":
        if cfg.partitioning not in ("round-robin", "chronological", "random"):
            raise ArchiveError(f"--partitioning must be round-robin, chronological or random, got {cfg.partitioning!r}")
        if cfg.G < 1 or cfg.E < 1:
            raise ArchiveError(f"--G and --E must be at least 1, got G={cfg.G} E={cfg.E}")
        if cfg.partitioning == "chronological" and (cfg.G > p or cfg.E > p):
            raise ArchiveError(
                f"chronological partitioning needs G and E at most p = S/Delta = {p} (got G={cfg.G}, E={cfg.E}); "
                "more partitions would stay empty")
    elif cfg.layout == "wave":
        if cfg.split not in ("insertion", "expiration"):
            raise ArchiveError(f"--split must be insertion or expiration, got {cfg.split!r}")
        if not 1 <= cfg.n_wave <= p:
            raise ArchiveError(f"a wave index needs 1 <= n <= p = S/Delta = {p}, got n={cfg.n_wave}")
    else:
        raise ArchiveError(f"--layout must be doubly or wave, got {cfg.layout!r}")
    if cfg.n > lmdb_env.MAX_SUBINDICES:
        raise ArchiveError(f"at most {lmdb_env.MAX_SUBINDICES} sub-indices, got {cfg.n}")
    if cfg.bucket_capacity is not None and cfg.bucket_capacity < 64:
        raise ArchiveError(f"--bucket-capacity must be at least 64 bytes, got {cfg.bucket_capacity}")
    if len({cfg.key_column, cfg.ts_column, cfg.exp_column}) != 3:
        raise ArchiveError("the key, ts and exp columns must be three different columns")


class Archive:
    """An open archive. Not thread-safe for writing; any number of snapshots may be open.
    ``readonly=True`` opens it for reading only: it never waits for another process's update."""

    def __init__(self, path: str, readonly: bool = False):
        self.path = os.path.abspath(path)
        marker = os.path.join(self.path, MARKER)
        if not os.path.isfile(marker):
            raise ArchiveError(f"{path} is not an ebb archive (no {MARKER} file); create one with `ebb init`")
        with open(marker) as f:
            fmt = json.load(f).get("format")
        if fmt != FORMAT_VERSION:
            raise ArchiveError(f"{path} has on-disk format {fmt}; this ebb reads format {FORMAT_VERSION}")
        self.data_dir = os.path.join(self.path, DATA_DIR)
        self.env = lmdb_env.acquire(os.path.join(self.path, INDEX_DIR), readonly=readonly)
        self.readonly = bool(self.env.flags()["readonly"])
        self.meta_db = self.env.open_db(META_DB, create=False)
        self.updates_db = self.env.open_db(UPDATES_DB, create=False)
        with self.env.begin() as txn:
            self.config = read_config(txn, self.meta_db)
        self.dir_dbs = [self.env.open_db(lmdb_env.dir_db_name(i), create=False) for i in range(self.config.n)]

    # -- lifecycle ------------------------------------------------------------------------------
    @staticmethod
    def create(path: str, config: ArchiveConfig, allow_existing: frozenset[str] | set[str] = frozenset()) -> "Archive":
        """Creates an empty archive at ``path``, which must not exist or hold only files named
        in ``allow_existing`` (e.g. a scheduler's lock file)."""
        validate_config(config)
        if config.layout == "doubly" and config.partitioning == "random" and not config.seed:
            config = ArchiveConfig(**{**asdict(config), "seed": secrets.randbits(63)})
        if os.path.exists(path) and set(os.listdir(path)) - set(allow_existing):
            raise ArchiveError(f"{path} already exists and is not empty")
        os.makedirs(os.path.join(path, DATA_DIR), exist_ok=True)
        env = lmdb_env.acquire(os.path.join(path, INDEX_DIR), create=True)
        try:
            meta = env.open_db(META_DB)
            env.open_db(UPDATES_DB)
            for i in range(config.n):
                env.open_db(lmdb_env.dir_db_name(i))
            state = ArchiveState(subindices=[SubIndexState() for _ in range(config.n)])
            with env.begin(write=True, db=meta) as txn:
                txn.put(b"config", config.to_json())
                txn.put(b"state", state.to_json())
        finally:
            lmdb_env.release(env)
        open(os.path.join(path, LOCK), "a").close()
        tmp = os.path.join(path, MARKER + ".tmp")
        with open(tmp, "w") as f:
            json.dump({"format": FORMAT_VERSION}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(path, MARKER))  # the archive exists once this is in place
        return Archive(path)

    def close(self) -> None:
        if self.env is not None:
            lmdb_env.release(self.env)
            self.env = None

    def __enter__(self) -> "Archive":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @contextmanager
    def writer_lock(self) -> Iterator[None]:
        """Exclusive right to update; fails fast with ArchiveBusy instead of queueing."""
        if self.readonly:
            raise ArchiveError(f"{self.path} is open read-only in this process (a server or reader opened it "
                               "first); a process that writes must open it for writing before any read-only reader")
        try:
            with exclusive_lock(os.path.join(self.path, LOCK)):
                yield
        except LockHeld:
            raise ArchiveBusy(f"another process is updating {self.path}; try again when it finishes") from None

    # -- writing --------------------------------------------------------------------------------
    def load(self, table: pa.Table, at: int, progress: Callable[[str], None] | None = None,
             checkpoint: dict[str, bytes] | None = None, late_rows: int = 0) -> dict:
        """Applies one periodic update at time ``at`` (SPEC section 2) and returns its record.
        Raises RejectedBatch (archive unchanged) for bad input. ``checkpoint`` (name -> bytes)
        and ``late_rows`` commit atomically with the update (see ``checkpoint``)."""
        with self.writer_lock():
            recover(self.env, self.meta_db, self.data_dir)
            record = update.apply(self, table, at, progress, checkpoint, late_rows)
            collect_garbage(self.env, self.meta_db, self.data_dir)
        return record

    def load_parquet(self, path: str, at: int, progress: Callable[[str], None] | None = None) -> dict:
        """``load`` with the records of a Parquet file."""
        try:
            table = pq.read_table(path)
        except (OSError, pa.ArrowInvalid) as e:
            raise RejectedBatch(f"cannot read {path} as Parquet: {e}") from None
        return self.load(table, at, progress)

    def recover(self) -> list[str]:
        """Runs crash recovery and garbage collection now (normally done by each update)."""
        with self.writer_lock():
            actions = recover(self.env, self.meta_db, self.data_dir)
            actions += [f"deleted replaced file {n}" for n in collect_garbage(self.env, self.meta_db, self.data_dir)]
        return actions

    # -- reading --------------------------------------------------------------------------------
    def checkpoint(self, name: str) -> bytes | None:
        """The ``checkpoint[name]`` committed with the last update that set it, or None."""
        with self.env.begin() as txn:
            return read_checkpoint(txn, self.meta_db, name)

    def snapshot(self) -> Snapshot:
        return Snapshot(self)

    def state(self) -> ArchiveState:
        with self.env.begin() as txn:
            return read_state(txn, self.meta_db)

    @property
    def schema(self) -> pa.Schema | None:
        with self.env.begin() as txn:
            return read_schema(txn, self.meta_db)

    def updates(self, last: int | None = None) -> list[dict]:
        with self.env.begin() as txn:
            return read_update_records(txn, self.updates_db, last)

    def plan(self, updates: int = 1) -> list[dict]:
        """Which sub-indices (1-based) each of the next ``updates`` updates inserts into and
        deletes from, per SPEC section 3."""
        state = self.state()
        layout, tm = self.config.layout_obj, self.config.time
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

    def stats(self) -> dict:
        """Configuration, state, per-sub-index sizes and slot ranges, and the update log."""
        state = self.state()
        layout, tm = self.config.layout_obj, self.config.time
        last = state.last_slot if state.last_slot is not None else 0
        subs = []
        for i, s in enumerate(state.subindices):
            ins = layout.insertion_slots_held(i, last)
            exp = layout.expiration_slots_held(i, last)
            subs.append({
                "subindex": i + 1, "records": s.records, "bytes": s.bytes, "buckets": s.buckets,
                "min_exp": s.min_exp, "max_exp": s.max_exp,
                "insertion_slots": compress_slots(ins), "expiration_slots": compress_slots(exp),
                "insertion_times": [[tm.time_of(a - 1) + 1, tm.time_of(b)] for a, b in compress_slots(ins)],
                "expiration_times": [[tm.time_of(a - 1) + 1, tm.time_of(b)] for a, b in compress_slots(exp)],
            })
        schema = self.schema
        return {
            "path": self.path,
            "config": asdict(self.config),
            "layout": layout.describe(),
            "n": layout.n,
            "p": tm.p,
            "last_update_time": None if state.last_slot is None else tm.time_of(state.last_slot),
            "last_slot": state.last_slot,
            "updates": state.update_seq,
            "bucket_capacity": state.bucket_capacity,
            "schema": None if schema is None else [f"{f.name}: {f.type}" for f in schema],
            "records": sum(s.records for s in state.subindices),
            "bytes": sum(s.bytes for s in state.subindices),
            "late_rows": state.late_rows,
            "subindices": subs,
            "update_log": self.updates(),
        }
