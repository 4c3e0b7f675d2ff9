"""One periodic update (SPEC section 2): validate, delete expired, insert, commit atomically.

The update runs inside one LMDB write transaction. Bucket data are written to new files or
free slots and fsync'd first; the directories, free lists, sub-index sizes, the update's own
I/O record and the new archive state are written in the transaction; its commit is the single
point at which the update happens. On any error the transaction is aborted and the files it
created are removed, leaving the archive exactly as it was.
"""

from __future__ import annotations

import os
import time
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import norebuild, rebuild
from .bucket_codec import BucketCodec
from .iostats import delta as io_delta, proc_io
from .lmdb_env import oldest_reader_txn
from .manifest import (
    ArchiveConfig, ArchiveState, append_update_record, read_garbage, read_schema, read_state,
    write_checkpoint, write_garbage, write_schema, write_state, read_config,
)
from .faults import crash_point
from .records import key_runs, with_ins_slot
from .validate import RejectedBatch, check_rows, conform_batch, update_slot
from .work import SubIndexWork, UpdateContext

Progress = Callable[[str], None]


def apply(archive, table: pa.Table, at: int, progress: Progress | None = None,
          checkpoint: dict[str, bytes] | None = None, late_rows: int = 0) -> dict:
    """Applies one update at time ``at`` with the records of ``table``; returns its record
    (what was touched, I/O, counts, wall time). ``checkpoint`` entries are stored under
    ``ext/<name>`` and ``late_rows`` added to the archive's count, in the same transaction, so a
    producer's progress commits atomically with the data. Caller holds the writer lock."""
    t0 = time.perf_counter()
    io0 = proc_io()
    env, meta = archive.env, archive.meta_db
    txn = env.begin(write=True)
    ctx = None
    try:
        cfg: ArchiveConfig = read_config(txn, meta)
        state: ArchiveState = read_state(txn, meta)
        tm, layout = cfg.time, cfg.layout_obj
        j = update_slot(cfg, state, at)
        first = state.last_slot is None
        stored_schema = read_schema(txn, meta)
        if table.num_columns == 0 and table.num_rows == 0:
            # "nothing to insert" from a producer that has seen no data yet, so knows no schema
            if stored_schema is None:
                stored_schema = pa.schema([(cfg.key_column, pa.int64()), (cfg.ts_column, pa.int64()), (cfg.exp_column, pa.int64())])
                new_schema = False
            else:
                new_schema = True
            table = stored_schema.empty_table()
        else:
            new_schema = True
        table, schema = conform_batch(table, cfg, stored_schema)
        check_rows(table, cfg, at)
        crash_point("update.validated")
        codec = BucketCodec(schema)

        ts = table.column(cfg.ts_column).to_numpy()
        exp = table.column(cfg.exp_column).to_numpy()
        bulk = first and j == 0
        k_ins = tm.slots(ts) if bulk else np.full(table.num_rows, j, dtype=np.int64)
        live = exp > at
        dropped = int(table.num_rows - np.count_nonzero(live))
        if dropped:
            table, k_ins, exp = table.filter(pa.array(live)), k_ins[live], exp[live]
        sub = layout.subindex_of(k_ins, tm.slots(exp))
        rows = with_ins_slot(table, k_ins).append_column("__ebb_sub", pa.array(sub))
        if rows.num_rows > 1:
            rows = rows.take(pc.sort_indices(rows, [("__ebb_sub", "ascending"), (cfg.key_column, "ascending"), (cfg.exp_column, "ascending")]))
        sub_sorted = rows.column("__ebb_sub").to_numpy()
        rows = rows.drop_columns(["__ebb_sub"])
        cut = np.searchsorted(sub_sorted, np.arange(layout.n + 1))

        deletion_slots = [] if first else list(range(state.last_slot + 1, j + 1))
        planned_delete = layout.delete_targets(deletion_slots)
        planned_insert = list(range(layout.n)) if bulk else layout.insert_targets(j)
        delete_set = {
            i for i in planned_delete
            if state.subindices[i].records and state.subindices[i].min_exp is not None and state.subindices[i].min_exp <= at
        }
        insert_set = {i for i in range(layout.n) if cut[i + 1] > cut[i]}
        touched = sorted(delete_set | insert_set)

        capacity = state.bucket_capacity
        if cfg.mode == "norebuild" and capacity is None and rows.num_rows:
            capacity = cfg.bucket_capacity or _initial_capacity(codec, rows, sub_sorted, cfg)
        txn_id = txn.id()
        oldest = oldest_reader_txn(env)
        ctx = UpdateContext(
            txn=txn, meta=meta, dir_db=archive.dir_dbs, data_dir=archive.data_dir, config=cfg, codec=codec,
            txn_id=txn_id, reusable_upto=(txn_id - 1) if oldest is None else min(oldest, txn_id - 1),
            capacity=capacity,
        )
        maintain = rebuild.maintain if cfg.mode == "rebuild" else norebuild.maintain
        results = []
        for step, i in enumerate(touched, 1):
            if progress:
                progress(f"I{i + 1}: {'delete+insert' if i in delete_set and i in insert_set else 'delete' if i in delete_set else 'insert'} ({step}/{len(touched)})")
            work = SubIndexWork(i, rows.slice(cut[i], cut[i + 1] - cut[i]), at if i in delete_set else None)
            res = maintain(ctx, work, state.subindices[i])
            state.subindices[i] = res.state
            results.append(res)
            crash_point("update.subindex_done")

        if new_schema and read_schema(txn, meta) is None:
            write_schema(txn, meta, schema)
        state.last_slot = j
        state.update_seq += 1
        state.bucket_capacity = capacity
        state.late_rows += late_rows
        for name, value in (checkpoint or {}).items():
            write_checkpoint(txn, meta, name, value)
        record = {
            "seq": state.update_seq,
            "time": at,
            "slot": j,
            "kind": "bulk" if bulk else "periodic",
            "slots_processed": deletion_slots,
            "input_rows": int(table.num_rows + dropped),
            "inserted": sum(r.inserted for r in results),
            "deleted": sum(r.deleted for r in results),
            "dropped_expired": dropped,
            "late_rows": late_rows,
            "planned_insert_into": [i + 1 for i in planned_insert],
            "planned_delete_from": [i + 1 for i in planned_delete],
            "subindices_read": [r.i + 1 for r in results if r.buckets_read or r.i in delete_set or cfg.mode == "rebuild"],
            "subindices_written": [r.i + 1 for r in results if r.buckets_written or r.buckets_freed or cfg.mode == "rebuild"],
            "subindices_touched": [r.i + 1 for r in results],
            "buckets_read": sum(r.buckets_read for r in results),
            "bytes_read": sum(r.bytes_read for r in results),
            "buckets_written": sum(r.buckets_written for r in results),
            "bytes_written": sum(r.bytes_written for r in results),
            "per_subindex": [r.to_dict() for r in results],
        }
        write_state(txn, meta, state)
        if ctx.garbage:
            write_garbage(txn, meta, read_garbage(txn, meta) + ctx.garbage)
        record.update(io_delta(io0, proc_io()))
        record["wall_seconds"] = round(time.perf_counter() - t0, 6)
        append_update_record(txn, archive.updates_db, state.update_seq, record)
        crash_point("update.before_commit")
        txn.commit()
        crash_point("update.after_commit")
        return record
    except BaseException:
        txn.abort()
        if ctx is not None:
            for path in ctx.created:
                try:
                    os.remove(path)
                except FileNotFoundError:
                    pass
        raise


def _initial_capacity(codec: BucketCodec, rows: pa.Table, sub_sorted: np.ndarray, cfg: ArchiveConfig) -> int:
    """Default NoRebuild slot size from the first non-empty load: about 2.5 buckets per
    (sub-index, key) pair."""
    sizes = codec.row_sizes(rows)
    key_starts = key_runs(rows, cfg.key_column)[:-1]
    sub_starts = np.flatnonzero(np.diff(sub_sorted, prepend=-1)) if sub_sorted.size else np.zeros(0, np.int64)
    pairs = np.union1d(key_starts, sub_starts).size
    return norebuild.default_capacity(float(sizes.sum()) / max(pairs, 1), int(sizes.max()))
