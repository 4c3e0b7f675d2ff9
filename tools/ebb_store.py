"""ebb itself as a benchmarked store: one archive with a wave or doubly partitioned layout.

Updates go through ``Archive.load`` (whose update record supplies ebb's own counts: sub-indices
touched, blocks and bytes read and written); probes, batches of probes and scans through an
``ArchiveReader`` of its own, opened from the archive's path (read-only, with its own in-process
read state, as ``ebb serve`` opens it), so a read never benefits from what the writer's update
prepared in its ``Archive`` (the run set of the new version): the first probe after an update
prepares it, as a server's would. Only the LMDB environment is shared, as it must be within a
process (storage/lmdb_env.py). ``ReadStats`` count the sub-indices, blocks and bytes a read
planned; reads also report the archive's target block size (``block_bytes``, which depends on
the mode); after each update the largest and mean number of records per sub-index are read from
the committed state. ``close`` closes the reader (its archive and the run files it holds open)
and then the writer's ``Archive``, which closes the LMDB environment and its run files.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..storage.config import ArchiveConfig, build_config
from .configs import Config
from .store import ReadResult, Store
from .workloads import Workload


def archive_config(config: Config, workload: Workload) -> ArchiveConfig:
    """The archive configuration of layout ``config`` under ``workload`` (random partitioning is
    seeded with the workload's seed, so its allocation is the same in every run)."""
    c, w = config, workload
    wave = c.family == "wave"
    return build_config(
        layout="wave" if wave else "doubly", mode=c.mode, interval=w.delta, max_lifetime=w.max_lifetime, start=0,
        partitioning=c.partitioning or "round-robin", split=c.split or "insertion",
        G=None if wave else (c.G or 1), E=None if wave else (c.E or 1), n=c.n if wave else None,
        seed=w.seed if c.partitioning == "random" else None, block_bytes=c.block_kib * 1024 or None,
        section_slots=c.section_slots, time_unit="record (one record per chronon on average)",
    )


class EbbStore(Store):
    """An ebb archive configured as ``config`` (family "wave" or "doubly")."""

    def __init__(self, path: str, workload: Workload, config: Config, follow: bool = False):
        """``follow``: the reader follows new versions as ``ebb serve`` does (``ArchiveReader(path,
        follow=True)``), a background thread preparing each one as it commits; otherwise its
        first probe after an update prepares the new version, as a script's reader's does."""
        super().__init__(path, workload)
        self.config = config
        self.follow = follow
        self.name = config.name
        self.archive = None
        self.reader = None
        self.block_bytes = 0  # the archive's target block size, reported with each read

    def create(self) -> None:
        from ..storage.archive import Archive

        Archive.create(self.path, archive_config(self.config, self.workload)).close()
        self.open()

    def open(self) -> None:
        from ..query.reader import ArchiveReader
        from ..storage.archive import Archive

        # the writer first: LMDB allows one environment per process, opened by whoever comes first,
        # and a read-only one would refuse the updates
        self.archive = Archive(self.path)
        self.reader = ArchiveReader(self.path, follow=self.follow)  # Archive(path, readonly=True): its own read state
        if not self.follow:  # (a follower prepares each version itself)
            self.reader.prepare_probes()  # as a probe-serving process does; RocksDB's open reads its index blocks
        self.block_bytes = self.archive.config.block_bytes

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()  # its own archive: the run files it opened, one reference to LMDB
            self.reader = None
        if self.archive is not None:
            self.archive.close()  # the LMDB environment (its memory map) and the open run files
            self.archive = None

    def load(self, table: pa.Table, at: int) -> dict[str, int]:
        rec = self.archive.load(table, at)
        return {
            "inserted": rec["inserted"], "deleted": rec["deleted"],
            "subindices": len(rec["subindices_touched"]),
            "blocks_read": rec["blocks_read"], "blocks_written": rec["blocks_written"],
            "store_bytes_read": rec["bytes_read"], "store_bytes_written": rec["bytes_written"],
        }

    def update_seq(self) -> int:
        """The newest committed update, as the writer's state says."""
        return self.archive.state().update_seq

    def subindex_balance(self) -> dict[str, float]:
        sizes = [s.records for s in self.archive.state().subindices]
        return {"subidx_max_rows": max(sizes), "subidx_mean_rows": sum(sizes) / len(sizes)}

    def _stats(self) -> dict[str, int]:
        """ebb's own counters of the read just done. Read inside the timed operation, so they
        cost only attribute reads (the block size was read at ``open``: no update changes it)."""
        io = self.reader.io
        return {"subindices": len(io.subindices_read), "blocks_read": io.blocks_read, "store_bytes_read": io.bytes_read,
                "block_bytes": self.block_bytes}

    def _reset_stats(self) -> None:
        self.reader.io.reset()

    def probe(self, key: int, at: int) -> ReadResult:
        self._reset_stats()
        t = self.reader.probe(key, as_of=at)
        return ReadResult.of_table(t, self._stats())

    def probe_many(self, keys: np.ndarray | pa.Array, at: int) -> ReadResult:
        """``ArchiveReader.probe_many``: one call for every key, each block read once for all the
        keys it holds. ``keys`` may also be an Arrow array of the archive's key type (string keys)."""
        self._reset_stats()
        t = self.reader.probe_many(keys, as_of=at)
        return ReadResult.of_table(t, self._stats())

    def scan(self, at: int) -> ReadResult:
        import pyarrow.compute as pc

        self._reset_stats()
        rows = seq = 0
        for batch in self.reader.scan(as_of=at):
            rows += batch.num_rows
            seq += int(pc.sum(batch.column("seq")).as_py() or 0)
        return ReadResult(rows, seq, self._stats())
