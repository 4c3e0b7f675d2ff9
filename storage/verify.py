"""``ebb verify``: checks every invariant of one committed version, read-only.

For every sub-index (of the current layout and of any layout being drained after a migration)
and each of its live runs: the descriptor (sealed in the metadata) and its block entries; every
live block's checksum and page sums, row count, exp range, largest ts, first and last key, decoded
with the columns of the schema version it was written under; records sorted by
(key, exp) within each section; NoRebuild sections holding exactly their expiration slot; no
record expired as of the last update (except in draining layouts, where records expire in
place) or from the future; every record in the sub-index docs/spec.md section 3 assigns it
under its layout; sizes equal to the state's. Unreferenced files are reported as notes (an
interrupted update leaves them; the next update removes them).
"""

from __future__ import annotations

import os
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .archive import PublishedArchive
from .block_format import decode_block, older_physical
from . import key_filter
from .checksum import page_sums
from .config import ArchiveConfig
from .disk_format import FILTER_UNIT_BYTES, FORMAT_VERSION, INS_SLOT_COLUMN, PAGE_BYTES, physical_schema
from .errors import CorruptionError, EbbError
from .files import parse_run_file
from .leases import LEASE_DIR
from .manifest import LiveRun, check_all, read_garbage, read_run
from .published import META_DIR, copies, current_copy, open_copy
from .task_reader import read_block_bytes


def verify(archive, progress: Callable[[int, int], None] | None = None) -> tuple[list[str], list[str]]:
    """Returns (problems, notes). Problems mean the archive is damaged; notes are harmless
    leftovers (e.g. files of an interrupted update, removed by the next update). ``progress``
    is called with (runs checked, runs in all) after each run, the bulk of the work."""
    problems: list[str] = []
    notes: list[str] = []
    try:
        snap = archive.snapshot()
    except CorruptionError:
        raise  # the version cannot be read at all: the CLI reports it with the corruption code
    except EbbError as e:
        return [f"metadata: {e}"], notes
    if archive.publishes or isinstance(archive, PublishedArchive):
        problems += check_published(archive.data_dir)
    with snap:
        problems += check_all(snap.txn)
        cfg, state = snap.config, snap.state
        if len(state.subindices) != cfg.n:
            return [f"state lists {len(state.subindices)} sub-indices, the layout needs {cfg.n}"], notes
        if state.update_seq and snap.schema is None:
            problems.append("updates were committed but no schema is stored")
        layouts = [(cfg, state.subindices, "")]
        for k, d in enumerate(state.draining, 1):
            layouts.append((ArchiveConfig(**d.config), d.subindices, f"draining layout {k}, "))
        total, checked = sum(len(s.runs) for _, subs, _ in layouts for s in subs), 0
        for lcfg, subs, label in layouts:
            for i, s in enumerate(subs):
                if lcfg.mode == "rebuild":
                    problems += _check_key_ranges(snap, i, s.runs, label)
                for run in s.runs:
                    try:
                        problems += _check_run(archive, snap, lcfg, i, run, label)
                    except EbbError as e:
                        problems.append(f"{label}I{i + 1}, run {run.name}: {e}")
                    checked += 1
                    if progress:
                        progress(checked, total)
        referenced = state.run_names()
        try:
            pending = {g[0] for g in read_garbage(snap.txn)}
        except CorruptionError as e:
            problems.append(str(e))
            pending = set()
        data_dir = archive.data_dir
        for name in sorted(os.listdir(data_dir)):
            if name in referenced:
                continue
            if name == META_DIR and (archive.publishes or isinstance(archive, PublishedArchive)):
                notes.append(f"{name}: the metadata published for readers that mount only the data directory")
            elif name == LEASE_DIR:
                notes.append(f"{name}: leases of reads in other processes on the versions they read")
            elif name in pending:
                notes.append(f"{name}: replaced, deleted once no reader needs it")
            elif parse_run_file(name) is not None:
                notes.append(f"{name}: left by an interrupted update; removed by the next update")
            else:
                notes.append(f"{name}: not an ebb file")
    return problems, notes


