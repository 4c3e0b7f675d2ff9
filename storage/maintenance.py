"""Maintenance of one touched sub-index in one update: Rebuild or NoRebuild.

Both write only new files; what they return is applied by the commit.

- **Rebuild** rewrites the sub-index: its one run is streamed in file order, in sequential reads
  of adjacent blocks of at most ``tuning.SPAN_BYTES`` (8 MiB; a larger block is read alone),
  wholly expired blocks skipped unread, expired records dropped, and merged with the update's
  new records of that sub-index, ``tuning.MERGE_CHUNK_BYTES`` (32 MiB) of old blocks at a time,
  into a new run sorted by (key, exp), so each key's records are one contiguous stretch. The old
  run becomes garbage.
- **NoRebuild** never rewrites a record. New records become one new run, sectioned by
  section slot (``ArchiveConfig.section_slot``: the expiration slot, or the last of its group of
  ``section_slots``), sorted by (section slot, key, exp), no block spanning two sections. Deleting
  slot j from a run is a metadata change: its blocks of sections <= j hold exactly its records
  whose section slot is <= j (all with exp <= T_j), always a prefix of the file, so the run's
  first live block moves past them (the prefix's disk space is reclaimed once no reader needs
  it; a run with no live block is dropped). A probe visits at most one stretch of blocks per live (run, section).

Memory is bounded by the update's new records of the sub-index plus one merge chunk; nothing
grows with keys the update does not mention.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import files
from .block_format import older_physical, physical_schema
from .config import ArchiveConfig
from .files import OpenFiles, run_file_name
from .manifest import LiveRun, SubIndexState
from .run_descriptor import RunDescriptor
from .run_writer import RunWriter
from .schema import SchemaHistory, widen
from .task_reader import read_blocks
from .tuning import MERGE_CHUNK_BYTES


@dataclass
class SubIndexChange:
    """What maintenance did to sub-index ``i``: its new live runs and the I/O it cost."""

    i: int
    runs: list[LiveRun]
    new_runs: list[RunDescriptor] = field(default_factory=list)
    dropped_runs: list[str] = field(default_factory=list)  # no longer referenced: files become garbage
    dead_prefixes: list[tuple[str, int]] = field(default_factory=list)  # (file, end): blocks before end are dead
    inserted: int = 0
    deleted: int = 0
    blocks_read: int = 0
    bytes_read: int = 0
    blocks_written: int = 0
    bytes_written: int = 0

    def to_dict(self) -> dict:
        return {"subindex": self.i + 1, "inserted": self.inserted, "deleted": self.deleted,
                "blocks_read": self.blocks_read, "bytes_read": self.bytes_read,
                "blocks_written": self.blocks_written, "bytes_written": self.bytes_written,
                "runs": len(self.runs)}


@dataclass
class MaintenanceContext:
    """What every sub-index of one update shares."""

    config: ArchiveConfig
    schemas: SchemaHistory  # the archive schema new runs are written under, and the older ones
    data_dir: str
    open_files: OpenFiles
    descriptor: Callable[[str], RunDescriptor]
    update_seq: int
    created: list[str]  # paths of files this update created (removed if it does not commit); the
    # update syncs them all before its commit

    @property
    def schema(self) -> pa.Schema:
        return self.schemas.schema

    def writer(self, i: int, run_filter: bool = False) -> RunWriter:
        name = run_file_name(i, self.update_seq)
        w = RunWriter(self.data_dir, name, i, self.config.key_column, self.config.ts_column,
                      self.config.exp_column, self.config.block_bytes, self.schemas.current, run_filter)
        self.created.append(w.path)
        return w


def norebuild(ctx: MaintenanceContext, i: int, current: SubIndexState, rows: pa.Table, exp_slots: np.ndarray,
              delete_slot: int | None) -> SubIndexChange:
    """Deletes the sections of slot ``delete_slot`` and earlier (None: no deletion) and adds
    ``rows`` (sorted by (section slot, key, exp); ``exp_slots`` their section slots) as a new run."""
    ch = SubIndexChange(i, [])
    for run in current.runs:
        if delete_slot is None:
            ch.runs.append(run)
            continue
        desc = ctx.descriptor(run.name)
        first = max(run.first_live, desc.first_live_after(delete_slot))
        ch.deleted += int(desc.blocks["rows"][run.first_live:first].sum())
        live = LiveRun.of(desc, first)
        if live is None:
            ch.dropped_runs.append(run.name)
        else:
            ch.runs.append(live)
            if first > run.first_live:
                ch.dead_prefixes.append((run.name, int(desc.blocks["offset"][first])))
    if rows.num_rows:
        w = ctx.writer(i, run_filter=True)  # its sections each span the key range: probes check this first
        w.add(rows, exp_slots)
        desc = w.finish(sync=False)
        ch.new_runs.append(desc)
        ch.runs.append(LiveRun.of(desc, 0))
        ch.inserted = rows.num_rows
        ch.blocks_written, ch.bytes_written = int(desc.blocks.size), desc.file_bytes
    return ch


@dataclass(frozen=True)
class RunSlice:
    """Blocks [start, stop) of a live run: what one writer of a Rebuild sub-index rewrites."""

    name: str
    start: int
    stop: int


def key_ordered_slices(ctx: MaintenanceContext, current: SubIndexState) -> list[RunSlice]:
    """The live runs of a Rebuild sub-index, whole, in key order. A Rebuild sub-index has one run,
    or (after an update written by several Spark tasks) runs with disjoint, ordered key ranges."""
    slices = []
    for run in current.runs:
        desc = ctx.descriptor(run.name)
        slices.append((desc.first_keys[run.first_live], RunSlice(run.name, run.first_live, len(desc.blocks))))
    return [s for _, s in sorted(slices, key=lambda x: x[0])]


def rebuild(ctx: MaintenanceContext, i: int, current: SubIndexState, rows: pa.Table, delete_upto: int | None) -> SubIndexChange:
    """Rewrites sub-index i as one run: its records with exp > ``delete_upto`` (all if None)
    merged with ``rows`` (sorted by (key, exp))."""
    ch = rewrite(ctx, i, key_ordered_slices(ctx, current), rows, delete_upto)
    ch.dropped_runs = [r.name for r in current.runs]
    return ch


def rewrite(ctx: MaintenanceContext, i: int, slices: list[RunSlice], rows: pa.Table, delete_upto: int | None,
            key_range: tuple = (None, None)) -> SubIndexChange:
    """Writes one new run of sub-index i: the records of ``slices`` (key-ordered, disjoint key
    ranges) with exp > ``delete_upto`` (all if None) and keys in ``key_range`` = [lo, hi) (None:
    open), merged with ``rows`` (sorted by (key, exp)). The caller decides which runs it replaces."""
    ch = SubIndexChange(i, [])
    key = ctx.config.key_column
    w = ctx.writer(i)
    old = (chunk for s in slices for chunk in _old_chunks(ctx, s, ch, delete_upto, key_range))
    new_keys = rows.column(key)
    pos = 0
    held = None  # old records of the last key of the previous chunk (it may continue)
    for chunk in old:
        if held is not None:
            chunk = pa.concat_tables([held, chunk])
        last = chunk.column(key)[-1]
        cut = _first_of_last_key(chunk.column(key))
        held = chunk.slice(cut)
        upto = _count_less(new_keys, last, pos)
        _merge_into(w, chunk.slice(0, cut), rows.slice(pos, upto - pos), key, ctx.config.exp_column)
        pos = upto
    rest = rows.slice(pos)
    _merge_into(w, held if held is not None else rows.schema.empty_table(), rest, key, ctx.config.exp_column)
    ch.inserted = rows.num_rows
    desc = w.finish(sync=False)
    if desc.blocks.size:
        ch.new_runs.append(desc)
        ch.runs.append(LiveRun.of(desc, 0))
    else:  # nothing left: the new file is not needed
        ctx.created.remove(w.path)
        files.FS.remove(w.path)
    ch.blocks_written, ch.bytes_written = int(desc.blocks.size), desc.file_bytes
    return ch


def _old_chunks(ctx: MaintenanceContext, piece: RunSlice, ch: SubIndexChange, delete_upto: int | None,
                key_range: tuple = (None, None)) -> Iterator[pa.Table]:
    """The slice's records with exp > ``delete_upto`` and keys in ``key_range`` [lo, hi), in
    (key, exp) order, as tables of about MERGE_CHUNK_BYTES of blocks (read sequentially, at most
    SPAN_BYTES a read), in the newest schema (a run written under an older one gets nulls in the
    columns added since). Wholly
    expired blocks are skipped unread, unless they cross the key range's edge (two parts read
    those, and each counts only its own records)."""
    desc = ctx.descriptor(piece.name)
    lo, hi = key_range
    key, exp = ctx.config.key_column, ctx.config.exp_column
    blocks = desc.entries(piece.start, piece.stop)
    crossing = {e.offset for b, e in enumerate(blocks, piece.start)
                if (lo is not None and desc.first_keys[b] < lo) or (hi is not None and desc.last_keys[b] >= hi)}
    if delete_upto is not None:
        ch.deleted += sum(e.rows for e in blocks if e.max_exp <= delete_upto and e.offset not in crossing)
        blocks = [e for e in blocks if e.max_exp > delete_upto or e.offset in crossing]
    source = ctx.open_files.source(piece.name, sequential=True)
    schema = physical_schema(ctx.schema)
    stored = older_physical(schema, ctx.schemas.columns(desc.schema))
    parts, size = [], 0
    for e, batch in read_blocks(source, blocks, stored, f"sub-index I{ch.i + 1}, run {piece.name}"):
        ch.blocks_read += 1
        ch.bytes_read += e.length
        if e.offset in crossing:
            k = batch.column(key)
            inside = pc.and_(pc.greater_equal(k, lo) if lo is not None else pc.is_valid(k),
                             pc.less(k, hi) if hi is not None else pc.is_valid(k))
            batch = batch.filter(inside)
        if delete_upto is not None and e.min_exp <= delete_upto:
            keep = np.asarray(batch.column(exp).to_numpy() > delete_upto)
            ch.deleted += int(keep.size - keep.sum())
            batch = batch.filter(pa.array(keep))
        if batch.num_rows == 0:
            continue
        parts.append(widen(batch, schema))
        size += e.length
        if size >= MERGE_CHUNK_BYTES:
            yield pa.Table.from_batches(parts, schema)
            parts, size = [], 0
    if parts:
        yield pa.Table.from_batches(parts, schema)


def _first_of_last_key(keys: pa.ChunkedArray) -> int:
    """Index of the first row holding the last (largest) key of a sorted column."""
    return len(keys) - int(pc.sum(pc.equal(keys, keys[-1])).as_py())


def _count_less(keys: pa.ChunkedArray, value, start: int) -> int:
    """Index of the first row at or after ``start`` whose key is >= ``value`` (keys sorted)."""
    return start + int(pc.sum(pc.less(keys.slice(start), value)).as_py() or 0)


def _merge_into(w: RunWriter, old: pa.Table, new: pa.Table, key: str, exp: str) -> None:
    """Writes the union of two tables sorted by (key, exp), in (key, exp) order."""
    if not new.num_rows:
        if old.num_rows:
            w.add(old)
        return
    if not old.num_rows:
        w.add(new)
        return
    both = pa.concat_tables([old, new])
    k = both.column(key)
    if pa.types.is_integer(k.type):
        order = np.lexsort([both.column(exp).to_numpy(), k.to_numpy()])
    else:
        order = pc.sort_indices(both, [(key, "ascending"), (exp, "ascending")]).to_numpy()
    w.add(both.take(pa.array(order)))
