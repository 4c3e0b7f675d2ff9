"""Fuzzing of ebb's parsers: a damaged or malformed input decodes right or is a CorruptionError.

(a) Blocks. Random record batches of the archive's column types are written as ebb blocks
(``block_format.encode_blocks``), then mutated (bit flips, overwrites of the IPC metadata,
truncations, the metadata length field). Each is read by the native probe (a run of that one
block), by the Python block decoder (``decode_block``) and by the in-place keyed read
(``page_check``), in two ways:

- *damaged*: the descriptor is the block's own (checksum and page sums of the bytes written), as
  on disk after the damage. The whole-block decoder refuses every real mutation; the keyed reads
  either answer exactly as pyarrow does from the unmutated block or raise CorruptionError (a
  mutation in a page they never use goes unseen, and changes nothing they return).
- *resealed*: checksum and page sums recomputed over the mutated bytes, so the parsers meet them
  unprotected (as after a writer's bug). No reader crashes or raises anything but
  CorruptionError, and where ``pyarrow.ipc.read_record_batch`` decodes the same bytes and they
  pass its full validation (with the keys still sorted), each answers as pyarrow does.

Each example runs in a forked child, so a crash fails the example instead of the test run.

(b) Run descriptors and (c) sealed metadata values (configuration, state, schema, checksum
seals): random and mutated bytes, sealed or not, decode to the same value or raise
CorruptionError, never another exception.

Examples per test: EBB_FUZZ_EXAMPLES (default 40, a few seconds each); a long run is
``EBB_FUZZ_EXAMPLES=100000 pytest tests/test_parser_fuzz.py`` (docs/spec.md, "Corruption").
"""

from __future__ import annotations

import os
import pickle
import traceback
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from ebb.storage import point_probe
from ebb.storage.block_format import INS_SLOT, decode_block, encode_blocks, physical_schema
from ebb.storage.checksum import block_checksum, page_sums, seal, unseal
from ebb.storage.errors import CorruptionError
from ebb.storage.files import OpenFiles
from ebb.storage.page_check import decode_in_place, key_rows
from ebb.storage.run_descriptor import BLOCK, PAGE_BYTES, RunDescriptor

settings.register_profile("fuzz", max_examples=int(os.environ.get("EBB_FUZZ_EXAMPLES", "40")), deadline=None,
                          suppress_health_check=list(HealthCheck), derandomize=False)
FUZZ = settings.get_profile("fuzz")

PAYLOAD_TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint32(), pa.uint64(), pa.float32(),
                 pa.float64(), pa.bool_(), pa.string(), pa.binary(), pa.date32(), pa.timestamp("us")]


# -- blocks -------------------------------------------------------------------------------------------
def _table(seed: int, rows: int, payload: list[int]) -> tuple[pa.Table, pa.Schema]:
    """A physical table (sorted by key, exp) with int64 key/ts/exp, the payload columns of the
    types ``payload`` indexes, with nulls, and the insertion slot; and its archive schema."""
    rng = np.random.default_rng(seed)
    keys = np.sort(rng.integers(-3, 6, rows) * int(rng.choice([1, 1 << 40])))
    ts = rng.integers(0, 20, rows)
    exp = ts + rng.integers(1, 20, rows)
    order = np.lexsort((exp, keys))
    cols = {"key": pa.array(keys[order]), "ts": pa.array(ts[order]), "exp": pa.array(exp[order])}
    for j, t in enumerate(PAYLOAD_TYPES[i] for i in payload):
        nulls = rng.random(rows) < 0.2
        if pa.types.is_string(t) or pa.types.is_binary(t):
            vals = ["x" * int(n) + str(i) for i, n in enumerate(rng.integers(0, 40, rows))]
            arr = pa.array(vals, pa.string()).cast(t)
        elif pa.types.is_boolean(t):
            arr = pa.array(rng.random(rows) < 0.5)
        elif pa.types.is_floating(t):
            arr = pa.array(rng.normal(size=rows)).cast(t)
        else:  # the integers' storage type first: Arrow casts int64 to no date type
            arr = pa.array(rng.integers(0, 100, rows)).cast(pa.int32() if t == pa.date32() else pa.int64()).cast(t)
        cols[f"c{j}"] = pa.array(arr.to_pylist(), t, mask=nulls)
    table = pa.table(cols)
    schema = pa.schema([pa.field(f.name, f.type, nullable=f.name not in ("key", "ts", "exp")) for f in table.schema])
    table = table.cast(schema).append_column(INS_SLOT, pa.array(np.arange(rows, dtype=np.int64)))
    return table.cast(physical_schema(schema)), schema


