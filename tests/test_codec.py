"""Bucket encoding round-trips every storable type, with nulls, slices and many buckets."""

from __future__ import annotations

import decimal

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from ebb.storage import keys as keycodec
from ebb.storage.bucket_codec import BucketCodec
from ebb.storage.ranges import gather, scatter
from ebb.storage.schema import INS_SLOT, SchemaError, archive_schema


def physical(t: pa.Table, codec: BucketCodec) -> pa.Table:
    return t.append_column(INS_SLOT, pa.array(np.arange(t.num_rows, dtype=np.int32) - 3)).cast(codec.physical_schema)


def test_every_storable_type_round_trips():
    n = 7
    t = pa.table({
        "key": pa.array(["a", "b", "b", "é", "", "z", "zz"]),
        "ts": pa.array(range(n), pa.int64()),
        "exp": pa.array(range(10, 10 + n), pa.int64()),
        "i8": pa.array([1, None, -3, 4, 5, 6, 7], pa.int8()),
        "u16": pa.array([1, 2, None, 4, 5, 6, 65535], pa.uint16()),
        "f32": pa.array([1.5, None, 3, 4, 5, 6, 7], pa.float32()),
        "f64": pa.array([float("nan"), 2, 3, None, 5, 6, 7]),
        "b": pa.array([True, False, None, True, False, True, True]),
        "d32": pa.array([1, 2, 3, None, 5, 6, 7], pa.date32()),
        "tsus": pa.array([1, 2, 3, 4, None, 6, 7], pa.timestamp("us", tz="UTC")),
        "dur": pa.array([1, 2, 3, 4, 5, None, 7], pa.duration("s")),
        "dec": pa.array([decimal.Decimal("1.25"), None, decimal.Decimal("-3.50"), 4, 5, 6, 7], pa.decimal128(10, 2)),
        "fsb": pa.array([b"ab", b"cd", None, b"ef", b"gh", b"ij", b"kl"], pa.binary(2)),
        "s": pa.array(["x", None, "", "long" * 100, "ü", "y", None]),
        "bin": pa.array([b"\x00", None, b"", b"\xff" * 9, b"a", b"b", b"c"]),
        "ls": pa.array(["p", "q", None, "r", "s", "t", "u"], pa.large_string()),
        "dict": pa.array(["u", "v", "u", None, "v", "u", "u"]).dictionary_encode(),
    })
    schema = archive_schema(t.schema, "key", "ts", "exp")
    assert schema.field("ls").type == pa.string() and schema.field("dict").type == pa.string()
    codec = BucketCodec(schema)
    src = physical(t.cast(schema), codec)
    for sl in (src, src.slice(2, 4)):
        bounds = np.array([0, 1, 3, sl.num_rows])
        buf, starts = codec.encode(sl, bounds)
        assert buf.size == int(codec.row_sizes(sl).sum())
        back = codec.decode(buf, starts[:-1], np.diff(bounds))
        assert back.schema == sl.schema
        assert repr(back.to_pylist()) == repr(sl.to_pylist())  # repr: NaN equals NaN
        # decoding a subset, out of order
        part = codec.decode(buf, starts[[2, 0]], np.diff(bounds)[[2, 0]])
        assert repr(part.to_pylist()) == repr(sl.slice(3).to_pylist() + sl.slice(0, 1).to_pylist())


def test_unsupported_types_named():
    for t in (pa.list_(pa.int64()), pa.struct([("a", pa.int64())]), pa.null()):
        with pytest.raises(SchemaError, match="payload"):
            archive_schema(pa.schema([("key", pa.int64()), ("ts", pa.int64()), ("exp", pa.int64()), ("payload", t)]), "key", "ts", "exp")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(-(2**63), 2**63 - 1), st.text(max_size=12)), max_size=40))
def test_key_encoding_preserves_order(pairs):
    ints = [p[0] for p in pairs]
    strs = [p[1] for p in pairs]
    ei = keycodec.encode(pa.array(ints, pa.int64()))
    es = keycodec.encode(pa.array(strs, pa.string()))
    assert [x for _, x in sorted(zip(ei, ints))] == sorted(ints)
    # byte order of UTF-8 is code point order
    assert [x for _, x in sorted(zip(es, strs))] == sorted(strs)
    assert keycodec.decode(ei, pa.int64()).to_pylist() == ints
    assert keycodec.decode(es, pa.string()).to_pylist() == strs


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 5000), max_size=200), st.integers(0, 2**32 - 1))
def test_gather_scatter(lengths, seed):
    rng = np.random.default_rng(seed)
    src = rng.integers(0, 256, 20000, dtype=np.uint8)
    lengths = np.array(lengths, dtype=np.int64)
    starts = rng.integers(0, 20000 - 5001, lengths.size)
    got = gather(src, starts, lengths)
    want = np.concatenate([src[s : s + l] for s, l in zip(starts, lengths)]) if lengths.size else np.zeros(0, np.uint8)
    assert np.array_equal(got, want)
    dst_starts = np.cumsum(lengths + 3) - lengths
    dst = np.zeros(int(dst_starts[-1] + lengths[-1] + 10) if lengths.size else 0, np.uint8)
    scatter(dst, dst_starts, got, lengths)
    for s, l, d in zip(starts, lengths, dst_starts):
        assert np.array_equal(dst[d : d + l], src[s : s + l])
