"""Checksums of everything ebb stores: data blocks and every value in the commit metadata.

Blocks are checked with XXH3-64 (about 10 GB/s here, so a check costs a few percent of a read).
Each page of a block also has a page sum (the low 32 bits of the page's XXH3-64), so that a probe
can check the few pages it touches without hashing the whole block.
Metadata values are "sealed": a 4-byte tag naming what the value is, the XXH3-64 of the LMDB key
and the payload together, then the payload. ``unseal`` refuses a value whose tag or checksum is
wrong, or that is stored under another key, so a flipped bit in the LMDB file becomes a
``CorruptionError`` instead of a wrong directory entry.
"""

from __future__ import annotations

import struct

import numpy as np
import xxhash

from .disk_format import PAGE_SUM
from .errors import CorruptionError

_HEAD = struct.Struct("<4sQ")
SEAL_HEAD_BYTES = _HEAD.size  # the tag and checksum before a sealed value's payload


def block_checksum(data) -> int:
    """XXH3-64 of a block's bytes (any buffer)."""
    return xxhash.xxh3_64_intdigest(data)


def page_sum(page) -> int:
    """The 32-bit sum of one page of a block (any buffer)."""
    return xxhash.xxh3_64_intdigest(page) & 0xFFFFFFFF


def page_sums(data, page_bytes: int) -> np.ndarray:
    """The page sums (``PAGE_SUM``) of ``data`` (a pa.Buffer) cut into pages of ``page_bytes``
    (the last one shorter)."""
    mv, n, h = memoryview(data), data.size, xxhash.xxh3_64_intdigest
    return np.fromiter((h(mv[o:o + page_bytes]) & 0xFFFFFFFF for o in range(0, n, page_bytes)),
                       PAGE_SUM, (n + page_bytes - 1) // page_bytes)


def _digest(key: bytes, payload) -> int:
    h = xxhash.xxh3_64(key)
    h.update(payload)
    return h.intdigest()


def seal(tag: bytes, key: bytes, payload: bytes) -> bytes:
    """``payload`` prefixed with its 4-byte ``tag`` and the checksum of ``key`` + ``payload``,
    to be stored in LMDB under ``key``."""
    return _HEAD.pack(tag, _digest(key, payload)) + payload


def sealed_digest(value) -> int:
    """The checksum a sealed value carries (what the metadata root records for it)."""
    if len(value) < _HEAD.size:
        raise CorruptionError("a metadata value is damaged (truncated metadata value)")
    return _HEAD.unpack_from(value)[1]


def unseal(tag: bytes, key: bytes, value: bytes | memoryview, what: str) -> memoryview:
    """The payload of a value sealed for ``key``; CorruptionError naming ``what`` if damaged."""
    mv = memoryview(value)
    if len(mv) < _HEAD.size:
        raise CorruptionError(f"{what} is damaged (truncated metadata value)")
    got_tag, digest = _HEAD.unpack_from(mv)
    payload = mv[_HEAD.size:]
    if got_tag != tag or _digest(key, payload) != digest:
        raise CorruptionError(f"{what} is damaged (metadata checksum mismatch)")
    return payload
