"""Checksums of everything ebb stores: data blocks and every value in the commit metadata.

Blocks are checked with XXH3-64 (about 10 GB/s here, so a check costs a few percent of a read).
Metadata values are "sealed": a 4-byte tag naming what the value is, the XXH3-64 of the payload,
then the payload. ``unseal`` refuses a value whose tag or checksum is wrong, so a flipped bit in
the LMDB file becomes a ``CorruptionError`` instead of a wrong directory entry.
"""

from __future__ import annotations

import struct

import xxhash

from .errors import CorruptionError

_HEAD = struct.Struct("<4sQ")


def block_checksum(data) -> int:
    """XXH3-64 of a block's bytes (any buffer)."""
    return xxhash.xxh3_64_intdigest(data)


def seal(tag: bytes, payload: bytes) -> bytes:
    """``payload`` prefixed with its 4-byte ``tag`` and checksum, for storing in LMDB."""
    return _HEAD.pack(tag, xxhash.xxh3_64_intdigest(payload)) + payload


def unseal(tag: bytes, value: bytes | memoryview, what: str) -> memoryview:
    """The payload of a sealed value; CorruptionError naming ``what`` if it is damaged."""
    mv = memoryview(value)
    if len(mv) < _HEAD.size:
        raise CorruptionError(f"{what} is damaged (truncated metadata value)")
    got_tag, digest = _HEAD.unpack_from(mv)
    payload = mv[_HEAD.size:]
    if got_tag != tag or xxhash.xxh3_64_intdigest(payload) != digest:
        raise CorruptionError(f"{what} is damaged (metadata checksum mismatch)")
    return payload
