"""The advisor's counts: what the engine does, in expected numbers, update by update, for one
layout and one workload.

No record is generated, read or written. The archive's records are grouped in **cells**: the
records inserted by the update of slot k that expire in slot e, ``V * h[e - k]`` of them in
expectation (V records arrive per update; ``h[a]`` is the fraction whose expiration slot is a
slots after their update's). A cell lives in the sub-index the engine's own mapping gives it
(``Layout.subindex_of``) from its update until slot e. From the cells the simulation derives, for
each update, what ``storage/update_plan.py`` and ``storage/maintenance.py`` do:

- the touched sub-indices: the delete targets that hold records expiring now (their ``min_exp``
  is due) and the sub-indices receiving records (``update_plan.touched``);
- Rebuild: the bytes and blocks each touched sub-index's merge reads (blocks whose records have
  all expired are skipped unread) and writes (one new run, cut into blocks of ``block_bytes``
  plus a short block where each 32 MiB merge chunk ends; a sub-index rewritten without new
  records keeps its blocks, which shrink);
- NoRebuild: one new run per receiving sub-index, one section per expiration slot, each cut into
  blocks of ``block_bytes``; deletions move ``first_live`` over the runs of the touched
  sub-indices and drop runs whose last section expired;

and what a probe of a random key and a full scan right after the update visit
(``storage/read_plan.py``): the live runs and sections the plan walks, the blocks each key
stretch spans, the bytes read, the bytes returned.

A count that depends on whether a small group of records is empty (is a sub-index touched, does
a section exist) is weighted by the probability that a Poisson number of records with that mean
is at least one, so the counts stay expectations when cells hold less than a record.

The initial state is either the benchmarks' bulk load at tau (records of slots 1-p .. 0 still
valid at tau, one run per sub-index) or the steady state (every live cell written by its own
periodic update). ``simulate`` returns one row of counts per simulated update; the cost model
(``cost_model``) turns them into seconds.

The engine's own sizes (merge chunks, scan tasks) are storage's public
tuning values (``storage.tuning``), so the counts follow the engine when they change.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...storage.layout import Layout
from ...storage.tuning import MERGE_CHUNK_BYTES, SCAN_TASK_BYTES

SPREAD_SAMPLES = 8  # updates at which the rate-variation spread of a Rebuild update is computed

UPDATE_FEATURES = ("fixed", "input_records", "input_bytes", "touched", "files", "read_bytes", "read_records",
                   "written_bytes", "written_blocks", "runs_touched")
PROBE_FEATURES = ("fixed", "runs", "sections", "blocks", "bytes", "result_bytes")
SCAN_FEATURES = ("fixed", "tasks", "blocks", "bytes")


@dataclass(frozen=True)
class Flow:
    """The records each update brings, in expectation."""

    rate: float  # records handed to each update (before those already expired are dropped)
    exp_offsets: np.ndarray  # h[a], a = 0..p: fraction whose expiration slot is the update's + a (a = 0: dropped)
    keys: int  # distinct search keys, probed uniformly
    record_bytes: float  # stored bytes of one record (its encoded row and the hidden insertion slot)
    visible_bytes: float  # bytes of one record as a read returns it
    block_overhead: float  # bytes an encoded block adds to its records (IPC message header, padding)


@dataclass
class Trace:
    """Expected counts per recorded update (arrays of one value per update, in order). Update
    counts follow ``UPDATE_FEATURES``, reads after the update ``PROBE_FEATURES`` and
    ``SCAN_FEATURES``; ``rewrite_spread`` holds, at a few updates, sqrt(sum over insertion slots
    k of R_k^2), R_k the records of slot k a Rebuild update reads and rewrites (the rate's
    variation enters through it; 0 for NoRebuild)."""

    update: dict[str, np.ndarray]
    probe: dict[str, np.ndarray]
    scan: dict[str, np.ndarray]
    rewrite_spread: np.ndarray
    live_bytes: np.ndarray
    live_blocks: np.ndarray
    live_runs: np.ndarray
    kept_expired: np.ndarray  # records stored / records valid, after each update (NoRebuild sections wider than a slot)


def at_least_one(m: np.ndarray) -> np.ndarray:
    """P(N >= 1) for N Poisson with mean ``m``: does a group of records expected to hold m exist."""
    return -np.expm1(-np.maximum(m, 0.0))


def in_key_range(m: np.ndarray, keys: int) -> np.ndarray:
    """Probability that a key drawn uniformly from ``keys`` lies within [first, last] key of m
    records with uniform keys (only then does ``RunDescriptor.key_blocks`` return a block):
    1 - (2/K) sum_{t<K} (t/K)^m, which Euler-Maclaurin puts at (m-1)/(m+1) + 1/K (exact at m = 1, 2)."""
    m = np.maximum(np.asarray(m, dtype=float), 1.0)
    return np.minimum(1.0, (m - 1.0) / (m + 1.0) + 1.0 / keys)


def _section_reads(m: np.ndarray, flow: Flow, rows_per_block: float) -> np.ndarray:
    """Per section expected to hold ``m`` records: [exists, blocks a probe of a random key reads,
    bytes it reads, blocks a scan reads], each already weighted by the chance it exists. A key's
    records are one stretch of m/K records in a section cut into blocks of ``rows_per_block``."""
    exist = at_least_one(m)
    size = np.divide(m, exist, out=np.zeros_like(m), where=exist > 0)  # records, given it exists
    blocks = np.maximum(1.0, np.ceil(size / rows_per_block))
    rows = np.minimum(rows_per_block, np.maximum(size, 1.0))  # per block
    stretch = in_key_range(size, flow.keys) * np.minimum(blocks, 1.0 + size / flow.keys / rows)
    block_bytes = size * flow.record_bytes / blocks + flow.block_overhead
    return np.stack([exist, exist * stretch, exist * stretch * block_bytes, exist * blocks], axis=-1)


def _live_sums(values: np.ndarray, born: np.ndarray, dies: np.ndarray, steps: int) -> np.ndarray:
    """Row j (0..steps) of the result sums ``values`` (shape (m, c)) of the things born at or
    before update j that die after it."""
    b, d = np.clip(born, 0, steps + 1), np.clip(dies, 0, steps + 1)
    change = np.stack([np.bincount(b, v, steps + 2) - np.bincount(d, v, steps + 2) for v in values.T], axis=1)
    return np.cumsum(change, axis=0)[:steps + 1]


def simulate(layout: Layout, mode: str, flow: Flow, block_bytes: int, *, bulk: bool, warmup: int,
             steps: int, section_slots: int = 1) -> Trace:
    """Counts of ``steps`` updates (after ``warmup`` unrecorded ones) of an archive with
    ``layout`` in ``mode`` ("rebuild" | "norebuild") fed by ``flow``; ``bulk``: start from the
    initial bulk load at tau (slot 0), else from the steady state. NoRebuild sections are
    ``section_slots`` expiration slots wide (``ArchiveConfig.section_slot``)."""
    p, n = layout.p, layout.n
    h = np.asarray(flow.exp_offsets, dtype=float)
    if h.shape != (p + 1,):
        raise ValueError(f"exp_offsets has {h.size} entries; p = {p} needs {p + 1}")
    rb = flow.record_bytes
    rows_per_block = max(1.0, block_bytes / rb)
    total = warmup + steps
    cell = flow.rate * h[1:]  # records of cell (k, k + a), a = 1..p
    # every cell of the run: insertion slots k = 1-p .. total (row k + p - 1), offsets a = 1..p
    k = np.repeat(np.arange(1 - p, total + 1), p).reshape(-1, p)
    e = k + np.arange(1, p + 1)
    sub = layout.subindex_of(k.ravel(), e.ravel()).reshape(k.shape)
    vol = np.broadcast_to(cell, k.shape) * (e > 0)  # cells of the initial state that expired before 0 are gone
    valid_size = _flows(k, e, sub, vol, n, total)[2]  # records valid after each update: what reads return
    if mode == "norebuild" and section_slots > 1:  # a record is stored until its section's last slot
        e = (e // section_slots) * section_slots + section_slots - 1
    # per update j = 1..total: records deleted, arriving; sizes after each update (row 0: the start)
    expiring, arriving, size = _flows(k, e, sub, vol, n, total)
    # touched: the delete targets holding records expiring now (a cell lives in the sub-index the
    # layout maps it to, so only delete targets hold any: tests/test_advisor.py checks it), and
    # the sub-indices receiving records (storage/update_plan.touched)
    p_ins = at_least_one(arriving)
    p_touch = 1.0 - (1.0 - at_least_one(expiring)) * (1.0 - p_ins)
    rec = slice(warmup + 1, total + 1)  # the recorded updates

    upd = {f: np.zeros(steps) for f in UPDATE_FEATURES}
    upd["fixed"][:] = 1.0
    upd["input_records"][:] = flow.rate
    upd["input_bytes"][:] = flow.rate * rb
    upd["touched"] = p_touch[rec].sum(axis=1)
    prb = {f: np.zeros(steps) for f in PROBE_FEATURES}
    prb["fixed"][:] = 1.0
    prb["result_bytes"] = valid_size[rec].sum(axis=1) / flow.keys * flow.visible_bytes
    spread: list[float] = []
    if mode == "rebuild":
        blocks, cut_rows = _rebuild(flow, rows_per_block, k, sub, vol, size, expiring, p_ins, p_touch, upd, spread,
                                    warmup)
        exist = at_least_one(size[rec])
        m = np.divide(size[rec], exist, out=np.zeros_like(exist), where=exist > 0)
        # a key's records are the tail (latest exps) of its stretch at the last cut: deletions
        # thin blocks from the head of each key's stretch, so the key spans what its survivors span
        stretch = in_key_range(m, flow.keys) * np.minimum(
            blocks, 1.0 + np.divide(m / flow.keys, cut_rows, out=np.zeros_like(m), where=cut_rows > 0))
        per_block = np.divide(m * rb, blocks, out=np.zeros_like(m), where=blocks > 0) + flow.block_overhead
        prb["runs"] = prb["sections"] = live_runs = exist.sum(axis=1)
        prb["blocks"] = (exist * stretch).sum(axis=1)
        prb["bytes"] = (exist * stretch * per_block).sum(axis=1)
        live_blocks = blocks.sum(axis=1)
    else:
        live_runs, live_blocks = _norebuild(flow, rows_per_block, section_slots, bulk, k, e, sub, vol, size, arriving, p_ins, p_touch,
                                            upd, prb, rec)
    live_bytes = size[rec].sum(axis=1) * rb + live_blocks * flow.block_overhead
    scn = {"fixed": np.ones(steps), "blocks": live_blocks, "bytes": live_bytes,
           "tasks": live_runs + live_bytes / SCAN_TASK_BYTES}
    stored, valid = size[rec].sum(axis=1), valid_size[rec].sum(axis=1)
    kept = np.divide(stored, valid, out=np.ones_like(stored), where=valid > 0)
    return Trace(upd, prb, scn, np.array(spread or [0.0]), live_bytes, live_blocks, live_runs, kept)


def _flows(k: np.ndarray, e: np.ndarray, sub: np.ndarray, vol: np.ndarray, n: int, total: int
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(records leaving, records arriving, records held) per update 0..total (rows) and
    sub-index (columns), the cells (k, e) arriving at k (the initial state's at 0) and leaving at e."""
    initial = k <= 0
    ee = (e >= 1) & (e <= total)
    gone = np.bincount(e[ee] * n + sub[ee], vol[ee], (total + 1) * n).reshape(total + 1, n)
    came = np.zeros((total + 1, n))
    came[1:] = np.bincount((k[~initial] * n + sub[~initial]), vol[~initial], (total + 1) * n).reshape(total + 1, n)[1:]
    held = np.maximum(np.bincount(sub[initial], vol[initial], n) + np.cumsum(came - gone, axis=0), 0.0)
    return gone, came, held