def check_published(data_dir: str) -> list[str]:
    """Problems with the metadata published in ``data_dir``: its pointer, and in every copy kept
    the pages (``page_walk``), every entry's seal and the root."""
    try:
        current_copy(data_dir, FORMAT_VERSION)
    except EbbError as e:
        return [f"published metadata: {e}"]
    out = []
    for copy in copies(data_dir):
        try:
            env = open_copy(copy)
        except EbbError as e:
            if "already open in this process" not in str(e):  # LMDB's one-environment rule: a
                out.append(f"published copy {os.path.basename(copy)}: {e}")  # reader here checked it
            continue
        try:
            with env.begin() as txn:
                out += [f"published copy {os.path.basename(copy)}: {p}" for p in check_all(txn)]
        finally:
            env.close()
    return out


def _check_key_ranges(snap, i: int, runs: list[LiveRun], label: str) -> list[str]:
    """A Rebuild sub-index's runs (one, or one per Spark task that wrote it) hold disjoint key ranges."""
    ranges = []
    for run in runs:
        desc = snap.descriptor(run.name)
        ranges.append((desc.first_keys[run.first_live], desc.last_keys[-1], run.name))
    ranges.sort(key=lambda r: r[0])
    return [f"{label}I{i + 1}: Rebuild runs {a[2]} and {b[2]} overlap in key range" for a, b in zip(ranges, ranges[1:])
            if a[1] >= b[0]]


