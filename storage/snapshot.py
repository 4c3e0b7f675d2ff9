"""A consistent, read-only view of one committed version of the archive.

A snapshot is an LMDB read transaction: it pins one version, so the run files and blocks that
version references are not reclaimed while it is open (``recovery.collect_garbage`` waits for
it), and updates committing meanwhile are invisible to it. ``plan`` turns a request into read
tasks; ``read`` executes one. Opening a snapshot takes no lock and never waits for a writer.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import pyarrow as pa

from .block_format import physical_schema
from .config import ArchiveConfig
from .errors import ReadError
from .manifest import ArchiveState
from .read_plan import ReadRequest, ReadTask, plan
from .run_descriptor import RunDescriptor
from .task_reader import execute, prefetch_heads


class Snapshot:
    """Read access to one committed version. Use as a context manager or call ``close``."""

    def __init__(self, archive):
        self._archive = archive
        self.txn = archive.env.begin(buffers=False)
        try:
            self.config: ArchiveConfig = archive._cached_config(self.txn)
            self.state: ArchiveState = archive._cached_state(self.txn)
            self.schema: pa.Schema | None = archive._cached_schema(self.txn)
        except BaseException:
            self.close()
            raise
        self._physical = archive.physical_schema

    # -- time -----------------------------------------------------------------------------------
    @property
    def time(self) -> int:
        """Time of the last committed update (tau before the first)."""
        tm = self.config.time
        return tm.tau if self.state.last_slot is None else tm.time_of(self.state.last_slot)

    def check_as_of(self, as_of: int | None) -> int:
        """``as_of`` or the snapshot's time; an earlier time is an error (docs/spec.md section 2)."""
        if as_of is None:
            return self.time
        if as_of < self.time:
            raise ReadError(f"as_of {as_of} is before the last update at {self.time}: expired history is not kept")
        return int(as_of)

    @property
    def n(self) -> int:
        return len(self.state.subindices)

    # -- planning and reading -------------------------------------------------------------------
    def descriptor(self, name: str) -> RunDescriptor:
        """The descriptor of a run of this version, without its page sums (cached: run files
        never change)."""
        return self._archive.metadata.descriptor(self.txn, name)

    def page_sums(self, name: str) -> np.ndarray | None:
        """The page sums of a run of this version (None: written without them; cached)."""
        return self._archive.metadata.page_sums(self.txn, name)

    def plan(self, request: ReadRequest, as_of: int | None = None, subindices: list[int] | None = None) -> list[ReadTask]:
        """The read tasks answering ``request`` as of ``as_of`` (default: the last update)."""
        t = self.check_as_of(as_of)
        if self.schema is None:
            return []
        return plan(self.state, self.descriptor, request, t, subindices, self.page_sums)

    def read(self, task: ReadTask) -> Iterator[pa.RecordBatch]:
        """Executes one task of this snapshot's plan (archive schema, valid records only)."""
        cfg = self.config
        return execute(task, self._archive.open_files, self._physical, cfg.key_column, cfg.ts_column,
                       cfg.exp_column, f"archive {self._archive.path}, {task.where}")

    def read_all(self, tasks: list[ReadTask]) -> Iterator[pa.RecordBatch]:
        """``read`` of each of ``tasks`` in order, after starting the first reads of every keyed
        task at once (``task_reader.prefetch_heads``): on a cold cache the sub-indices' blocks
        are then read in parallel, not one after another."""
        if self._physical is not None:
            prefetch_heads(tasks, self._archive.open_files, self._physical, self.config.key_column)
        for task in tasks:
            yield from self.read(task)

    def read_args(self) -> tuple[str, pa.Schema, ArchiveConfig]:
        """What ``read_unpinned`` needs besides a task: the data directory, schema and config."""
        return self._archive.data_dir, self.schema, self.config

    def close(self) -> None:
        if self.txn is not None:
            self.txn.abort()
            self.txn = None

    def __enter__(self) -> "Snapshot":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_unpinned(task: ReadTask, data_dir: str, schema: pa.Schema, config: ArchiveConfig) -> Iterator[pa.RecordBatch]:
    """Executes a task of some snapshot's plan without the archive's metadata: for a process on
    another machine that mounts only the data files (a Spark executor). Nothing pins the version
    here, so if updates since the plan have reclaimed its blocks the read fails (file missing, or
    a checksum mismatch); it never returns rows of another version."""
    from .files import OpenFiles

    files = OpenFiles(data_dir)
    try:
        yield from execute(task, files, physical_schema(schema), config.key_column, config.ts_column,
                           config.exp_column, f"data directory {data_dir}, {task.where}")
    finally:
        files.close()
