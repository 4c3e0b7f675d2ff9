"""Blocks and runs: every storable type round-trips through a run file, blocks respect their
size and section boundaries, descriptors survive storage, and damage is refused."""

from __future__ import annotations

import decimal

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from ebb.query.reader import ArchiveReader
from ebb.storage.archive import Archive
from ebb.storage.block_format import INS_SLOT, decode_block, physical_schema
from ebb.storage.disk_format import ALIGNED_BLOCK_BYTES, PAGE_BYTES
from ebb.storage.errors import CorruptionError, SchemaError
from ebb.storage.files import OpenFiles
from ebb.storage.run_descriptor import RunDescriptor
from ebb.storage.run_writer import write_run
from ebb.storage.schema import archive_schema
from ebb.storage.task_reader import read_blocks, spans
from ebb.storage.verify import verify

from support import Oracle, config, rows_multiset


def physical(t: pa.Table, schema: pa.Schema) -> pa.Table:
    return t.cast(schema).append_column(pa.field(INS_SLOT, pa.int64(), nullable=False),
                                        pa.array(np.arange(t.num_rows, dtype=np.int64) - 3))


def read_back(tmp_path, desc: RunDescriptor, schema: pa.Schema) -> pa.Table:
    files = OpenFiles(str(tmp_path))
    try:
        batches = [b for _, b in read_blocks(files.source(desc.name, True), desc.entries(), physical_schema(schema), "t")]
    finally:
        files.close()
    return pa.Table.from_batches(batches, physical_schema(schema))


def test_every_storable_type_round_trips(tmp_path):
    n = 7
    t = pa.table({
        "key": pa.array(["", "a", "b", "b", "z", "zz", "é"]),
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
    src = physical(t, schema)
    for block_bytes in (256, 1 << 20):  # several blocks, then one
        for sl, name in ((src, f"a{block_bytes}.run"), (src.slice(2, 4), f"b{block_bytes}.run")):
            desc = write_run(str(tmp_path), name, 0, [(sl, None)], "key", "ts", "exp", block_bytes)
            back = read_back(tmp_path, desc, schema)
            assert repr(back.to_pylist()) == repr(sl.to_pylist())  # repr: NaN equals NaN
            assert desc.first_keys[0] == sl.column("key")[0].as_py()
            assert desc.last_keys[-1] == sl.column("key")[-1].as_py()


def test_unsupported_and_reserved_columns_named():
    for t in (pa.list_(pa.int64()), pa.struct([("a", pa.int64())]), pa.null()):
        with pytest.raises(SchemaError, match="payload"):
            archive_schema(pa.schema([("key", pa.int64()), ("ts", pa.int64()), ("exp", pa.int64()), ("payload", t)]), "key", "ts", "exp")
    with pytest.raises(SchemaError, match="reserved"):
        archive_schema(pa.schema([("key", pa.int64()), ("ts", pa.int64()), ("exp", pa.int64()), ("__ebb_sub", pa.int64())]),
                       "key", "ts", "exp")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(-50, 50), st.integers(1, 6)), min_size=1, max_size=300),
       st.sampled_from([256, 700, 5000]), st.booleans())
def test_blocks_cut_to_size_and_sections(tmp_path_factory, rows, block_bytes, int_keys):
    """Blocks stay near their target size, never span two sections, are in (slot, key, exp)
    order, and the descriptor's per-block fields describe exactly what each block holds."""
    d = tmp_path_factory.mktemp("runs")
    rows = sorted(rows, key=lambda r: (r[1], r[0]))  # (slot, key)
    keys = [r[0] if int_keys else f"k{r[0] + 100:04d}" for r in rows]
    slots = np.array([r[1] for r in rows])
    exp = slots * 10 + np.arange(len(rows)) % 3
    t = pa.table({"key": keys, "ts": np.zeros(len(rows), np.int64), "exp": exp, "v": np.arange(len(rows))})
    schema = archive_schema(t.schema, "key", "ts", "exp")
    src = physical(t, schema)
    desc = RunDescriptor.from_bytes(write_run(str(d), "r.run", 3, [(src, slots)], "key", "ts", "exp", block_bytes).to_bytes(), "r.run", "t")
    assert desc.subindex == 3 and int(desc.blocks["rows"].sum()) == len(rows)
    assert (np.diff(desc.blocks["slot"]) >= 0).all()
    files = OpenFiles(str(d))
    start = 0
    for e, batch in read_blocks(files.source("r.run", True), desc.entries(), physical_schema(schema), "t"):
        part = src.slice(start, batch.num_rows)
        assert batch.to_pylist() == part.to_pylist()
        assert len(set(slots[start:start + batch.num_rows])) == 1 and e.slot == slots[start]
        assert e.min_exp == int(exp[start:start + batch.num_rows].min())
        # at most one row past the target (a block always holds at least one row)
        assert e.rows == 1 or e.length <= block_bytes + 4096
        start += batch.num_rows
    files.close()


