"""A consistent, read-only view of one committed state of the archive.

A snapshot is an LMDB read transaction plus memory maps of the bucket files that state
references. Updates that commit while it is open are invisible to it, and the space it
references is neither reused nor deleted until it closes (see ``slot_allocator`` and
``recovery.collect_garbage``).
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa

from . import directory, keys as keycodec
from .bucket_codec import BucketCodec
from .files import MappedFile, norebuild_file, rebuild_file
from .manifest import ArchiveConfig, ArchiveState, read_config, read_schema, read_state


class Snapshot:
    """Read access to one committed state. Use as a context manager or call ``close``."""

    def __init__(self, archive):
        self._archive = archive
        self.txn = archive.env.begin(buffers=False)
        meta = archive.meta_db
        self.config: ArchiveConfig = read_config(self.txn, meta)
        self.state: ArchiveState = read_state(self.txn, meta)
        self.schema: pa.Schema | None = read_schema(self.txn, meta)
        self.codec = BucketCodec(self.schema) if self.schema is not None else None
        self._files: dict[int, MappedFile] = {}

    # -- time -----------------------------------------------------------------------------------
    @property
    def time(self) -> int:
        """Time of the last committed update (tau before the first)."""
        tm = self.config.time
        return tm.tau if self.state.last_slot is None else tm.time_of(self.state.last_slot)

    def check_as_of(self, as_of: int | None) -> int:
        """``as_of`` or the snapshot's time; an earlier time is an error (SPEC section 2)."""
        if as_of is None:
            return self.time
        if as_of < self.time:
            raise ValueError(
                f"as_of {as_of} is before the last update at {self.time}: expired history is not kept"
            )
        return int(as_of)

    # -- directory ------------------------------------------------------------------------------
    @property
    def n(self) -> int:
        return len(self.state.subindices)

    def key_bytes(self, value) -> bytes:
        return keycodec.encode_one(value, self.schema.field(self.config.key_column).type)

    def entries(self, i: int, lo=None, hi=None, point: bool = False) -> directory.Entries:
        """Directory entries of sub-index i: all, one key (``point``), or lo <= key <= hi."""
        db = self._archive.dir_dbs[i]
        if self.state.subindices[i].records == 0:
            return directory.Entries.empty()
        if point:
            return directory.load_keys(self.txn, db, [self.key_bytes(lo)])
        if lo is None and hi is None:
            return directory.load_all(self.txn, db)
        lo_b = self.key_bytes(lo) if lo is not None else b""
        hi_b = self.key_bytes(hi) if hi is not None else b"\xff" * 512
        return directory.load_range(self.txn, db, lo_b, hi_b)

    # -- buckets --------------------------------------------------------------------------------
    def file(self, i: int) -> MappedFile:
        if i not in self._files:
            s = self.state.subindices[i]
            name = norebuild_file(i) if self.config.mode == "norebuild" else rebuild_file(i, s.generation)
            self._files[i] = MappedFile(os.path.join(self._archive.data_dir, name))
        return self._files[i]

    def read(self, i: int, descs: np.ndarray, columns: list[str] | None = None) -> pa.Table:
        """Decodes the given buckets of sub-index i (physical columns)."""
        if descs.size == 0:
            return self.codec.physical_schema.empty_table() if columns is None else pa.schema(
                [self.codec.physical_schema.field(c) for c in columns]).empty_table()
        return self.codec.decode(self.file(i).array, descs["loc"], descs["count"], columns)

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()
        if self.txn is not None:
            self.txn.abort()
            self.txn = None

    def __enter__(self) -> "Snapshot":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
