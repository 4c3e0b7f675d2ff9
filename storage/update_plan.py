"""The pure part of an update: slots, the sub-index of each record, and what the update touches.

Nothing here reads or writes a file. Given the configuration, the last committed slot and a
validated batch, ``plan_update`` computes each record's insertion and expiration slot and
sub-index (docs/spec.md sections 2 and 3), drops records already expired, orders the rest the
way maintenance writes them (NoRebuild: by section, ``ArchiveConfig.section_slot``), and lists
the sub-indices the update may insert into and delete from. ``touched`` then narrows the
deletions to sub-indices that hold records the update deletes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .arrow_np import to_np
from .block_format import INS_SLOT
from .config import ArchiveConfig
from .manifest import ArchiveState


@dataclass
class UpdatePlan:
    slot: int  # j: this update runs at T_j
    time: int  # T_j
    bulk: bool  # the initial load at tau: insertion slot = slot(ts)
    deletion_slots: tuple[int, int] | None  # [first, last] slots whose deletions run now
    planned_insert: list[int]  # sub-indices (0-based) records of this update may go to
    planned_delete: list[int]  # sub-indices that may hold records expiring in deletion_slots
    rows: pa.Table  # live input records + INS_SLOT, sorted by (sub-index, [section slot], key, exp)
    exp_slots: np.ndarray  # NoRebuild section of each row of ``rows`` (``ArchiveConfig.section_slot``)
    cuts: np.ndarray  # rows of sub-index i are rows[cuts[i]:cuts[i+1]]
    input_rows: int
    dropped: int  # records already expired when loaded (not stored)

    def rows_of(self, i: int) -> tuple[pa.Table, np.ndarray]:
        a, b = int(self.cuts[i]), int(self.cuts[i + 1])
        return self.rows.slice(a, b - a), self.exp_slots[a:b]


def plan_update(cfg: ArchiveConfig, last_slot: int | None, j: int, table: pa.Table) -> UpdatePlan:
    """The plan of the update of slot ``j`` with the validated ``table`` (archive schema)."""
    tm, layout = cfg.time, cfg.layout_obj
    at = tm.time_of(j)
    bulk = last_slot is None and j == 0
    ts = table.column(cfg.ts_column).to_numpy()
    exp = table.column(cfg.exp_column).to_numpy()
    live = exp > at
    dropped = int(table.num_rows - np.count_nonzero(live))
    if dropped:
        table, ts, exp = table.filter(pa.array(live)), ts[live], exp[live]
    k_ins, k_exp, sub = subindex_of_rows(cfg, bulk, j, ts, exp)
    rows = table.append_column(pa.field(INS_SLOT, pa.int64(), nullable=False), pa.array(k_ins, pa.int64()))
    rows, exp_slots, cuts = place(cfg, rows, exp, cfg.section_slot(k_exp), sub)
    if last_slot is None:
        deletion, planned_delete = None, []
    else:
        deletion = (last_slot + 1, j)
        if j - last_slot > tm.p:
            planned_delete = list(range(layout.n))  # more than a lifetime missed: every column
        else:
            planned_delete = layout.delete_targets(range(last_slot + 1, j + 1))
    return UpdatePlan(
        slot=j, time=at, bulk=bulk, deletion_slots=deletion,
        planned_insert=list(range(layout.n)) if bulk else layout.insert_targets(j),
        planned_delete=planned_delete, rows=rows, exp_slots=exp_slots, cuts=cuts,
        input_rows=table.num_rows + dropped, dropped=dropped,
    )


def subindex_of_rows(cfg: ArchiveConfig, bulk: bool, j: int, ts: np.ndarray, exp: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(insertion slot, expiration slot, sub-index) of each record of the update of slot ``j``
    (docs/spec.md section 3); ``bulk``: the initial load, whose insertion slot is slot(ts)."""
    tm = cfg.time
    k_ins = tm.slots(ts) if bulk else np.full(len(ts), j, dtype=np.int64)
    k_exp = tm.slots(exp)
    return k_ins, k_exp, cfg.layout_obj.subindex_of(k_ins, k_exp)


def place(cfg: ArchiveConfig, rows: pa.Table, exp: np.ndarray, k_exp: np.ndarray, sub: np.ndarray
          ) -> tuple[pa.Table, np.ndarray, np.ndarray]:
    """``rows`` (each with its sub-index ``sub`` and NoRebuild section slot ``k_exp``) in the
    order maintenance writes them, by (sub-index, section slot in NoRebuild mode, key, exp);
    their section slots in that order; and cuts: the rows of sub-index i are [cuts[i], cuts[i+1])."""
    order = _order(rows.column(cfg.key_column), exp, sub, k_exp if cfg.mode == "norebuild" else None)
    if rows.num_rows > 1:
        rows = rows.take(pa.array(order))
    return rows, k_exp[order], np.searchsorted(sub[order], np.arange(cfg.n + 1))


def _order(keys: pa.ChunkedArray, exp: np.ndarray, sub: np.ndarray, k_exp: np.ndarray | None) -> np.ndarray:
    """Row order by (sub-index, expiration slot if given, key, exp)."""
    if len(exp) == 0:
        return np.zeros(0, np.int64)
    group = sub if k_exp is None else sub * (int(k_exp.max()) - int(k_exp.min()) + 1) + (k_exp - k_exp.min())
    if pa.types.is_integer(keys.type):
        k = to_np(keys)
        cols = (group, k, exp)
        spans = [int(c.max()) - int(c.min()) for c in cols]  # Python ints: no overflow
        widths = [v.bit_length() for v in spans]
        if sum(widths) <= 63:  # one int64 sort key: a single argsort instead of a multi-key sort
            packed = np.zeros(len(exp), np.int64)
            for c, w in zip(cols, widths):
                packed = (packed << w) | (c - c.min()).astype(np.int64)
            return np.argsort(packed, kind="stable")
    t = pa.table({"g": group, "k": keys, "e": exp})
    return pc.sort_indices(t, [("g", "ascending"), ("k", "ascending"), ("e", "ascending")]).to_numpy()


def touched(cfg: ArchiveConfig, plan: UpdatePlan, state: ArchiveState) -> tuple[set[int], set[int]]:
    """(delete set, insert set): planned deletion targets holding records the update deletes (with
    exp <= T; in NoRebuild, a section whose last slot is due), and the sub-indices that receive
    records."""
    def due(min_exp: int | None) -> bool:  # the section of the earliest exp holds the earliest section slot
        return min_exp is not None and int(cfg.section_slot(cfg.time.slots(np.array([min_exp])))[0]) <= plan.slot
    deletes = {i for i in plan.planned_delete if due(state.subindices[i].min_exp)}
    inserts = {i for i in range(len(plan.cuts) - 1) if plan.cuts[i + 1] > plan.cuts[i]}
    return deletes, inserts
