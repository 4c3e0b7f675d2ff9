"""Parquet peer (pyarrow): a hive-partitioned dataset, one directory per expiration slot.

An update deletes whole expired partitions (directories ``exp_slot=K`` with K <= j, which hold
exactly the records with exp <= T_j) and writes each new record into its expiration slot's
directory as one new file per update, sorted by key (so row-group statistics can skip groups),
fsync'd. Nothing is ever rewritten. A probe reads every partition with a key filter (the
dataset API prunes row groups by their min/max statistics); a scan reads everything.
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..store import ReadResult, Store

ROW_GROUP_ROWS = 8192


class ParquetStore(Store):
    name = "parquet"

    def __init__(self, path, workload):
        super().__init__(path, workload)
        self.root = os.path.join(path, "dataset")

    def create(self) -> None:
        os.makedirs(self.root, exist_ok=True)

    def open(self) -> None:
        pass  # nothing is held open between operations

    def close(self) -> None:
        pass

    def _slot(self, exp: np.ndarray) -> np.ndarray:
        return -((-exp) // self.workload.delta)  # slot(exp) = ceil(exp / Delta), tau = 0

    def load(self, table: pa.Table, at: int) -> dict[str, int]:
        import pyarrow.parquet as pq

        j = at // self.workload.delta
        deleted = 0
        for name in os.listdir(self.root):
            k = int(name.split("=", 1)[1])
            if k <= j:
                d = os.path.join(self.root, name)
                deleted += sum(pq.ParquetFile(os.path.join(d, f)).metadata.num_rows for f in os.listdir(d))
                shutil.rmtree(d)
        slots = self._slot(table.column("exp").to_numpy())
        order = np.lexsort((table.column("key").to_numpy(), slots))
        table = table.take(pa.array(order))
        slots = slots[order]
        cuts = np.flatnonzero(np.diff(slots)) + 1
        for a, b in zip(np.r_[0, cuts], np.r_[cuts, slots.size]):
            d = os.path.join(self.root, f"exp_slot={int(slots[a])}")
            os.makedirs(d, exist_ok=True)
            path = os.path.join(d, f"u{j:06d}.parquet")
            pq.write_table(table.slice(int(a), int(b - a)), path, row_group_size=ROW_GROUP_ROWS, compression="none")
            fd = os.open(path, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        os.fsync(fd)
        os.close(fd)
        return {"inserted": table.num_rows, "deleted": deleted}

    def _dataset(self):
        import pyarrow.dataset as ds

        return ds.dataset(self.root, format="parquet", partitioning="hive")

    def _read(self, expr) -> ReadResult:
        rows = seq = 0
        for batch in self._dataset().to_batches(filter=expr):
            rows += batch.num_rows
            if batch.num_rows:
                seq += int(pc.sum(batch.column("seq")).as_py())
        return ReadResult(rows, seq)

    def probe(self, key: int, at: int) -> ReadResult:
        f = pc.field
        return self._read((f("key") == key) & (f("ts") <= at) & (f("exp") > at))

    def scan(self, at: int) -> ReadResult:
        f = pc.field
        return self._read((f("ts") <= at) & (f("exp") > at))
