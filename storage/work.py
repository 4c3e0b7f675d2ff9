"""What one update asks of one sub-index, and what that sub-index reports back."""

from __future__ import annotations

from dataclasses import dataclass, field

import lmdb
import numpy as np
import pyarrow as pa

from .bucket_codec import BucketCodec
from .manifest import ArchiveConfig, SubIndexState


@dataclass
class UpdateContext:
    """Shared by every sub-index of one update; lives for one write transaction."""

    txn: lmdb.Transaction
    meta: object  # LMDB handle of the meta database
    dir_db: list  # LMDB handles of the directories, by sub-index
    data_dir: str
    config: ArchiveConfig
    codec: BucketCodec
    txn_id: int  # id of this write transaction; tags freed space
    reusable_upto: int | None  # space freed by txns <= this may be reused (None: none)
    capacity: int | None  # NoRebuild slot size in bytes
    created: list[str] = field(default_factory=list)  # files written by this update (removed on abort)
    garbage: list[list] = field(default_factory=list)  # [file, txn] replaced by this update


@dataclass
class SubIndexWork:
    i: int
    rows: pa.Table  # new records (physical schema), sorted by (key, exp); may be empty
    delete_upto: int | None  # delete records with exp <= this; None: no deletion pass


@dataclass
class SubIndexResult:
    i: int
    state: SubIndexState
    inserted: int = 0
    deleted: int = 0
    buckets_read: int = 0
    bytes_read: int = 0
    buckets_written: int = 0
    bytes_written: int = 0
    buckets_freed: int = 0
    files: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "subindex": self.i + 1,
            "inserted": self.inserted,
            "deleted": self.deleted,
            "buckets_read": self.buckets_read,
            "bytes_read": self.bytes_read,
            "buckets_written": self.buckets_written,
            "bytes_written": self.bytes_written,
            "buckets_freed": self.buckets_freed,
        }


def exp_range(descs: np.ndarray) -> tuple[int | None, int | None]:
    if descs.size == 0:
        return None, None
    return int(descs["min_exp"].min()), int(descs["max_exp"].max())
