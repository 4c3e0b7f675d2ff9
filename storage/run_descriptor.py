"""A run: one immutable data file of a sub-index, and the directory of its blocks.

A run file is a sequence of blocks (``block_format``). Its descriptor has one entry per block:
byte offset and length, row count, exp range, largest ts, section slot (NoRebuild sections,
``ArchiveConfig.section_slot``; -1 in Rebuild runs), checksum, and the first and last key. It
also holds a 32-bit page sum of every PAGE_BYTES page of every block, so that a probe can check
just the pages it reads (``page_check``) instead of a whole block. Blocks are grouped in *sections* of
equal ``slot``, in ascending slot order; inside a section records are sorted by (key, exp), so
a key's records are one contiguous stretch of each section.

A descriptor also names the schema version its run was written under (``schema.SchemaHistory``;
0, and absent from the stored head, for the first), so that a run written before a load added
columns is decoded with the columns it has.

Descriptors are written by whoever writes the run file (the update, or a Spark task) and adopted
by the commit, which stores them sealed (``checksum.seal``) in the archive's metadata. Only probes
use the page sums, which are most of a descriptor's bytes, so a descriptor is usually read without
them (``from_bytes(with_sums=False)``) and a probe reads them separately (``sums_from_bytes``).
"""

from __future__ import annotations

import bisect
import copy
import functools
import json
import struct
import sys
from dataclasses import dataclass, field

import numpy as np

from . import key_filter
from .checksum import seal, unseal
from .disk_format import (BLOCK, BLOCK_ENTRY_BYTES, FILTER_BITS_PER_KEY, FILTER_BITS_UNNAMED, FILTER_UNIT_BITS,
                          FILTER_UNIT_BYTES, INT_KEY, METADATA_PREFIX_TAGS, PAGE_BYTES, PAGE_SUM, BlockEntry, page_count)
from .errors import CorruptionError

_TAG = METADATA_PREFIX_TAGS[b"run/"]
_LEN = struct.Struct("<I")