def _mutate(data: bytes, kind: str, at: float, value: int, span: int) -> bytes:
    """``data`` with one mutation of ``kind``; ``at`` in [0, 1) places it, ``value`` and ``span``
    size it."""
    b = bytearray(data)
    meta = int.from_bytes(b[4:8], "little")
    if kind == "flip":
        i = int(at * len(b))
        b[i] ^= 1 << (value % 8)
    elif kind == "metadata":  # overwrite bytes of the flatbuffer metadata
        i = 8 + int(at * max(1, min(meta, len(b) - 8)))
        b[i:i + span] = bytes((value + k * 37) & 0xFF for k in range(span))[:len(b) - i]
    elif kind == "length":  # the metadata length, or an int64 of the metadata (a buffer's offset or length)
        if value % 2:
            b[4:8] = (meta + value // 2 - 64).to_bytes(4, "little", signed=True) if -1 < meta + value // 2 - 64 < 1 << 31 \
                else b"\xff\xff\xff\x7f"
        else:
            i = 8 + 8 * int(at * max(1, min(meta, len(b) - 16) // 8))
            b[i:i + 8] = (int.from_bytes(b[i:i + 8], "little") + value - 500).to_bytes(8, "little", signed=True) \
                if -(1 << 63) <= int.from_bytes(b[i:i + 8], "little") + value - 500 < 1 << 63 else b[i:i + 8]
    elif kind == "truncate":
        del b[int(at * len(b)):]
    else:  # "zero": a zeroed stretch, as a punched or lost page
        i = int(at * len(b))
        b[i:i + span * 64] = bytes(len(b[i:i + span * 64]))
    return bytes(b)


def _outcome(fn):
    try:
        return ("rows", fn())
    except CorruptionError as e:
        return ("corrupt", str(e))
    except Exception as e:  # noqa: BLE001 - reported as a failure
        return ("other", f"{type(e).__name__}: {e}")


def _rows(batch, n_out: int) -> list[tuple]:
    """The first ``n_out`` columns of ``batch`` as row tuples."""
    t = pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch
    # dates and times as their integers: a mutated one may lie outside Python's datetime
    cols = [(c.cast(pa.int32() if c.type.bit_width == 32 else pa.int64()) if pa.types.is_temporal(c.type) else c)
            .to_pylist() for c in t.columns[:n_out]]
    return list(zip(*cols))


def _wanted(batch: pa.RecordBatch, key: int, as_of: int, n_out: int) -> Counter:
    """What a probe of ``key`` at ``as_of`` returns from ``batch``, by pyarrow and Python alone."""
    return Counter(r for r in _rows(batch, n_out) if r[0] == key and r[1] <= as_of < r[2])


UNVALIDATED = "decoded with malformed values"


def _decode_all(tmp: str, data: bytes, written_length: int, rows: int, checksum: int, sums: np.ndarray,
                first_key: int, last_key: int, max_exp: int, physical: pa.Schema, schema: pa.Schema,
                key: int, as_of: int) -> dict:
    """Runs (in the child) every ebb decoder on block bytes ``data`` under the descriptor fields
    given; the outcome of each."""
    n_out = len(schema)
    name = "I0001-00000001-00000000.run"
    with open(os.path.join(tmp, name), "wb") as f:
        f.write(data)
    blocks = np.zeros(1, BLOCK)
    blocks[0] = (0, written_length, rows, 0, max_exp, 0, -1, checksum)
    desc = RunDescriptor(name, 0, blocks, [first_key], [last_key], sums)
    files = OpenFiles(tmp)
    out = {}

    def native():
        layout = point_probe.ColumnLayout.of(physical, "key", "ts", "exp")
        arrays = point_probe.RunArrays.of(desc, sums)
        run = point_probe.PreparedRun.of(point_probe.RunToProbe(0, "I1", name), files.mapped(name), arrays)
        runs = point_probe.ProbeRuns.of([run], [(max_exp, 0)], layout, schema)
        table, _ = point_probe.probe(runs, key, as_of, schema, "fuzz")
        return Counter(_rows(table, n_out))

    def whole():
        buf = files.source(name, sequential=True).read(0, written_length, "fuzz")
        batch = decode_block(buf, physical, 0, rows, checksum, "fuzz")
        try:  # decode_block checks the buffers' sizes; values (offsets, UTF-8) only the checksum vouches for
            batch.validate(full=True)
        except pa.ArrowInvalid:
            return UNVALIDATED
        return _wanted(batch, key, as_of, n_out)

    def in_place():
        view = files.mapped(name).view(0, written_length, "fuzz")
        batch, check = decode_in_place(view, sums, physical, "fuzz")
        if batch.num_rows != rows:
            raise CorruptionError("row count")
        got = Counter()
        for a, b in key_rows(batch, check, "key", ((key, key),)):
            check.rows_of(batch.columns[:-1], a, b)
            part = batch.slice(a, b - a)
            try:  # as ``whole``: the pages' sums vouch for the values (UTF-8) of the rows read
                part.validate(full=True)
            except pa.ArrowInvalid:
                return UNVALIDATED
            got += _wanted(part, key, as_of, n_out)
        return got

    if point_probe.NATIVE:
        out["native"] = _outcome(native)
    out["whole"] = _outcome(whole)
    out["in_place"] = _outcome(in_place)
    files.close()
    return out


def _in_child(fn):
    """``fn()`` run in a forked child; its result, or a failure naming the signal that killed it."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            res = pickle.dumps(("ok", fn()))
        except BaseException:  # noqa: BLE001 - reported to the parent
            res = pickle.dumps(("error", traceback.format_exc()))
        with os.fdopen(w, "wb") as f:
            f.write(res)
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        raw = f.read()
    _, status = os.waitpid(pid, 0)
    assert not os.WIFSIGNALED(status), f"the decoders killed the process ({os.WTERMSIG(status)})"
    kind, res = pickle.loads(raw)
    assert kind == "ok", res
    return res


def _reference(data: bytes, physical: pa.Schema):
    """pyarrow's decoding of ``data`` (validated), or None if it refuses it."""
    try:
        batch = pa.ipc.read_record_batch(pa.py_buffer(data), physical)
        batch.validate(full=True)
        return batch
    except (pa.ArrowInvalid, pa.ArrowIOError, ValueError, EOFError):
        return None


MUTATIONS = st.tuples(st.sampled_from(["flip", "metadata", "length", "truncate", "zero"]),
                      st.floats(0, 1, exclude_max=True), st.integers(0, 1000), st.integers(1, 16))


@FUZZ
@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 400),
       payload=st.lists(st.integers(0, len(PAYLOAD_TYPES) - 1), max_size=4),
       mutation=MUTATIONS, probe=st.tuples(st.integers(-3, 5), st.integers(0, 40)))
@example(seed=0, rows=50, payload=[10], mutation=("truncate", 0.0, 0, 1), probe=(0, 10))  # empty: EOFError
@example(seed=0, rows=1, payload=[], mutation=("flip", 0.875, 0, 1), probe=(0, 0))  # a buffer too short
@example(seed=0, rows=217, payload=[12, 12, 0], mutation=("flip", 0.60546875, 0, 1), probe=(0, 38))  # a date out of range
@example(seed=0, rows=97, payload=[], mutation=("length", 0.4375, 514, 1), probe=(0, 0))  # a bitmap, no nulls counted
@example(seed=0, rows=10, payload=[10], mutation=("flip", 0.8125, 7, 1), probe=(2, 0))  # resealed: a string not UTF-8
def test_blocks_decode_right_or_raise(tmp_path, seed, rows, payload, mutation, probe):
    table, schema = _table(seed, rows, payload)
    physical = table.schema
    block = next(encode_blocks(table, "key", "ts", "exp", 1 << 30, PAGE_BYTES))
    data = block.data.to_pybytes()
    bad = _mutate(data, *mutation)
    key = probe[0] if abs(table.column("key")[-1].as_py()) < 1 << 30 else probe[0] << 40  # present or near
    as_of = probe[1]
    original = pa.ipc.read_record_batch(block.data, physical)
    want = _wanted(original, key, as_of, len(schema))

    # damaged: the descriptor of the bytes written
    got = _in_child(lambda: _decode_all(str(tmp_path), bad, len(data), block.rows, block.checksum, block.sums,
                                        block.first_key, block.last_key, block.max_exp, physical, schema, key, as_of))
    for reader, (kind, res) in got.items():
        assert kind != "other", f"{reader}: {res}"
        if bad == data:
            assert kind == "rows" and res == want, f"{reader} on an intact block: {res}"
        elif reader == "whole":
            assert kind == "corrupt", "a damaged block was decoded whole"
        elif kind == "rows":
            assert res == want, f"{reader}: a wrong answer from a damaged block"

    # resealed: the parsers meet the mutated bytes with their sums matching
    if not bad:
        return
    ref = _reference(bad, physical)
    sums = page_sums(pa.py_buffer(bad), PAGE_BYTES)
    got = _in_child(lambda: _decode_all(str(tmp_path), bad, len(bad), block.rows, block_checksum(bad), sums,
                                        block.first_key, block.last_key, block.max_exp, physical, schema, key, as_of))
    searched = block.first_key <= key <= block.last_key and as_of < block.max_exp  # else the native probe skips it
    for reader, (kind, res) in got.items():
        assert kind != "other", f"{reader} (resealed): {res}"
        if kind != "rows" or reader == "native" and not searched:
            continue
        if res == UNVALIDATED:  # read_record_batch accepts the same bytes: only a checksum can refuse them
            assert reader in ("whole", "in_place") and ref is None
        # ref None: malformed where this reader does not look (pyarrow's full validation counts every
        # column's nulls); its answer is then what the bytes it uses say, with no reference to compare
        elif ref is not None and ref.num_rows == block.rows and np.all(np.diff(ref.column("key").to_numpy()) >= 0):
            # a search finds what a filter does (on unsorted keys it may not, and need not)
            assert res == _wanted(ref, key, as_of, len(schema)), f"{reader} (resealed) disagrees with pyarrow"


# -- run descriptors -------------------------------------------------------------------------------------
@st.composite
def descriptors(draw) -> RunDescriptor:
    n = draw(st.integers(0, 12))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    blocks = np.zeros(n, BLOCK)
    lengths = rng.integers(1, 3 * PAGE_BYTES, n)
    blocks["offset"] = np.concatenate([[0], np.cumsum(lengths)[:-1]]) if n else []
    blocks["length"], blocks["rows"] = lengths, rng.integers(1, 500, n)
    blocks["slot"] = np.sort(rng.integers(-1, 3, n))
    blocks["checksum"] = rng.integers(0, 2**63, n, dtype=np.uint64)
    if draw(st.booleans()):
        keys = sorted(rng.integers(-2**62, 2**62, 2 * n).tolist())
    else:
        keys = sorted(f"k{v}\u00e9" for v in rng.integers(0, 10**6, 2 * n))
    sums = rng.integers(0, 2**32, int(((lengths + PAGE_BYTES - 1) // PAGE_BYTES).sum()), dtype=np.uint32) \
        if draw(st.booleans()) else None
    return RunDescriptor(f"I0001-{draw(st.integers(0, 10**8)):08d}-00000000.run", 0, blocks, keys[0::2], keys[1::2],
                         sums, schema=draw(st.integers(0, 3)))


def _same(a: RunDescriptor, b: RunDescriptor) -> bool:
    return (a.name, a.subindex, a.first_keys, a.last_keys, a.schema, a.paged) == \
        (b.name, b.subindex, b.first_keys, b.last_keys, b.schema, b.paged) and a.blocks.tobytes() == b.blocks.tobytes() \
        and (a.sums is None) == (b.sums is None) and (a.sums is None or np.array_equal(a.sums, b.sums))


BYTE_EDITS = st.lists(st.tuples(st.sampled_from(["flip", "set", "cut", "insert"]), st.floats(0, 1, exclude_max=True),
                                st.integers(0, 255)), min_size=1, max_size=4)


def _edit(data: bytes, edits) -> bytes:
    b = bytearray(data)
    for kind, at, v in edits:
        i = int(at * len(b)) if b else 0
        if kind == "flip" and b:
            b[i] ^= 1 << (v % 8)
        elif kind == "set" and b:
            b[i] = v
        elif kind == "cut":
            del b[i:]
        else:
            b[i:i] = bytes([v]) * (1 + v % 9)
    return bytes(b)


@FUZZ
@given(desc=descriptors(), edits=BYTE_EDITS, resealed=st.booleans(), with_sums=st.booleans())
@example(desc=RunDescriptor("I0001-00000000-00000000.run", 0, np.zeros(0, BLOCK), [], []),
         edits=[("set", 0.5, 0)], resealed=True, with_sums=True)  # a head that is not JSON: was JSONDecodeError
@example(desc=RunDescriptor("I0001-00000000-00000000.run", 0, np.zeros(0, BLOCK), [], []),
         edits=[("cut", 0.0, 0)], resealed=True, with_sums=True)  # an empty body: was struct.error
def test_run_descriptors_decode_right_or_raise(desc, edits, resealed, with_sums):
    value = desc.to_bytes()
    key = RunDescriptor.key(desc.name)
    assert _same(RunDescriptor.from_bytes(value, desc.name, "fuzz", True), desc)
    bad = _edit(value, edits)
    if resealed:  # a malformed payload under a valid seal
        bad = seal(b"RUN2", key, _edit(bytes(unseal(b"RUN2", key, value, "fuzz")), edits))
    for decode in (lambda: RunDescriptor.from_bytes(bad, desc.name, "fuzz", with_sums),
                   lambda: RunDescriptor.sums_from_bytes(bad, desc.name, "fuzz")):
        try:
            got = decode()
        except CorruptionError:
            continue
        if bad == value:
            continue
        assert resealed, "a damaged descriptor was decoded"
        if isinstance(got, RunDescriptor):  # whatever it decoded must be whole and usable
            assert len(got.first_keys) == len(got.last_keys) == got.blocks.size
            assert got.sums is None or got.sums.size == got.page_start[-1]
            got.entries(), got.key_blocks(None, None, 0)


# -- sealed metadata values ---------------------------------------------------------------------------------
def _metadata_values():
    """(tag, key, sealed value, parse) of each kind of sealed metadata value of a real archive."""
    import tempfile

    from ebb.storage import manifest
    from ebb.storage.archive import Archive

    from support import SCHEMA, config, random_rows, table_of

    d = tempfile.mkdtemp()
    with Archive.create(os.path.join(d, "a"), config()) as arc:
        arc.load(table_of(random_rows(np.random.default_rng(1), 50, 1, 16, 16, 5), SCHEMA), 16)
        with arc.env.begin() as txn:
            cfg, state, schema = manifest.read_config_bytes(txn), manifest.read_state_bytes(txn), \
                manifest.read_schema_bytes(txn)
    return [(b"CONF", b"config", cfg, manifest.parse_config),
            (b"STAT", b"state", state, manifest.parse_state),
            (b"SCHM", b"schema", schema[0], lambda v, h=schema[1]: manifest.parse_schema_history((v, h))),
            (b"SCHH", b"schemas", schema[1], lambda v, s=schema[0]: manifest.parse_schema_history((s, v)))]


@pytest.fixture(scope="module")
def metadata_values():
    return _metadata_values()


@FUZZ
@given(which=st.integers(0, 3), edits=BYTE_EDITS, resealed=st.booleans(), junk=st.binary(max_size=64))
@example(which=0, edits=[("set", 0.0, 0)], resealed=True, junk=b"")  # configuration not JSON: was JSONDecodeError
@example(which=2, edits=[("flip", 0.0, 0)], resealed=True, junk=b"")  # schema not IPC: was OSError
def test_metadata_values_decode_right_or_raise(metadata_values, which, edits, resealed, junk):
    tag, key, value, parse = metadata_values[which]
    want = parse(value)
    for bad in (_edit(value, edits), junk):
        if bad == b"" and key == b"schemas":
            continue  # what the caller passes for "no history" (``manifest.read_schema_bytes``)
        if resealed:
            bad = seal(tag, key, _edit(bytes(unseal(tag, key, value, "fuzz")), edits) if bad is not junk else junk)
        try:
            got = parse(bad)
        except CorruptionError:
            continue
        if bad == value:
            assert repr(got) == repr(want)
        else:
            assert resealed, f"a damaged {key.decode()} value was decoded"
