"""Writes one run file from sorted records and returns its descriptor.

This needs nothing but a directory and the records: no metadata, no lock. An update calls it
for each run it creates; a Spark task can call it on an executor and hand the small descriptor
back to the driver, whose commit adopts the file. Until a commit references it, a run file is
invisible to readers and removed by recovery.

After its last block a run file holds the key filter of each block (``key_filter``), from the
next page boundary. The writer keeps them until ``finish``: 16 bits a record (a 5 GB run of
200-byte records: 50 MB), against the 8 bytes of a record's key it would otherwise keep. A
NoRebuild run (``run_filter``) then ends with one filter over all its keys, which a probe checks
before any of its sections; its writer keeps the keys' 8-byte hashes until ``finish``, as the
update holds the run's records anyway (one update's records for one sub-index).
"""

from __future__ import annotations

import os
from typing import Iterable

import numpy as np
import pyarrow as pa

from . import files, key_filter
from .block_format import encode_blocks
from .disk_format import (ALIGNED_BLOCK_BYTES, BLOCK, FILTER_BITS_PER_KEY, PAGE_BYTES, PAGE_SUM,
                          RUN_FILTER_BITS_PER_KEY, BlockEntry, page_count)
from .faults import crash_point
from .run_descriptor import RunDescriptor


class RunWriter:
    """Appends sorted tables (the physical schema of version ``schema_version`` of the archive
    schema) as blocks to a new run file; ``finish`` makes it durable. ``run_filter``: end it with
    a filter over all its keys (a NoRebuild run, whose sections a probe would otherwise check each)."""

    def __init__(self, data_dir: str, name: str, subindex: int, key: str, ts: str, exp: str, block_bytes: int,
                 schema_version: int = 0, run_filter: bool = False):
        self.name, self.subindex, self.schema_version = name, subindex, schema_version
        self.path = os.path.join(data_dir, name)
        self._cols = (key, ts, exp)
        self._block_bytes = block_bytes
        self._file = files.FS.create(self.path)
        self._entries: list[BlockEntry] = []
        self._first: list = []
        self._last: list = []
        self._sums: list[np.ndarray] = []
        self._filters: list[bytes] = []
        self._units = 0  # filter units so far
        self._hashes: list[np.ndarray] | None = [] if run_filter else None  # of every key, for the run filter

    def add(self, table: pa.Table, slots: np.ndarray | None = None) -> None:
        """Appends records sorted by (slot, key, exp), continuing the order of earlier calls."""
        key, ts, exp = self._cols
        block_rows = []
        for blk in encode_blocks(table, key, ts, exp, self._block_bytes, PAGE_BYTES, slots):
            block_rows.append(blk.rows)
            pad = -self._file.size % PAGE_BYTES
            if pad and blk.entry.length >= ALIGNED_BLOCK_BYTES:
                self._file.write(bytes(pad))
            self._entries.append(blk.at(self._file.size))
            self._first.append(blk.first_key)
            self._last.append(blk.last_key)
            self._sums.append(blk.sums)
            self._file.write(blk.data)
            crash_point("run.block_written")
        hashes = key_filter.key_hashes(table.column(key))
        if self._hashes is not None:
            self._hashes.append(hashes)
        if block_rows:  # the filters of this call's blocks, built at once (a call per block costs more than its bits)
            self._filters.append(key_filter.filters(hashes, block_rows, self._units, FILTER_BITS_PER_KEY))
            self._units += int(key_filter.units(np.array(block_rows), FILTER_BITS_PER_KEY).sum())

    def finish(self, sync: bool = True) -> RunDescriptor:
        """Writes the key filters, closes the file and returns its descriptor. ``sync``: fsync it
        now (a caller writing several runs may pass False and sync them together); the caller
        syncs the directory."""
        filter_offset = int(page_count(self._file.size)) * PAGE_BYTES
        run_units = 0
        if self._hashes and self._entries:  # its units follow the blocks' (and seed their sums on from them)
            hashes = np.concatenate(self._hashes)
            self._filters.append(key_filter.block_filter(hashes, self._units, RUN_FILTER_BITS_PER_KEY))
            run_units = int(key_filter.units(len(hashes), RUN_FILTER_BITS_PER_KEY))
        filters = b"".join(self._filters)
        self._file.write(bytes(filter_offset - self._file.size))
        self._file.write(filters)
        self._file.close()
        if sync:
            files.FS.sync_files([self.path])
        blocks = np.array(self._entries, dtype=BLOCK) if self._entries else np.zeros(0, BLOCK)
        sums = np.concatenate(self._sums) if self._sums else np.zeros(0, PAGE_SUM)
        return RunDescriptor(self.name, self.subindex, blocks, self._first, self._last, sums, schema=self.schema_version,
                             filter_offset=filter_offset, filter_bits=FILTER_BITS_PER_KEY, run_filter_units=run_units)

    def close(self) -> None:
        self._file.close()


def write_run(data_dir: str, name: str, subindex: int, parts: Iterable[tuple[pa.Table, np.ndarray | None]],
              key: str, ts: str, exp: str, block_bytes: int, schema_version: int = 0) -> RunDescriptor:
    """Writes ``parts`` (each a sorted table and its section slots, all of schema version
    ``schema_version``) as one durable run file. On failure the partial file is left for the
    caller (or recovery) to remove."""
    w = RunWriter(data_dir, name, subindex, key, ts, exp, block_bytes, schema_version)
    try:
        for table, slots in parts:
            w.add(table, slots)
        return w.finish()
    finally:
        w.close()