@dataclass
class RunDescriptor:
    """The blocks of one run file (``name`` in the archive's data directory)."""

    name: str
    subindex: int
    blocks: np.ndarray  # BLOCK entries in file order
    first_keys: list  # per block (int or str)
    last_keys: list
    sums: np.ndarray | None = None  # uint32 page sums of every block, in order (None: see ``paged``)
    paged: bool | None = None  # written with page sums (None: whether ``sums`` is given); they may be unloaded
    schema: int = 0  # the schema version its blocks were written under
    # where its blocks' key filters start (page-aligned, after the last block; ``key_filter``);
    # None: written without filters
    filter_offset: int | None = None
    filter_bits: int = FILTER_BITS_PER_KEY  # bits a record of its key filters (they set each one's size)
    run_filter_units: int = 0  # units of its run filter, after the blocks' (NoRebuild runs); 0: none
    section_bounds: list[int] = field(init=False)  # first block of each section, then len(blocks)
    page_start: np.ndarray = field(init=False)  # index in ``sums`` of each block's first page, then the total

    def __post_init__(self) -> None:
        if self.paged is None:
            self.paged = self.sums is not None
        slot = self.blocks["slot"]
        starts = np.flatnonzero(np.diff(slot)) + 1 if slot.size > 1 else np.zeros(0, np.int64)
        self.section_bounds = [0, *starts.tolist(), int(slot.size)] if slot.size else [0]
        pages = page_count(self.blocks["length"].astype(np.int64))
        self.page_start = np.concatenate([[0], np.cumsum(pages)])

    def entries(self, start: int = 0, stop: int | None = None) -> list[BlockEntry]:
        """Blocks [start, stop) as plain tuples, built on each call and not kept: descriptors
        stay cached, and their blocks as tuples would take ~300 bytes a block (~24 MB for a
        5 GB archive of 64 KiB blocks), memory that grows with the archive."""
        return BlockEntry.all(self.blocks[start:stop])

    def entry(self, b: int) -> BlockEntry:
        """Block ``b`` as a plain tuple."""
        return BlockEntry._make(self.blocks[b].tolist())

    def block_sums(self, b: int, sums: np.ndarray | None) -> bytes:
        """The page sums of block ``b``, taken from ``sums`` (this run's, from ``sums_from_bytes``;
        None if it was written without them, which gives b"")."""
        if sums is None:
            return b""
        return sums[self.page_start[b]:self.page_start[b + 1]].tobytes()

    def without_sums(self) -> "RunDescriptor":
        """This descriptor without its page sums (for caching: only probes need them)."""
        if self.sums is None:
            return self
        lean = copy.copy(self)  # the arrays derived from the blocks are shared, not computed again
        lean.sums = None
        return lean

    @property
    def nbytes(self) -> int:
        """About how much memory this descriptor holds (its arrays and keys)."""
        n = int(self.blocks.size)
        key = sys.getsizeof(self.first_keys[0]) if n else 0
        sums = self.sums.nbytes if self.sums is not None else 0
        return self.blocks.nbytes + self.page_start.nbytes + sums + 2 * n * (8 + key) + 200

    @property
    def file_bytes(self) -> int:
        """The run file's size: its blocks, then its key filters."""
        if self.filter_offset is not None:
            return self.filter_end
        b = self.blocks
        return int(b["offset"][-1] + b["length"][-1]) if b.size else 0

    @functools.cached_property
    def filter_at(self) -> np.ndarray | None:
        """The byte offset in the file of each block's key filter, then where the last one ends
        (None: written without filters). Computed once: a new run's is asked for several times
        while the first probe of its version prepares it."""
        if self.filter_offset is None:
            return None
        sizes = key_filter.units(self.blocks["rows"].astype(np.int64), self.filter_bits) * FILTER_UNIT_BYTES
        return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64) + self.filter_offset

    @property
    def filter_end(self) -> int:
        """Where its filters end (with a run filter, after it): the end of the file."""
        return int(self.filter_at[-1]) + self.run_filter_units * FILTER_UNIT_BYTES

    def first_live_after(self, slot: int) -> int:
        """Index of the first block whose section slot is > ``slot`` (NoRebuild deletion:
        every block before it holds only records expiring at or before ``slot``)."""
        return int(np.searchsorted(self.blocks["slot"], slot, side="right"))

    def key_blocks(self, lo, hi, first_live: int) -> list[int]:
        """Indices of the live blocks that may hold keys in [lo, hi] (None = open), one
        contiguous stretch per section."""
        out: list[int] = []
        secs = self.section_bounds
        for s in range(len(secs) - 1):
            a, b = max(secs[s], first_live), secs[s + 1]
            if a >= b:
                continue
            start = a if lo is None else bisect.bisect_left(self.last_keys, lo, a, b)
            stop = b if hi is None else bisect.bisect_right(self.first_keys, hi, a, b)
            out.extend(range(start, stop))
        return out

    # -- storage ------------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        """The sealed descriptor as held: without page sums if it was read without them."""
        int_keys = all(isinstance(k, int) for k in self.first_keys)
        meta = {"name": self.name, "subindex": self.subindex, "n": int(self.blocks.size),
                "keys": "int" if int_keys else "str"}
        if self.sums is not None:
            meta["page"] = PAGE_BYTES
        if self.schema:  # absent for the first schema: descriptors from before schema growth read as 0
            meta["schema"] = self.schema
        if self.filter_offset is not None:  # absent: written without key filters
            meta["filter"] = self.filter_offset
            if self.filter_bits != FILTER_BITS_UNNAMED:  # absent: as runs were written before the field
                meta["filter_bits"] = self.filter_bits
            if self.run_filter_units:  # absent: no run filter (Rebuild runs, and runs written before them)
                meta["run_filter"] = self.run_filter_units
        head = json.dumps(meta).encode()
        if int_keys:
            keys = np.array(self.first_keys + self.last_keys, dtype=INT_KEY).tobytes()
        else:
            keys = json.dumps([self.first_keys, self.last_keys]).encode()
        sums = b"" if self.sums is None else np.ascontiguousarray(self.sums, PAGE_SUM).tobytes()
        # the page sums go last, so that ebb versions from before them read the rest unchanged
        body = _LEN.pack(len(head)) + head + np.ascontiguousarray(self.blocks, BLOCK).tobytes() + keys + sums
        return seal(_TAG, self.key(self.name), body)

    @staticmethod
    def key(name: str) -> bytes:
        """The metadata key the descriptor of run ``name`` is stored under."""
        return b"run/" + name.encode()

    @staticmethod
    def from_bytes(value: bytes, name: str, what: str, with_sums: bool = True) -> "RunDescriptor":
        """Parses the sealed descriptor of run ``name``, with its page sums or without them;
        CorruptionError naming ``what`` if damaged."""
        body, head, blocks, pos, end = parse_sealed(value, name, what)
        n = head["n"]
        sums = _sums(body, head, end) if with_sums else None
        if head["keys"] == "int":
            keys = np.frombuffer(body, INT_KEY, 2 * n, pos).tolist()
            first, last = keys[:n], keys[n:]
        else:
            try:
                first, last = json.loads(bytes(body[pos:end]))
            except (ValueError, TypeError, RecursionError):  # not JSON (or UTF-8), or not two lists
                first = last = None
            if not (type(first) is list and type(last) is list and len(first) == len(last) == n
                    and all(type(k) is str for k in first + last)):
                raise _malformed(what, name, "its keys")
        return RunDescriptor(head["name"], head["subindex"], blocks.copy(), first, last, sums, "page" in head,
                             head.get("schema", 0), head.get("filter"), head.get("filter_bits", FILTER_BITS_UNNAMED),
                             head.get("run_filter", 0))

    @staticmethod
    def sums_from_bytes(value: bytes, name: str, what: str) -> np.ndarray | None:
        """The page sums in the sealed descriptor of run ``name`` (None: written without);
        CorruptionError naming ``what`` if damaged."""
        body, head, _, _, end = parse_sealed(value, name, what)
        return _sums(body, head, end)