def _rebuild(flow: Flow, rows_per_block: float, k: np.ndarray, sub: np.ndarray, vol: np.ndarray, size: np.ndarray,
             expiring: np.ndarray, p_ins: np.ndarray, p_touch: np.ndarray, upd: dict[str, np.ndarray],
             spread: list[float], warmup: int) -> tuple[np.ndarray, np.ndarray]:
    """Fills the Rebuild update counts and ``spread`` (at up to SPREAD_SAMPLES updates); returns
    each sub-index's blocks, and the rows per block when it was last cut, after each recorded
    update. Blocks have a history: a sub-index rewritten with new records is cut afresh; one
    rewritten without keeps its blocks, which lose their expired records (the first of each key's
    stretch, records being sorted by (key, exp)); blocks whose records all expire are skipped
    unread and dropped."""
    rb, ovh, keys = flow.record_bytes, flow.block_overhead, flow.keys
    total = size.shape[0] - 1
    before = size[:-1]  # row j - 1: the sub-index sizes the update of slot j starts from
    frac = np.minimum(np.divide(expiring[1:], before, out=np.zeros_like(before), where=before > 0), 1.0)
    recut = _recut(size[1:], rows_per_block, rb)
    touch, ins = p_touch[1:], p_ins[1:]
    blocks = np.zeros((total + 1, size.shape[1]))
    rows = np.zeros_like(blocks)  # rows per block at the last cut
    blocks[0] = _recut(size[0], rows_per_block, rb)
    rows[0] = np.minimum(rows_per_block, size[0])
    unread = np.zeros_like(before)
    for j in range(total):
        # the expiring head of each key's stretch covers whole blocks only beyond a block's length
        head = frac[j] * before[j] / keys
        whole = keys * np.maximum(0.0, np.divide(head, rows[j], out=np.zeros_like(head), where=rows[j] > 0) - 1.0)
        unread[j] = np.where(frac[j] >= 1.0, 1.0, np.minimum(1.0, np.divide(whole, blocks[j], out=np.zeros_like(whole),
                                                                             where=blocks[j] > 0)))
        kept = blocks[j] * (1.0 - unread[j])
        blocks[j + 1] = (1.0 - touch[j]) * blocks[j] + ins[j] * recut[j] + (touch[j] - ins[j]) * kept
        rows[j + 1] = (1.0 - ins[j]) * rows[j] + ins[j] * np.minimum(rows_per_block, size[j + 1])
    r = slice(warmup, total)
    read_blocks = touch[r] * blocks[:-1][r] * (1.0 - unread[r])
    written_blocks = ins[r] * recut[r] + (touch[r] - ins[r]) * blocks[:-1][r] * (1.0 - unread[r])
    upd["read_records"] = (touch[r] * before[r] * (1.0 - unread[r])).sum(axis=1)
    upd["read_bytes"] = upd["read_records"] * rb + read_blocks.sum(axis=1) * ovh
    upd["written_blocks"] = written_blocks.sum(axis=1)
    upd["written_bytes"] = (touch[r] * size[1:][r]).sum(axis=1) * rb + upd["written_blocks"] * ovh
    upd["files"] = (touch[r] * at_least_one(size[1:][r])).sum(axis=1)
    upd["runs_touched"] = (touch[r] * at_least_one(before[r])).sum(axis=1)
    p = sub.shape[1]
    for j in np.unique(np.linspace(warmup + 1, total, SPREAD_SAMPLES).astype(int)):
        held_rows = np.arange(j - p, j) - k[0, 0]  # slots j-p .. j-1: stored before the update of slot j
        held = vol[held_rows] * (k[held_rows] + np.arange(1, p + 1) >= j)
        spread.append(float(np.sqrt(((held * p_touch[j][sub[held_rows]]).sum(axis=1) ** 2).sum())))
    return blocks[warmup + 1:], rows[warmup + 1:]


