"""Vectorised copies of many byte ranges at once (gather and scatter over numpy uint8 arrays).

Buckets are small when keys are many, so copying them one Python slice at a time would cost a
Python call per record. Short ranges are copied in bulk through a computed index array; long
ranges (at least ``_LONG`` bytes) are copied as slices, which bounds the Python overhead to one
call per ``_LONG`` bytes moved.
"""

from __future__ import annotations

import numpy as np

_LONG = 2048  # a range this long is copied as a slice
_CHUNK = 1 << 23  # bytes of short ranges copied per index array (bounds temporary memory)


def _positions(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of arange(s, s + l) for each (s, l)."""
    ends = np.cumsum(lengths)
    total = int(ends[-1]) if ends.size else 0
    return np.repeat(starts - (ends - lengths), lengths) + np.arange(total, dtype=np.int64)


def _chunks(lengths: np.ndarray):
    """Yields index slices of ranges whose total length is about _CHUNK."""
    ends = np.cumsum(lengths)
    cuts = np.searchsorted(ends, np.arange(_CHUNK, int(ends[-1]) + _CHUNK, _CHUNK), side="right")
    lo = 0
    for hi in np.unique(np.append(cuts, lengths.size)):
        if hi > lo:
            yield slice(lo, int(hi))
            lo = int(hi)


def gather(src: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Returns src[s0:s0+l0] ++ src[s1:s1+l1] ++ ... as a new uint8 array."""
    starts = np.asarray(starts, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    out_pos = np.cumsum(lengths) - lengths
    out = np.empty(int(lengths.sum()), dtype=np.uint8)
    if out.size == 0:
        return out
    long = lengths >= _LONG
    for s, l, o in zip(starts[long].tolist(), lengths[long].tolist(), out_pos[long].tolist()):
        out[o : o + l] = src[s : s + l]
    short = np.flatnonzero(~long & (lengths > 0))
    if short.size:
        for sl in _chunks(lengths[short]):
            idx = short[sl]
            out[_positions(out_pos[idx], lengths[idx])] = src[_positions(starts[idx], lengths[idx])]
    return out


def scatter(dst: np.ndarray, dst_starts: np.ndarray, src: np.ndarray, lengths: np.ndarray) -> None:
    """Copies consecutive pieces of ``src`` (lengths[0] bytes, then lengths[1], ...) to
    dst[dst_starts[i] : dst_starts[i] + lengths[i]]."""
    dst_starts = np.asarray(dst_starts, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    src_pos = np.cumsum(lengths) - lengths
    if lengths.size == 0 or int(lengths.sum()) == 0:
        return
    long = lengths >= _LONG
    for d, l, s in zip(dst_starts[long].tolist(), lengths[long].tolist(), src_pos[long].tolist()):
        dst[d : d + l] = src[s : s + l]
    short = np.flatnonzero(~long & (lengths > 0))
    if short.size:
        for sl in _chunks(lengths[short]):
            idx = short[sl]
            dst[_positions(dst_starts[idx], lengths[idx])] = src[_positions(src_pos[idx], lengths[idx])]
