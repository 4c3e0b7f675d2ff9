"""The facts of ebb's on-disk format that more than one module (or the native point probe) relies on.

Everything above the last section is *format*: changing it changes the bytes ebb writes or how it
reads them, so it needs ``FORMAT_VERSION`` bumped (an archive of another version is refused) and
docs/format.md updated. Values that only change how fast ebb reads or how much memory it uses
are *tuning* and live in ``tuning``. How each structure is coded stays with its code (a run
descriptor in ``run_descriptor``, a sealed value in ``checksum``, a block in ``block_format``);
what they, the readers and storage/native/point_probe.c must agree on is here, and
``native_constants`` hands the native code's share of it over for a check at import.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
import pyarrow as pa

FORMAT_VERSION = 2  # recorded in the archive's EBB marker file (and its published copies); an ebb reads only its own

# -- run descriptors: one BLOCK entry per block (docs/format.md, "Run descriptors") --------------------
BLOCK = np.dtype([
    ("offset", "<u8"), ("length", "<u4"), ("rows", "<u4"), ("min_exp", "<i8"), ("max_exp", "<i8"),
    ("max_ts", "<i8"), ("slot", "<i8"), ("checksum", "<u8"),
])
BLOCK_ENTRY_BYTES = BLOCK.itemsize  # packed, little-endian
INT_KEY = np.dtype("<i8")  # a descriptor's first and last key of each block, when keys are integers


class BlockEntry(namedtuple("BlockEntry", BLOCK.names)):
    """One BLOCK entry as plain Python values, its fields those of BLOCK (numpy field access
    costs microseconds each)."""

    __slots__ = ()

    @staticmethod
    def all(blocks: np.ndarray) -> list["BlockEntry"]:
        return [BlockEntry._make(t) for t in blocks.tolist()]


# -- pages: the unit of a probe's reads and checks inside a block --------------------------------------
PAGE_BYTES = 4096  # also in each descriptor's head ("page"): a descriptor of other pages is refused
# A block at least this long starts on a page of the file (the zeros before it are under 1/64 of
# it): then each page its page sums cover is one page of memory, and a probe that reads a few of
# them reads half the pages it would if they straddled two. Readers take any offset.
ALIGNED_BLOCK_BYTES = 64 * PAGE_BYTES
PAGE_SUM = np.dtype("<u4")  # a page's sum: the low 32 bits of its XXH3-64 (``checksum.page_sum``)


def page_count(nbytes):
    """Pages (the last one shorter) of a block of ``nbytes`` bytes (an int or a numpy array of them)."""
    return (nbytes + PAGE_BYTES - 1) // PAGE_BYTES


# -- blocks: one Arrow IPC encapsulated record-batch message each ---------------------------------------
IPC_CONTINUATION = 0xFFFFFFFF  # the message's first 4 bytes
IPC_PREFIX_BYTES = 8  # continuation marker and metadata length (int32), before the flatbuffer metadata

# -- hidden columns: stored in every block after the archive schema's columns, never returned ----------
RESERVED_PREFIX = "__ebb"  # archive column names may not start with it
INS_SLOT_COLUMN = "__ebb_ins"  # the record's insertion slot, so that ``ebb verify`` can check where it lives
INS_SLOT_FIELD = pa.field(INS_SLOT_COLUMN, pa.int64(), nullable=False)
INS_SLOT_BYTES = INS_SLOT_FIELD.type.bit_width // 8  # what it adds to each stored record
HIDDEN_FIELDS = (INS_SLOT_FIELD,)  # appended in this order after the visible columns
HIDDEN_COLUMNS = len(HIDDEN_FIELDS)


def physical_schema(schema: pa.Schema) -> pa.Schema:
    """The schema of stored blocks: the archive schema, then the hidden columns."""
    for f in HIDDEN_FIELDS:
        schema = schema.append(f)
    return schema


def visible_columns(physical_columns: int) -> int:
    """How many leading columns of a physical schema of ``physical_columns`` columns are the
    archive's (returned to readers); the hidden columns follow them."""
    return physical_columns - HIDDEN_COLUMNS


def ins_slot_index(physical_columns: int) -> int:
    """The index of ``INS_SLOT_COLUMN`` in a physical schema of ``physical_columns`` columns."""
    return visible_columns(physical_columns) + HIDDEN_FIELDS.index(INS_SLOT_FIELD)


