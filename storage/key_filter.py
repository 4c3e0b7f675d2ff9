"""Key filters: a blocked Bloom filter per block of a run, so that a probe skips blocks (and so
runs) that cannot hold its key.

A run's blocks are chosen for a key by their first and last keys; with many distinct keys every
block spans most of the key space, so without a filter a probe searches one block in every run
(and in NoRebuild, in every section of every run). Each block's filter answers "not here" for
about 99.9% of absent keys after reading one 64-byte unit of it, so a probe searches about one
block per run that holds the key.

Layout (docs/format.md, "Key filters"): a block of ``rows`` rows has ``units(rows)`` units of
``UNIT_BYTES`` bytes (``BITS_PER_KEY`` bits a row): ``UNIT_BITS`` bits, then the low 32 bits of
the XXH3-64 of those bits seeded with the unit's index among the run's units, so that a probe
checks the 64 bytes it reads, not a page. A key's 64-bit hash (``key_hashes``) picks one unit by
its high 32 bits and ``PROBES`` bits in it from successive 9-bit fields of a second mix of the
hash; the key may be in the block only if all are set. A unit that fails its sum is never
trusted: the block is searched. The filters of a run's blocks follow its last block, from the
next page boundary, in block order; a NoRebuild run's then end with its *run filter*, units of the
same form over all its keys (``RUN_FILTER_BITS_PER_KEY`` bits a record, unit indices going on from
the blocks'), which a probe checks before any of the run's sections. A process that probes reads a run's filters once, into
memory (``point_probe.RunArrays``, within the metadata cache's budget); storage/native/point_probe.c
computes the same hash and bits.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import xxhash

from .disk_format import FILTER_BITS_PER_KEY as BITS_PER_KEY
from .disk_format import FILTER_PROBES as PROBES
from .disk_format import FILTER_SUM_BYTES as SUM_BYTES
from .disk_format import FILTER_TEXT_MULTIPLIER
from .disk_format import FILTER_UNIT_BITS as UNIT_BITS
from .disk_format import FILTER_UNIT_BYTES as UNIT_BYTES

_BITS_BYTES = UNIT_BYTES - SUM_BYTES


def units(rows, bits: int = BITS_PER_KEY):
    """Filter units of a block of ``rows`` rows (an int or a numpy array of them) with ``bits``
    bits a row (a run's descriptor names them: ``RunDescriptor.filter_bits``); at least one."""
    return np.maximum(1, (np.asarray(rows, np.int64) * bits + UNIT_BITS - 1) // UNIT_BITS)


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser, on uint64 (wrapping)."""
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def key_hashes(keys: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The uint64 hash of each key (int64 or string; no nulls): an int64's mixed bits, a string's
    UTF-8 bytes folded as p = p * FILTER_TEXT_MULTIPLIER + (byte + 1) then mixed. Vectorised:
    the bytes of every string at once."""
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks() if keys.num_chunks != 1 else keys.chunk(0)
    if pa.types.is_integer(keys.type):
        return _mix(np.asarray(keys.to_numpy(zero_copy_only=False), np.int64).view(np.uint64))
    offsets_buf, data_buf = keys.buffers()[1:3]
    n = len(keys)
    at = np.frombuffer(offsets_buf, np.int32, n + 1, keys.offset * 4).astype(np.int64)
    data = np.frombuffer(data_buf, np.uint8, int(at[-1] - at[0]), int(at[0])) if data_buf is not None else np.zeros(0, np.uint8)
    at -= at[0]
    lengths = np.diff(at)
    folded = np.zeros(n, np.uint64)
    if data.size:
        longest = int(lengths.max())
        with np.errstate(over="ignore"):
            powers = np.cumprod(np.full(longest, FILTER_TEXT_MULTIPLIER, np.uint64))
            powers = np.concatenate([[np.uint64(1)], powers[:-1]])  # M^0 .. M^(longest-1)
            owner = np.repeat(np.arange(n), lengths)
            after = at[owner + 1] - 1 - np.arange(data.size)  # bytes after each byte in its string
            terms = (data.astype(np.uint64) + np.uint64(1)) * powers[after]
        full = lengths > 0
        folded[full] = np.add.reduceat(terms, at[:-1][full])
    return _mix(folded)


_SHIFTS = np.arange(PROBES, dtype=np.uint64) * np.uint64(9)  # a key's PROBES 9-bit fields of its second mix
_UNIT_ALL_BITS = UNIT_BYTES * 8  # a unit's bits with its sum's (a scatter sets only the first UNIT_BITS)


def _positions(hashes: np.ndarray, unit_count) -> tuple[np.ndarray, np.ndarray]:
    """For each hash: its unit (of ``unit_count``, an int or one per hash) and its PROBES bit
    positions in the unit (uint32: the (n, PROBES) temporaries stay small, as they are the
    cost of building a filter)."""
    with np.errstate(over="ignore"):
        unit = ((hashes >> np.uint64(32)) * np.asarray(unit_count, np.uint64)) >> np.uint64(32)
        second = _mix(hashes)
    fields = (second[:, None] >> _SHIFTS).astype(np.uint32) & np.uint32(511)
    return unit.astype(np.int64), (fields * np.uint32(UNIT_BITS)) >> np.uint32(9)


def filters(hashes: np.ndarray, block_rows, first_unit: int, bits: int = BITS_PER_KEY) -> bytes:
    """The filters of consecutive blocks of ``block_rows`` rows whose keys have ``hashes`` (one a
    row, in block order), one after another: ``block_filter`` of each block, built in one pass.
    The first block's first unit is unit ``first_unit`` of its run (each unit's sum is seeded
    with its index)."""
    rows = np.asarray(block_rows, np.int64)
    counts = units(rows, bits)
    total = int(counts.sum())
    unit, at = _positions(hashes, np.repeat(counts, rows))
    unit += np.repeat(np.cumsum(counts) - counts, rows)  # each block's units follow the last's
    flat = np.zeros(total * _UNIT_ALL_BITS, bool)
    index = np.uint32 if total * _UNIT_ALL_BITS < 2**32 else np.int64
    flat[(unit.astype(index)[:, None] * index(_UNIT_ALL_BITS) + at).ravel()] = True
    packed = np.packbits(flat.reshape(total, _UNIT_ALL_BITS), axis=1, bitorder="little")
    packed[:, _BITS_BYTES:] = _sums(packed.tobytes(), first_unit).view(np.uint8).reshape(total, SUM_BYTES)
    return packed.tobytes()


def _sums(filter_bytes: bytes, first_unit: int) -> np.ndarray:
    """Each unit's sum as its bits are (the first unit being unit ``first_unit`` of its run)."""
    digest, step = xxhash.xxh3_64_intdigest, UNIT_BYTES
    return np.array([digest(filter_bytes[at:at + _BITS_BYTES], first_unit + u) & 0xFFFFFFFF
                     for u, at in enumerate(range(0, len(filter_bytes), step))], "<u4")


def block_filter(hashes: np.ndarray, first_unit: int, bits: int = BITS_PER_KEY) -> bytes:
    """The filter of a block whose keys have ``hashes`` (one a row): ``units(len(hashes), bits)``
    units, the first of them unit ``first_unit`` of its run (each unit's sum is seeded with its
    index)."""
    return filters(hashes, [len(hashes)], first_unit, bits)


def sums_hold(filter_bytes, first_unit: int) -> np.ndarray:
    """Whether each unit of ``filter_bytes`` (the first being unit ``first_unit`` of its run)
    passes its sum (``ebb verify``; a probe does not trust a unit that fails)."""
    units_of = np.frombuffer(filter_bytes, np.uint8).reshape(-1, UNIT_BYTES)
    stored = units_of[:, _BITS_BYTES:].copy().view("<u4").ravel()
    return _sums(bytes(filter_bytes), first_unit) == stored


def may_hold(filter_bytes, hashes: np.ndarray) -> np.ndarray:
    """Whether a block with filter ``filter_bytes`` may hold each key of ``hashes`` (False: it does
    not), by its bits alone. As the native probe tests them; for the tests."""
    units_of = np.frombuffer(filter_bytes, np.uint8).reshape(-1, UNIT_BYTES)
    bits_of = np.unpackbits(units_of, axis=1, bitorder="little")
    unit, bits = _positions(hashes, len(units_of))
    return bits_of[unit[:, None], bits].all(axis=1)