def _norebuild(flow: Flow, rows_per_block: float, group: int, bulk: bool, k: np.ndarray, e: np.ndarray, sub: np.ndarray,
               vol: np.ndarray, size: np.ndarray, arriving: np.ndarray, p_ins: np.ndarray, p_touch: np.ndarray,
               upd: dict[str, np.ndarray], prb: dict[str, np.ndarray], rec: slice) -> tuple[np.ndarray, np.ndarray]:
    """Fills the NoRebuild update and probe counts; returns the live runs and blocks after each
    recorded update. Nothing here has a history beyond the cells: a section is a cell (an
    update's records of one expiration slot; in the bulk load's runs, all records of one
    sub-index and slot), a run an update's records of one sub-index, dying with its last section."""
    n, total, p = size.shape[1], size.shape[0] - 1, k.shape[1]
    cells = vol > 0
    own = cells & (k > 0) if bulk else cells  # cells in runs of their own update
    owner = (k - k[0, 0]) * n + sub
    run_m = np.bincount(owner[own], vol[own], k.size // k.shape[1] * n)
    run_dies = np.zeros(run_m.size, dtype=np.int64)
    np.maximum.at(run_dies, owner[own], e[own])
    ids = np.flatnonzero(run_m > 0)
    runs = [(at_least_one(run_m[ids]), ids % n, np.maximum(ids // n + k[0, 0], 0), run_dies[ids])]
    # a section: an update's cells of one sub-index whose records share a section slot
    sec_of = (k[own] - k[0, 0]) * (int(e.max()) + 1) * n + e[own] * n + sub[own]
    sec_ids, where = np.unique(sec_of, return_inverse=True)
    sec_m = np.bincount(where, vol[own], sec_ids.size)
    sec_k = sec_ids // ((int(e.max()) + 1) * n) + k[0, 0]
    sections = [(_section_reads(sec_m, flow, rows_per_block), np.maximum(sec_k, 0), sec_ids // n % (int(e.max()) + 1))]
    if bulk:  # the bulk load at 0: one run per sub-index, a section per (sub-index, expiration slot)
        first = cells & (k <= 0)
        per = np.zeros((n, int(e.max()) + 1))
        np.add.at(per, (sub[first], e[first]), vol[first])
        ii, ss = np.nonzero(per)
        sections.append((_section_reads(per[ii, ss], flow, rows_per_block), np.zeros(ii.size, dtype=np.int64), ss))
        dies = np.zeros(n, dtype=np.int64)
        np.maximum.at(dies, ii, ss)
        runs.append((at_least_one(per.sum(axis=1)), np.arange(n), np.zeros(n, dtype=np.int64), dies))
    sec_live = _live_sums(*(np.concatenate(x) for x in zip(*sections)), total)
    exist, which, born, dies = (np.concatenate(x) for x in zip(*runs))
    runs_by_sub = _live_sums(exist[:, None] * (which[:, None] == np.arange(n)), born, dies, total)
    # the sections an update writes (its records of each section slot), averaged over the updates' phases
    upd["written_blocks"][:] = float(np.mean([_section_reads(np.bincount(
        (ph + np.arange(1, p + 1)) // group - ph // group, flow.rate * np.asarray(flow.exp_offsets[1:], dtype=float)),
        flow, rows_per_block)[:, 3].sum() for ph in range(group)]))
    upd["written_bytes"] = arriving[rec].sum(axis=1) * flow.record_bytes + upd["written_blocks"] * flow.block_overhead
    upd["files"] = p_ins[rec].sum(axis=1)
    upd["runs_touched"] = (p_touch[rec] * runs_by_sub[rec.start - 1:rec.stop - 1]).sum(axis=1)
    prb["runs"] = runs_by_sub[rec].sum(axis=1)
    prb["sections"], prb["blocks"], prb["bytes"] = sec_live[rec, 0], sec_live[rec, 1], sec_live[rec, 2]
    return prb["runs"], sec_live[rec, 3]


def _recut(records: np.ndarray, rows_per_block: float, record_bytes: float) -> np.ndarray:
    """Blocks of a run written by a Rebuild merge: full blocks, plus a short one at the end of
    each merge chunk."""
    return np.where(records > 0, np.ceil(records / rows_per_block) + np.floor(records * record_bytes / MERGE_CHUNK_BYTES), 0.0)