# -- the commit metadata: the 4-byte tag sealed into each kind of value (``checksum.seal``) -------------
METADATA_TAGS = {b"config": b"CONF", b"state": b"STAT", b"schema": b"SCHM", b"schemas": b"SCHH",
                 b"garbage": b"GARB", b"migrations": b"MIGR"}
METADATA_PREFIX_TAGS = {b"run/": b"RUN2", b"ext/": b"EXTN", b"upd/": b"UPDT", b"ver/": b"VERS"}  # key: prefix + name


# -- estimates of the format's sizes: not format (no byte on disk depends on them), but readers in
#    Python and C must use the same one, so it is stated here ------------------------------------------
# Bytes of a block before its first body buffer: IPC_PREFIX_BYTES and the RecordBatch metadata,
# measured at 240 bytes for 3 int64 columns plus 48 per further column (16 more per string or binary
# column): 1 KiB covers schemas of up to ~19 columns. Both readers use it only to ask the kernel
# for bytes ahead of touching them (task_reader.prefetch_heads: the metadata and the key column;
# the native probe: the pages about a key's row, +-one page): a wrong guess costs a page fault,
# never a wrong answer (the metadata's real length is read from the block).
METADATA_GUESS_BYTES = 1024


# -- key filters: a blocked Bloom filter per block, after a run's last block (``key_filter``) -----------
FILTER_UNIT_BYTES = 64  # a key's bits all lie in one unit: one cache line, one page read
FILTER_SUM_BYTES = 4  # a unit ends with the low 32 bits of the XXH3-64 of its bits, seeded with its index
FILTER_UNIT_BITS = (FILTER_UNIT_BYTES - FILTER_SUM_BYTES) * 8  # 480
# 16 bits a record (2 bytes): about 0.11% of absent keys pass a block's filter (10 bits let 1.06% by: a NoRebuild
# probe, which then checked the filter of every live section of every run (before run filters, below), about 300 in the library bench, then
# searched 3.2 blocks without its key; now about 0.4). A run's descriptor names the bits its filters were
# written with ("filter_bits"), which set where each block's filter lies; absent, FILTER_BITS_UNNAMED.
FILTER_BITS_PER_KEY = 16
FILTER_BITS_UNNAMED = 10  # what runs written before descriptors named their filters' bits used
# A NoRebuild run also ends with one filter over all its records (its descriptor's "run_filter": its
# units), checked before any of its sections: a probe then searches the sections of only the runs that
# may hold its key (about 1.1% of the others pass at 10 bits a record; each costs ~15 sections' checks)
RUN_FILTER_BITS_PER_KEY = 10
FILTER_PROBES = 7  # bits a key sets in its unit: from successive 9-bit fields of its hash's second mix
FILTER_TEXT_MULTIPLIER = 0x100000001B3  # a string key's bytes fold as p = p * this + (byte + 1), mod 2**64


def native_constants() -> dict[str, int]:
    """The format facts storage/native/point_probe.c is written against, for it to check at import:
    the BLOCK entry's size and each field's byte offset ("entry.<field>"), the page size and page
    sum width, the hidden columns (they follow the ``visible`` columns the probe returns, so the
    probe returns the first ``ncols - hidden_columns``; ``ins_slot_from_end``: the insertion slot
    is column ``ncols - ins_slot_from_end``), the IPC prefix and continuation marker, and the
    metadata guess."""
    out = {"entry_bytes": BLOCK_ENTRY_BYTES}
    out.update({f"entry.{name}": BLOCK.fields[name][1] for name in BLOCK.names})
    out.update({
        "page_bytes": PAGE_BYTES,
        "page_sum_bytes": PAGE_SUM.itemsize,
        "hidden_columns": HIDDEN_COLUMNS,
        "ins_slot_from_end": HIDDEN_COLUMNS - HIDDEN_FIELDS.index(INS_SLOT_FIELD),
        "ipc_prefix_bytes": IPC_PREFIX_BYTES,
        "ipc_continuation": IPC_CONTINUATION,
        "metadata_guess_bytes": METADATA_GUESS_BYTES,
        "filter_unit_bytes": FILTER_UNIT_BYTES,
        "filter_sum_bytes": FILTER_SUM_BYTES,
        "filter_probes": FILTER_PROBES,
        "filter_text_multiplier": FILTER_TEXT_MULTIPLIER,
    })
    return out