def _check_run(archive, snap, cfg: ArchiveConfig, i: int, run: LiveRun, label: str) -> list[str]:
    """Problems with one live run of sub-index ``i`` of a layout with configuration ``cfg``
    (``label`` names a draining layout, whose runs keep expired records until dropped whole)."""
    name = f"{label}I{i + 1}, run {run.name}"
    desc = read_run(snap.txn, run.name)  # with its page sums, which are checked below
    out = []
    if desc.subindex != i or desc.name != run.name:
        return [f"{name}: its descriptor belongs to I{desc.subindex + 1}, run {desc.name}"]
    expect = LiveRun.of(desc, run.first_live)
    if expect != run:
        return [f"{name}: the state's sizes {run} differ from the descriptor's {expect}"]
    blocks = desc.entries(run.first_live)
    path = os.path.join(archive.data_dir, run.name)
    if not os.path.exists(path):
        return [f"{name}: its file is missing"]
    if os.path.getsize(path) < desc.file_bytes:
        return [f"{name}: its file has {os.path.getsize(path)} bytes, its blocks need {desc.file_bytes}"]
    if cfg.mode == "norebuild" and (np.diff(desc.blocks["slot"]) < 0).any():
        out.append(f"{name}: sections are not in expiration-slot order")
    layout, tm = cfg.layout_obj, cfg.time
    last_time, last_slot = snap.time, snap.state.last_slot
    key, ts, exp = cfg.key_column, cfg.ts_column, cfg.exp_column
    prev = None  # (slot, last key, last exp) of the previous block
    source = archive.open_files.source(run.name, sequential=True)
    index = {int(o): b for b, o in enumerate(desc.blocks["offset"])}
    phys = older_physical(physical_schema(snap.schema), snap.schemas.columns(desc.schema))  # the run's own columns
    filters = _filters(path, desc, name, out)
    run_hashes = [] if filters is not None and desc.run_filter_units else None  # of its live keys
    for e, data in read_block_bytes(source, blocks, name):
        batch = decode_block(data, phys, e.offset, e.rows, e.checksum, name)
        b = index[e.offset]
        if desc.sums is not None and not np.array_equal(page_sums(data, PAGE_BYTES), desc.sums[desc.page_start[b]:desc.page_start[b + 1]]):
            out.append(f"{name}, block at byte {e.offset}: page sums differ from the descriptor's")
        k = batch.column(key)
        ev, tv = batch.column(exp).to_numpy(), batch.column(ts).to_numpy()
        ins = batch.column(INS_SLOT_COLUMN).to_numpy()
        where = f"{name}, block at byte {e.offset}"
        if filters is not None:
            lo, hi = int(desc.filter_at[b] - desc.filter_offset), int(desc.filter_at[b + 1] - desc.filter_offset)
            if filters[lo:hi] != key_filter.block_filter(key_filter.key_hashes(k), lo // FILTER_UNIT_BYTES, desc.filter_bits):
                out.append(f"{where}: its key filter differs from its keys' (probes search a block whose filter unit "
                           "fails its sum)")
        if run_hashes is not None:
            run_hashes.append(key_filter.key_hashes(k))
        first, last = k[0].as_py(), k[-1].as_py()
        if (first, last) != (desc.first_keys[b], desc.last_keys[b]):
            out.append(f"{where}: first/last key differ from the descriptor's")
        if (int(ev.min()), int(ev.max()), int(tv.max())) != (e.min_exp, e.max_exp, e.max_ts):
            out.append(f"{where}: exp range or largest ts differ from the descriptor's")
        if not _sorted(k, ev):
            out.append(f"{where}: records are not sorted by (key, exp)")
        if prev is not None and prev[0] == e.slot and (prev[1] > first or (prev[1] == first and prev[2] > ev[0])):
            out.append(f"{where}: out of (key, exp) order with the block before it")
        prev = (e.slot, last, int(ev[-1]))
        if cfg.mode == "norebuild" and (cfg.section_slot(tm.slots(ev)) != e.slot).any():
            out.append(f"{where}: records whose expiration slot is not in the section's {e.slot}")
        # a section wider than a slot keeps its expired records until its last slot is due
        kept = cfg.mode == "norebuild" and cfg.section_slots > 1 and last_slot is not None and e.slot > last_slot
        if (ev <= last_time).any() and not label and not kept:
            out.append(f"{where}: {int((ev <= last_time).sum())} records expired at or before the last update ({last_time})")
        if (tv > last_time).any():
            out.append(f"{where}: {int((tv > last_time).sum())} records start after the last update")
        if (ev <= tv).any():
            out.append(f"{where}: records with exp <= ts")
        if not cfg.accept_overlong and (ev - tv > cfg.max_lifetime).any():
            out.append(f"{where}: records with a lifetime over S")
        if last_slot is not None and (ins > last_slot).any():
            out.append(f"{where}: records with an insertion slot after the last update")
        bad = layout.subindex_of(ins, tm.slots(ev)) != i
        if bad.any():
            out.append(f"{where}: {int(bad.sum())} records belong to another sub-index (docs/spec.md section 3)")
    if run_hashes:
        out += _check_run_filter(filters[int(desc.filter_at[-1] - desc.filter_offset):], desc, np.concatenate(run_hashes), name)
    return out


def _check_run_filter(run_filter: bytes, desc, hashes: np.ndarray, name: str) -> list[str]:
    """Problems with a run filter (NoRebuild runs): units that fail their sums (a probe then
    searches the run's sections, as if it had none), or live keys it rules out. Its dead
    blocks' keys may be gone (their pages given back), so it is not rebuilt to compare."""
    out = []
    first_unit = int(desc.filter_at[-1] - desc.filter_offset) // FILTER_UNIT_BYTES
    failed = int((~key_filter.sums_hold(run_filter, first_unit)).sum())
    if failed:
        out.append(f"{name}: {failed} units of its run filter fail their sums (probes search all its sections)")
    missed = int((~key_filter.may_hold(run_filter, hashes)).sum())
    if missed:
        out.append(f"{name}: its run filter rules out {missed} of its live records' keys")
    return out


def _filters(path: str, desc, name: str, out: list[str]) -> bytes | None:
    """The key filters of run ``desc`` (None: written without them, or cut short: a problem is
    added to ``out``)."""
    if desc.filter_offset is None:
        return None
    start, end = int(desc.filter_at[0]), desc.filter_end  # the blocks' filters, then the run filter
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    if len(data) != end - start:
        out.append(f"{name}: its file ends inside its key filters")
        return None
    return data


def _sorted(k: pa.Array, ev: np.ndarray) -> bool:
    if len(k) < 2:
        return True
    a, b = k.slice(0, len(k) - 1), k.slice(1)
    gt = pc.greater(a, b).to_numpy(zero_copy_only=False)
    eq = pc.equal(a, b).to_numpy(zero_copy_only=False)
    return not (gt | (eq & (ev[:-1] > ev[1:]))).any()
