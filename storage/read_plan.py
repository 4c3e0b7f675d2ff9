"""Read planning: which blocks of which run files answer a probe, a key range or a scan.

Planning needs only the committed version and the run descriptors; it reads no data. It
returns ``ReadTask``s, each a list of blocks of one run file plus the filter to apply, and every
reader (the Python reader, the Flight server, Spark partitions on executors) executes the same
tasks with ``task_reader.execute``. A task skips blocks whose records all expired by ``as_of``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np

from .manifest import ArchiveState, SubIndexState
from .disk_format import BlockEntry
from .keys import search_key
from .run_descriptor import RunDescriptor
from .schema import SchemaHistory
from .tuning import BATCH_PROBE_KEYS, SCAN_TASK_BYTES


@dataclass(frozen=True)
class Probe:
    """Records whose key is one of ``keys``."""

    keys: tuple


@dataclass(frozen=True)
class KeyRange:
    """Records with lo <= key <= hi (None: open on that side)."""

    lo: Any = None
    hi: Any = None

    def __post_init__(self):  # bounds taken from an array (numpy or Arrow scalars) as their values
        object.__setattr__(self, "lo", search_key(self.lo))
        object.__setattr__(self, "hi", search_key(self.hi))


@dataclass(frozen=True)
class Scan:
    """Every record."""


ReadRequest = Probe | KeyRange | Scan


@dataclass(frozen=True)
class BatchProbe:
    """What the native batch probe (``point_probe.probe_task``) needs of a task's run beyond its
    blocks: each block's first and last key, and where the run's key filters are (None: written
    without them): the region's offset and length in the file, and each task block's filter
    within it, then the end."""

    first_keys: tuple
    last_keys: tuple
    filter_offset: int | None = None
    filter_bytes: int = 0
    filter_at: tuple | None = None


@dataclass(frozen=True)
class ReadTask:
    """Blocks of one run file to read and how to filter them. Picklable, so that a Spark task
    can execute it on an executor that mounts the archive's data directory."""

    subindex: int  # 0-based, in its layout
    file: str  # run file name in the data directory
    blocks: tuple[BlockEntry, ...]  # in file order
    as_of: int  # return records with ts <= as_of < exp
    key_ranges: tuple = ()  # ((lo, hi), ...) keys to keep; () keeps every key (a scan)
    draining: int = 0  # 0: the current layout; k: the k-th layout being drained after a migration
    # keyed tasks: per block, its page sums (uint32) to read it in place checking only the pages
    # used, or b"" to read it whole (every row asked for, or a run written without page sums)
    page_sums: tuple[bytes, ...] = ()
    # the archive columns the run's blocks hold, if fewer than the read's schema (a run written
    # before a load added columns): the reader adds the others as nulls
    columns: int | None = None
    # a probe of many keys: every live block of the run, for the native batch probe (None: planned
    # key by key). Its blocks run from the run's first live one to its last, in file order.
    batch: BatchProbe | None = None

    @property
    def where(self) -> str:
        """The sub-index, for messages: "sub-index I3" (or "... of draining layout 1")."""
        return where(self.subindex, self.draining)

    @property
    def bytes(self) -> int:
        return sum(b.length for b in self.blocks)

    @property
    def keyed(self) -> bool:
        return bool(self.key_ranges)

    def sections(self) -> list["ReadTask"]:
        """This task cut where its blocks' section (``slot``) changes: the rows of each part come
        out sorted by (key, exp), since a run is sorted within each section (docs/format.md; a
        Rebuild run is one section). The sorted streams a range read merges."""
        b = self.blocks
        cuts = [0, *(i for i in range(1, len(b)) if b[i].slot != b[i - 1].slot), len(b)]
        return [self.part(x, y) for x, y in zip(cuts, cuts[1:])]

    def part(self, start: int, stop: int) -> "ReadTask":
        """Blocks [start, stop) of this task, with their page sums (a batch probe's part is
        planned key by key)."""
        return replace(self, blocks=self.blocks[start:stop], page_sums=self.page_sums[start:stop], batch=None)


def where(subindex: int, draining: int) -> str:
    """Sub-index ``subindex`` (0-based) of the current layout (``draining`` 0) or of the k-th
    layout being drained, for messages."""
    return f"sub-index I{subindex + 1}" + (f" of draining layout {draining}" if draining else "")