def test_damaged_blocks_and_descriptors_are_refused(tmp_path):
    t = pa.table({"key": np.arange(100), "ts": np.zeros(100, np.int64), "exp": np.full(100, 5), "v": np.arange(100.0)})
    schema = archive_schema(t.schema, "key", "ts", "exp")
    desc = write_run(str(tmp_path), "r.run", 0, [(physical(t, schema), None)], "key", "ts", "exp", 1024)
    raw = bytearray((tmp_path / "r.run").read_bytes())
    e = desc.blocks[1]
    for pos in (int(e["offset"]), int(e["offset"]) + int(e["length"]) // 2, int(e["offset"]) + int(e["length"]) - 1):
        bad = bytearray(raw)
        bad[pos] ^= 0x10
        buf = pa.py_buffer(bytes(bad[int(e["offset"]):int(e["offset"]) + int(e["length"])]))
        with pytest.raises(CorruptionError, match="checksum"):
            decode_block(buf, physical_schema(schema), int(e["offset"]), int(e["rows"]), int(e["checksum"]), "I1")
    sealed = bytearray(desc.to_bytes())
    for pos in (0, 5, 20, len(sealed) - 1):
        bad = bytearray(sealed)
        bad[pos] ^= 0x01
        with pytest.raises(CorruptionError):
            RunDescriptor.from_bytes(bytes(bad), "r.run", "descriptor")
    with pytest.raises(CorruptionError):  # intact, but stored under another run's name
        RunDescriptor.from_bytes(bytes(sealed), "s.run", "descriptor")


def _mixed_run(tmp_path, n=3000, block_bytes=48 << 10):
    """A run of sorted records of several types (with nulls), blocks of several pages."""
    rng = np.random.default_rng(7)
    key = np.sort(rng.integers(0, 400, n))
    nulls = rng.random(n) < 0.1
    t = pa.table({
        "key": key, "ts": np.zeros(n, np.int64), "exp": rng.integers(5, 9, n),
        "f": pa.array(rng.random(n), mask=nulls),
        "b": pa.array(rng.random(n) < 0.5, mask=nulls),
        "s": pa.array(["x" * int(k) for k in rng.integers(0, 60, n)], mask=nulls),
        "d": pa.array(rng.integers(0, 1000, n).astype(np.int32), pa.date32()),
    })
    order = np.lexsort([t.column("exp").to_numpy(), key])
    t = t.take(pa.array(order))
    schema = archive_schema(t.schema, "key", "ts", "exp")
    desc = write_run(str(tmp_path), "m.run", 0, [(physical(t, schema), None)], "key", "ts", "exp", block_bytes)
    assert desc.blocks.size > 2 and desc.page_start[1] > 4  # several blocks of several pages
    return t.cast(schema), schema, desc


def _keyed(tmp_path, desc, schema, ranges, as_of=6, pages=True) -> pa.Table:
    from ebb.storage.read_plan import ReadTask
    from ebb.storage.task_reader import execute

    sums = tuple(desc.block_sums(b, desc.sums) for b in range(desc.blocks.size)) if pages else ()
    task = ReadTask(0, desc.name, tuple(desc.entries()), as_of, tuple(ranges), 0, sums)
    files = OpenFiles(str(tmp_path))
    try:
        return pa.Table.from_batches(list(execute(task, files, physical_schema(schema), "key", "ts", "exp", "t")), schema)
    finally:
        files.close()


def _want(t: pa.Table, lo, hi, as_of=6) -> pa.Table:
    k, e = t.column("key").to_numpy(), t.column("exp").to_numpy()
    return t.filter(pa.array((k >= lo) & (k <= hi) & (e > as_of)))


def test_keyed_reads_in_place_return_exactly_the_rows_asked_for(tmp_path):
    t, schema, desc = _mixed_run(tmp_path)
    for lo, hi in [(0, 0), (17, 17), (399, 399), (1000, 1000), (50, 120), (-5, 3)]:
        assert _keyed(tmp_path, desc, schema, [(lo, hi)]).equals(_want(t, lo, hi))
        # runs written before page sums existed are read whole, block by block
        assert _keyed(tmp_path, desc, schema, [(lo, hi)], pages=False).equals(_want(t, lo, hi))
    old = RunDescriptor.from_bytes(RunDescriptor(desc.name, 0, desc.blocks, desc.first_keys, desc.last_keys).to_bytes(),
                                   desc.name, "descriptor")
    assert old.sums is None and not old.paged and old.block_sums(0, old.sums) == b""
    # read without its page sums, a descriptor keeps everything else; the sums come separately
    sealed = desc.to_bytes()
    lean = RunDescriptor.from_bytes(sealed, desc.name, "descriptor", with_sums=False)
    assert lean.sums is None and lean.paged and np.array_equal(lean.blocks, desc.blocks)
    assert (lean.first_keys, lean.last_keys) == (desc.first_keys, desc.last_keys)
    assert np.array_equal(RunDescriptor.sums_from_bytes(sealed, desc.name, "descriptor"), desc.sums)
    assert desc.without_sums().sums is None and desc.without_sums().paged
    both = _keyed(tmp_path, desc, schema, [(3, 3), (250, 250)])
    assert both.equals(pa.concat_tables([_want(t, 3, 3), _want(t, 250, 250)]))


def test_keyed_reads_check_every_page_they_use(tmp_path):
    """A flipped byte in any page of a block: a keyed read returns the right rows or raises
    CorruptionError; a flip in the page holding the IPC metadata always raises."""
    t, schema, desc = _mixed_run(tmp_path)
    path = tmp_path / "m.run"
    pristine = path.read_bytes()
    e = desc.entry(1)
    lo, hi = desc.first_keys[1], desc.last_keys[1]
    probes = [lo, (lo + hi) // 2, hi]
    for page in range(int(desc.page_start[2] - desc.page_start[1])):
        bad = bytearray(pristine)
        bad[e.offset + min(page * 4096 + 100, e.length - 1)] ^= 0x04
        path.write_bytes(bytes(bad))
        for a, z in [(k, k) for k in probes] + [(lo, hi)]:  # a range over the whole block is checked whole
            try:
                got = _keyed(tmp_path, desc, schema, [(a, z)])
            except CorruptionError:
                continue
            assert got.equals(_want(t, a, z)), f"page {page}: read of keys {a}-{z} returned wrong rows"
        if page == 0:  # the metadata: every read of the block needs it
            with pytest.raises(CorruptionError, match="page 0"):
                _keyed(tmp_path, desc, schema, [(lo, lo)])
    path.write_bytes(pristine)


@pytest.mark.parametrize("order", [["key", "ts", "exp", "f"], ["ts", "exp", "d", "b", "key"], ["s", "key", "ts", "exp"]])
def test_prefetched_head_of_a_block_covers_what_a_keyed_read_touches_first(tmp_path, order):
    """The bytes ``prefetch_heads`` asks for up front hold the block's IPC metadata and, when only
    fixed-width columns come before the key, the whole key column (else a cold probe would
    still fault those pages in one by one), and not much more."""
    from ebb.storage.task_reader import _head_bytes

    (tmp_path / "src").mkdir()
    t, schema, _ = _mixed_run(tmp_path / "src")
    t = t.select(order + [c for c in t.column_names if c not in order])
    schema = archive_schema(t.schema, "key", "ts", "exp")
    desc = write_run(str(tmp_path), "h.run", 0, [(physical(t, schema), None)], "key", "ts", "exp", 48 << 10)
    head = _head_bytes(physical_schema(schema), "key")
    data = (tmp_path / "h.run").read_bytes()
    key_first_fixed = order[0] != "s"
    for e in desc.entries():
        block = pa.py_buffer(data[e.offset:e.offset + e.length])
        metadata = 8 + int.from_bytes(data[e.offset + 4:e.offset + 8], "little")
        key_values = decode_block(block, physical_schema(schema), e.offset, e.rows, e.checksum, "t").column("key").buffers()[1]
        key_end = key_values.address - block.address + 8 * e.rows
        if key_first_fixed:
            assert key_end <= head(e.rows) < key_end + (8 << 10)
        else:
            assert metadata <= head(e.rows) <= 4096


def _gaps(desc: RunDescriptor) -> tuple[np.ndarray, np.ndarray]:
    """Each block's length, and the bytes between each block and the one before it."""
    offsets, lengths = desc.blocks["offset"].astype(np.int64), desc.blocks["length"].astype(np.int64)
    return lengths, offsets[1:] - (offsets[:-1] + lengths[:-1])


def test_long_blocks_start_on_a_page_and_everything_reads_across_the_zeros(tmp_path):
    """A block of at least ALIGNED_BLOCK_BYTES starts on a page of its file, after fewer than a
    page of zeros; a shorter one right after the block before it. Adjacent blocks are still read
    together, and probes, scans and verify answer as the oracle, with the zeros damaged too."""
    rng = np.random.default_rng(5)
    rows = [{"key": int(k), "ts": int(t), "exp": int(t) + 12, "s": "x" * int(n)}
            for k, t, n in zip(rng.integers(0, 500, 6000), rng.integers(10, 16, 6000), rng.integers(50, 300, 6000))]
    oracle = Oracle()
    oracle.load(rows, 16)
    with Archive.create(str(tmp_path / "a"), config(G=1, E=1, block_bytes=ALIGNED_BLOCK_BYTES + (8 << 10))) as arc:
        arc.load(pa.Table.from_pylist(rows), 16)
        with arc.snapshot() as snap:
            run = snap.state.subindices[0].runs[0]
            desc = snap.descriptor(run.name)
        path = tmp_path / "a" / "data" / run.name
    lengths, gaps = _gaps(desc)
    long = lengths >= ALIGNED_BLOCK_BYTES
    assert long.sum() >= 3 and not long[-1]  # the last block is shorter
    assert (desc.blocks["offset"][long] % PAGE_BYTES == 0).all()
    assert gaps.any() and (gaps >= 0).all() and (gaps < PAGE_BYTES).all() and (gaps[~long[1:]] == 0).all()
    assert spans(desc.entries()) == [(0, len(lengths))]  # one read, the zeros skipped
    raw = bytearray(path.read_bytes())
    for b in np.flatnonzero(gaps):  # the zeros, then damage to them: dead bytes, no answer changes
        start = int(desc.blocks["offset"][b] + lengths[b])
        assert not any(raw[start:start + int(gaps[b])])
        raw[start] ^= 0xFF
    path.write_bytes(bytes(raw))
    with Archive(str(tmp_path / "a"), readonly=True) as arc:
        reader = ArchiveReader(arc)
        for k in range(-1, 501, 7):
            assert rows_multiset(reader.probe(k, 16)) == oracle.probe(k, 16), k
        assert rows_multiset(reader.scan_table(16)) == oracle.scan(16)
        assert verify(arc)[0] == []


def test_short_blocks_follow_one_another_with_no_gap(tmp_path):
    _, _, desc = _mixed_run(tmp_path)
    lengths, gaps = _gaps(desc)
    assert (lengths < ALIGNED_BLOCK_BYTES).all() and (gaps == 0).all()