def _extent(blocks: np.ndarray) -> tuple[int, int]:
    """The byte after the last of ``blocks`` (BLOCK entries) and how many page sums they have:
    in one native call where the module is built (a new run's first probe parses its descriptor,
    and numpy's calls on it took most of the parse), else in numpy."""
    from .point_probe import _point_probe  # the native module, loaded (or turned off) there

    if _point_probe is not None:
        return _point_probe.block_extent(blocks)
    last = int(blocks["offset"][-1] + blocks["length"][-1]) if blocks.size else 0
    return last, int(page_count(blocks["length"].astype(np.int64)).sum())


def parse_sealed(value: bytes, name: str, what: str) -> tuple[memoryview, dict, np.ndarray, int, int]:
    """(body, head, BLOCK entries (a view of body), where the keys start, where the page sums
    start) of a sealed descriptor, after checking its seal and that its parts fit together (a
    valid seal over a malformed body, as a writer's bug would leave, is a CorruptionError too).
    ``RunDescriptor.from_bytes`` builds on it, and so does ``point_probe.RunArrays.from_value``."""
    body = unseal(_TAG, RunDescriptor.key(name), value, what)
    if len(body) < _LEN.size:
        raise _malformed(what, name, "no head")
    (hl,) = _LEN.unpack_from(body)
    try:
        head = json.loads(bytes(body[4:4 + hl]))
    except (ValueError, RecursionError):  # not JSON, or not UTF-8
        head = None
    if not (type(head) is dict and head.get("name") == name and type(head.get("subindex")) is int
            and type(head.get("n")) is int and head["n"] >= 0 and head.get("keys") in ("int", "str")):
        raise _malformed(what, name, "its head")
    n = head["n"]
    pos = 4 + hl
    if len(body) < pos + n * BLOCK_ENTRY_BYTES:
        raise _malformed(what, name, f"fewer than its {n} blocks")
    blocks = np.frombuffer(body, BLOCK, n, pos)
    pos += n * BLOCK_ENTRY_BYTES
    end = len(body)
    if type(head.get("schema", 0)) is not int or head.get("schema", 0) < 0:
        raise CorruptionError(f"{what}: run {name} names schema version {head['schema']!r}")
    last, pages = _extent(blocks)
    if "filter" in head:
        if not (type(head["filter"]) is int and head["filter"] >= last and head["filter"] % PAGE_BYTES == 0):
            raise _malformed(what, name, "where its key filters are")
        bits = head.get("filter_bits", FILTER_BITS_UNNAMED)
        if not (type(bits) is int and 1 <= bits <= FILTER_UNIT_BITS):
            raise _malformed(what, name, "its key filters' bits a record")
        run_units = head.get("run_filter", 0)
        if not (type(run_units) is int and 0 <= run_units < 1 << 40):
            raise _malformed(what, name, "its run filter's size")
    elif "run_filter" in head:
        raise _malformed(what, name, "its run filter, without key filters")
    if "page" in head:
        if head["page"] != PAGE_BYTES:
            raise CorruptionError(f"{what}: run {name} has pages of {head['page']!r} bytes, this ebb reads {PAGE_BYTES}")
        end -= PAGE_SUM.itemsize * pages
    if end < pos or head["keys"] == "int" and end - pos != 2 * INT_KEY.itemsize * n:
        raise _malformed(what, name, "its keys and page sums do not fill it")
    return body, head, blocks, pos, end


def _sums(body: memoryview, head: dict, end: int) -> np.ndarray | None:
    """The page sums at the end of a parsed descriptor (from ``end``; None: written without)."""
    return np.frombuffer(body, PAGE_SUM, (len(body) - end) // PAGE_SUM.itemsize, end).copy() if "page" in head else None


def _malformed(what: str, name: str, part: str) -> CorruptionError:
    return CorruptionError(f"{what}: the descriptor of run {name} is malformed ({part})")