def plan(state: ArchiveState, descriptor: Callable[[str], RunDescriptor], request: ReadRequest, as_of: int,
         schemas: SchemaHistory, subindices: list[int] | None = None,
         page_sums: Callable[[str], np.ndarray | None] | None = None) -> list[ReadTask]:
    """The tasks that answer ``request`` as of ``as_of``: over the current layout's sub-indices
    (0-based, all by default) and, unless sub-indices are named, the layouts being drained.
    ``descriptor`` and ``page_sums`` read a run's metadata; keyed requests use its page sums to
    read blocks in place (without ``page_sums``, they read each block whole). ``schemas`` says
    which columns each run holds; tasks return the newest schema's."""
    if isinstance(request, Probe):
        ranges = tuple((k, k) for k in sorted(set(request.keys)))
    elif isinstance(request, KeyRange):
        if request.lo is not None and request.hi is not None and request.lo > request.hi:
            return []
        ranges = ((request.lo, request.hi),)
    else:
        ranges = ()
    tasks = []
    for layout, i, sub in sources(state, subindices):
        for run in sub.runs:
            if run.max_exp <= as_of:
                continue
            desc = descriptor(run.name)
            columns = None if desc.schema == schemas.current else schemas.columns(desc.schema)
            if isinstance(request, Probe) and len(ranges) >= BATCH_PROBE_KEYS and columns is None and page_sums is not None:
                task = _batch_task(desc, run.first_live, page_sums(run.name), i, layout, as_of, ranges)
                if task is not None:
                    tasks.append(task)
                    continue
            if ranges:
                idx = desc.key_blocks(*ranges[0], run.first_live)
                if len(ranges) > 1:
                    idx = sorted(set(idx).union(*(desc.key_blocks(lo, hi, run.first_live) for lo, hi in ranges[1:])))
                live = [(b, e) for b in idx if (e := desc.entry(b)).max_exp > as_of]
                if live:
                    whole = [_inside(desc, b, ranges) for b, _ in live]  # every row asked for: read it whole
                    run_sums = None if all(whole) or page_sums is None else page_sums(run.name)
                    sums = tuple(b"" if w else desc.block_sums(b, run_sums) for (b, _), w in zip(live, whole))
                    tasks.append(ReadTask(i, run.name, tuple(e for _, e in live), as_of, ranges, layout, sums, columns))
            else:
                tail = desc.blocks[run.first_live:]
                blocks = BlockEntry.all(tail[tail["max_exp"] > as_of])
                tasks += [ReadTask(i, run.name, part, as_of, (), layout, (), columns)
                          for part in _split(blocks, SCAN_TASK_BYTES)]
    return tasks


def _batch_task(desc: RunDescriptor, first_live: int, sums: np.ndarray | None, subindex: int, layout: int, as_of: int,
                ranges: tuple) -> "ReadTask | None":
    """The one task of a batch probe in run ``desc``: its blocks from ``first_live`` on (the native
    probe picks each key's, skipping expired ones); None if none is live at ``as_of``, or if the
    run has no page sums (it is then planned key by key)."""
    tail = desc.blocks[first_live:]
    if sums is None or not (tail["max_exp"] > as_of).any():
        return None
    n = int(desc.blocks.size)
    at = desc.filter_at
    batch = BatchProbe(tuple(desc.first_keys[first_live:]), tuple(desc.last_keys[first_live:]), desc.filter_offset,
                       0 if at is None else int(at[-1] - at[0]),
                       None if at is None else tuple((at[first_live:] - at[0]).tolist()))
    return ReadTask(subindex, desc.name, tuple(BlockEntry.all(tail)), as_of, ranges, layout,
                    tuple(desc.block_sums(b, sums) for b in range(first_live, n)), None, batch)


def sources(state: ArchiveState, subindices: list[int] | None) -> list[tuple[int, int, SubIndexState]]:
    """(layout, sub-index, its state) of every sub-index a read searches: those of the current
    layout (0) or just ``subindices`` of it, and unless sub-indices are named, those of every
    layout being drained (k = 1, 2, ...). Every record is in exactly one layout, so nothing is
    read twice."""
    out = [(0, i, state.subindices[i]) for i in (range(len(state.subindices)) if subindices is None else subindices)]
    if subindices is None:
        out += [(k, i, sub) for k, d in enumerate(state.draining, 1) for i, sub in enumerate(d.subindices)]
    return out


def _inside(desc: RunDescriptor, b: int, ranges: tuple) -> bool:
    """Whether every key of block ``b`` lies in one of ``ranges``."""
    first, last = desc.first_keys[b], desc.last_keys[b]
    return any((lo is None or lo <= first) and (hi is None or last <= hi) for lo, hi in ranges)


def _split(blocks: list[BlockEntry], limit: int) -> list[tuple[BlockEntry, ...]]:
    """``blocks`` in consecutive parts of at most ``limit`` bytes (at least one block each)."""
    parts, cur, size = [], [], 0
    for b in blocks:
        if cur and size + b.length > limit:
            parts.append(tuple(cur))
            cur, size = [], 0
        cur.append(b)
        size += b.length
    if cur:
        parts.append(tuple(cur))
    return parts
