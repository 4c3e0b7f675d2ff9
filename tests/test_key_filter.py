"""Key filters (storage/key_filter.py and their use in storage/native/point_probe.c): no key
written is ever filtered out, absent keys mostly are, string hashing agrees with a plain
per-key fold, probes skip the blocks their filters rule out, and a damaged filter never hides a
row (its page fails its sum and the block is searched)."""

from __future__ import annotations

import os
from collections import Counter
from typing import Callable

import numpy as np
import pyarrow as pa
import pytest
import xxhash
from hypothesis import given, settings, strategies as st

from ebb.query.reader import ArchiveReader
from ebb.storage import key_filter, point_probe
from ebb.storage.archive import Archive
from ebb.storage.disk_format import FILTER_TEXT_MULTIPLIER
from ebb.storage.errors import CorruptionError
from ebb.storage.verify import verify

from support import Oracle, config, rows_multiset


def _fold(key: str) -> int:
    """The string hash's fold, one byte at a time (what the native code does)."""
    p = 0
    for b in key.encode():
        p = (p * FILTER_TEXT_MULTIPLIER + b + 1) & ((1 << 64) - 1)
    return p


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(max_size=40), min_size=1, max_size=60))
def test_string_hashes_fold_every_byte(keys):
    """The vectorised hash of a string array (also sliced) is the per-byte fold, then mixed."""
    arr = pa.array(["pad"] + keys, pa.string()).slice(1)
    want = key_filter._mix(np.array([_fold(k) for k in keys], np.uint64))
    assert np.array_equal(key_filter.key_hashes(arr), want)
    assert np.array_equal(key_filter.key_hashes(pa.chunked_array([arr])), want)


@pytest.mark.parametrize("text", [False, True])
def test_no_false_negatives_and_few_false_positives(text):
    rng = np.random.default_rng(1)
    for rows in (1, 7, 300, 5000):
        ints = rng.integers(-2**63, 2**63 - 1, rows, dtype=np.int64)
        keys = pa.array([f"k{v}" for v in ints]) if text else pa.array(ints)
        f = key_filter.block_filter(key_filter.key_hashes(keys), 0)
        assert len(f) == key_filter.units(rows) * key_filter.UNIT_BYTES
        assert key_filter.may_hold(f, key_filter.key_hashes(keys)).all()
        absent = rng.integers(-2**63, 2**63 - 1, 20000, dtype=np.int64)
        probes = pa.array([f"x{v}" for v in absent]) if text else pa.array(absent)
        rate = key_filter.may_hold(f, key_filter.key_hashes(probes)).mean()
        assert rate < (0.05 if rows >= 300 else 0.2), (rows, rate)


def _filter_key_by_key(hashes: np.ndarray, first_unit: int, bits: int) -> bytes:
    """One block's filter built a key at a time, as docs/format.md states it (the oracle)."""
    count = int(key_filter.units(len(hashes), bits))
    units = [bytearray(key_filter.UNIT_BYTES) for _ in range(count)]
    for h in hashes.tolist():
        second = int(key_filter._mix(np.array([h], np.uint64))[0])
        unit = ((h >> 32) * count) >> 32
        for i in range(key_filter.PROBES):
            bit = (((second >> (9 * i)) & 511) * key_filter.UNIT_BITS) >> 9
            units[unit][bit >> 3] |= 1 << (bit & 7)
    for u, unit in enumerate(units):
        body = bytes(unit[:key_filter.UNIT_BITS // 8])
        unit[key_filter.UNIT_BITS // 8:] = (xxhash.xxh3_64_intdigest(body, first_unit + u) & 0xFFFFFFFF).to_bytes(4, "little")
    return b"".join(units)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 400), min_size=1, max_size=5), st.integers(0, 10**6), st.sampled_from([10, 16]),
       st.integers(0, 2**32))
def test_filters_of_several_blocks_are_each_blocks_filter_built_key_by_key(block_rows, first_unit, bits, seed):
    """``filters`` (a writer's blocks at once, vectorised) is each block's filter built a key at a
    time, one after another, each block's units numbered on from the last's; its sums hold."""
    hashes = key_filter._mix(np.random.default_rng(seed).integers(0, 2**63, sum(block_rows)).astype(np.uint64))
    want, at, unit = [], 0, first_unit
    for rows in block_rows:
        want.append(_filter_key_by_key(hashes[at:at + rows], unit, bits))
        at, unit = at + rows, unit + int(key_filter.units(rows, bits))
    got = key_filter.filters(hashes, block_rows, first_unit, bits)
    assert got == b"".join(want)
    assert key_filter.sums_hold(got, first_unit).all()


needs_native = pytest.mark.skipif(not point_probe.NATIVE, reason="the native point probe is not built")


def _archive(tmp_path, text: bool, mode: str = "rebuild"):
    rng = np.random.default_rng(8)
    arc = Archive.create(str(tmp_path / "a"), config(mode=mode, G=2, E=2, block_bytes=8 << 10))
    oracle = Oracle()
    for T in (16, 18, 20):
        n = 4000
        ts = rng.integers(T - 12, T + 1, n)
        k = rng.integers(0, 100_000, n)
        rows = [{"key": f"sensor-{v:07d}" if text else int(v), "ts": int(t), "exp": int(t + rng.integers(1, 15)),
                 "v": int(i)} for i, (v, t) in enumerate(zip(k, ts))]
        oracle.load(rows, T)
        arc.load(pa.Table.from_pylist(rows), T)
    return arc, oracle, rng


@needs_native
@pytest.mark.parametrize("text", [False, True])
@pytest.mark.parametrize("mode", ["rebuild", "norebuild"])
def test_probes_skip_blocks_their_filters_rule_out(tmp_path, text, mode):
    """Present keys: the oracle's rows. Absent keys: almost no block searched (the key ranges
    alone would send each probe to a block of every run and section)."""
    arc, oracle, rng = _archive(tmp_path, text, mode)
    reader = ArchiveReader(arc)
    key = (lambda v: f"sensor-{v:07d}") if text else int
    for v in rng.integers(0, 100_000, 200):
        assert rows_multiset(reader.probe(key(v), 20)) == oracle.probe(key(v), 20)
    absent = [key(v) for v in rng.integers(100_000, 200_000, 300)] if not text else \
        [f"sensor-{v:07d}x" for v in rng.integers(0, 100_000, 300)]
    with arc.snapshot() as snap:
        ranges = sum(len(snap.descriptor(r.name).section_bounds) - 1 for sub in snap.state.subindices for r in sub.runs)
        searched = [sum(b for _, b, _ in snap.probe(k, 20)[1]) for k in absent]
    assert sum(searched) <= 0.1 * len(absent) * ranges, (sum(searched), len(absent), ranges)
    arc.close()


@needs_native
@pytest.mark.parametrize("text", [False, True])
@pytest.mark.parametrize("damage", ["zeroed pages", "one bit cleared in every unit"])
def test_a_damaged_filter_never_hides_a_row(tmp_path, text, damage):
    """A filter damaged so that, were it trusted, it would rule keys out (every filter page
    zeroed in turn; or one set bit cleared in every unit, sums left as they were): single and
    batch probes of every key still return the oracle's rows, as each unit read fails its sum,
    and ``ebb verify`` reports the damage; restored, it finds nothing."""
    arc, oracle, rng = _archive(tmp_path, text)
    with arc.snapshot() as snap:
        run = [r for sub in snap.state.subindices for r in sub.runs][0]
        desc = snap.descriptor(run.name)
    arc.close()
    start, end = int(desc.filter_at[0]), int(desc.filter_at[-1])
    assert end > start
    path = os.path.join(arc.data_dir, run.name)
    pristine = open(path, "rb").read()
    keys = sorted({r["key"] for r in oracle.valid(20)})[::7]
    if damage == "zeroed pages":
        variants = []
        for page in range(start, end, 4096):
            bad = bytearray(pristine)
            bad[page:min(page + 4096, end)] = bytes(min(4096, end - page))
            variants.append(bad)
    else:
        bad = bytearray(pristine)
        for unit in range(start, end, key_filter.UNIT_BYTES):
            bits = np.unpackbits(np.frombuffer(bad[unit:unit + 60], np.uint8), bitorder="little")
            if bits.any():
                i = int(np.flatnonzero(bits)[0])
                bad[unit + i // 8] &= ~(1 << (i % 8)) & 0xFF
        variants = [bad]
    for bad in variants:
        with open(path, "wb") as f:
            f.write(bad)
        with Archive(str(tmp_path / "a")) as arc:
            problems, _ = verify(arc)
            assert any("its key filter differs from its keys'" in p for p in problems), problems
            reader = ArchiveReader(arc)
            many = reader.probe_many(keys, 20)
            assert rows_multiset(many) == sum((oracle.probe(k, 20) for k in keys), Counter())
            for k in keys[::10]:
                assert rows_multiset(reader.probe(k, 20)) == oracle.probe(k, 20)
    with open(path, "wb") as f:
        f.write(pristine)
    with Archive(str(tmp_path / "a")) as arc:
        assert verify(arc)[0] == []


def _run_heads(arc) -> list[dict]:
    """The JSON heads of the current runs' stored descriptors."""
    import json
    import struct

    from ebb.storage.checksum import unseal
    from ebb.storage.run_descriptor import RunDescriptor, _TAG
    heads = []
    with arc.snapshot() as snap:
        for sub in snap.state.subindices:
            for run in sub.runs:
                key = RunDescriptor.key(run.name)
                body = unseal(_TAG, key, snap.txn.get(key), "test")
                (n,) = struct.unpack_from("<I", body)
                heads.append(json.loads(bytes(body[4:4 + n])))
    return heads


@needs_native
@pytest.mark.parametrize("text", [False, True])
def test_runs_with_the_earlier_ten_bit_filters_still_read(tmp_path, monkeypatch, text):
    """Runs written before descriptors named their filters' bits a record (10 then; 16 now)
    carry no "filter_bits": probes of every key still return the oracle's rows, and verify
    finds nothing, once the writer is back to today's bits."""
    from ebb.storage import run_writer
    monkeypatch.setattr(run_writer, "FILTER_BITS_PER_KEY", 10)
    arc, oracle, _ = _archive(tmp_path, text)
    heads = _run_heads(arc)
    assert heads and all("filter" in h and "filter_bits" not in h for h in heads)
    arc.close()
    monkeypatch.undo()
    _old_runs_read_and_an_update_adds_new_ones(str(tmp_path / "a"), oracle,
                                               lambda heads: {h.get("filter_bits", 10) for h in heads} >= {16})


def _old_runs_read_and_an_update_adds_new_ones(path: str, oracle: Oracle, new_heads: Callable[[list[dict]], bool]) -> None:
    """The archive at ``path``, written as an earlier ebb wrote it: verify finds nothing, single
    and batch probes return the oracle's rows, and after an update ``new_heads`` holds of the runs'
    heads (its new runs written as today's ebb writes them, beside the old ones) and probes
    still return the oracle's rows."""
    with Archive(path) as arc:
        assert verify(arc)[0] == []
        reader = ArchiveReader(arc)
        keys = sorted({r["key"] for r in oracle.valid(20)})[::5]
        assert rows_multiset(reader.probe_many(keys, 20)) == sum((oracle.probe(k, 20) for k in keys), Counter())
        for k in keys[::10]:
            assert rows_multiset(reader.probe(k, 20)) == oracle.probe(k, 20)
        new = [{"key": keys[0], "ts": 21, "exp": 30, "v": -1}]
        arc.load(pa.Table.from_pylist(new), 22)
        oracle.load(new, 22)
        assert new_heads(_run_heads(arc))
        for k in keys[::10]:
            assert rows_multiset(reader.probe(k, 22)) == oracle.probe(k, 22)


@needs_native
def test_filters_placed_by_the_wrong_bits_are_a_corruption_error_not_hidden_rows(tmp_path, monkeypatch):
    """A run whose descriptor names fewer bits a record than its filters were written with (a
    writer's bug) would have each block read another block's filter, which passes its sum: the
    filters then do not end where the file does, and the probe fails clearly."""
    from ebb.storage import run_writer

    class SixteenBits:  # the writer's filters at 16 bits, its descriptor saying 10
        def __getattr__(self, name):
            return getattr(key_filter, name)

        @staticmethod
        def filters(hashes, block_rows, first_unit, bits):
            return key_filter.filters(hashes, block_rows, first_unit, 16)

        @staticmethod
        def units(rows, bits):
            return key_filter.units(rows, 16)

    monkeypatch.setattr(run_writer, "FILTER_BITS_PER_KEY", 10)
    monkeypatch.setattr(run_writer, "key_filter", SixteenBits())
    arc, oracle, _ = _archive(tmp_path, False)
    arc.close()
    monkeypatch.undo()
    with Archive(str(tmp_path / "a")) as arc:
        key = sorted({r["key"] for r in oracle.valid(20)})[0]
        with pytest.raises(CorruptionError, match="key filters end at byte"):
            ArchiveReader(arc).probe(key, 20)


def _run_filter_of(arc, run_name: str) -> tuple[str, int, int, int]:
    """(file path, where the run filter starts, where it ends, its first unit's index) of a run."""
    with arc.snapshot() as snap:
        desc = snap.descriptor(run_name)
    start = int(desc.filter_at[-1])
    return os.path.join(arc.data_dir, run_name), start, desc.filter_end, (start - desc.filter_offset) // key_filter.UNIT_BYTES


def _runs(arc) -> list[str]:
    with arc.snapshot() as snap:
        return [r.name for sub in snap.state.subindices for r in sub.runs]


@pytest.mark.parametrize("text", [False, True])
def test_norebuild_runs_end_with_a_run_filter_over_all_their_keys(tmp_path, text):
    """Each NoRebuild run's head names its run filter's units (10 bits a record over all its
    records), the file ends with it, every valid key read from the run passes it, and few absent
    keys do; Rebuild runs have none."""
    from ebb.storage.disk_format import RUN_FILTER_BITS_PER_KEY
    from ebb.storage.read_plan import Scan
    for mode in ("norebuild", "rebuild"):
        arc, _, rng = _archive(tmp_path / mode, text, mode)
        heads = {h["name"]: h for h in _run_heads(arc)}
        with arc.snapshot() as snap:
            tasks = snap.plan(Scan(), 20)
            for name in _runs(arc):
                if mode == "rebuild":
                    assert "run_filter" not in heads[name]
                    continue
                desc = snap.descriptor(name)
                rows = int(desc.blocks["rows"].sum())
                assert heads[name]["run_filter"] == key_filter.units(rows, RUN_FILTER_BITS_PER_KEY)
                path, start, end, _ = _run_filter_of(arc, name)
                assert os.path.getsize(path) == end == start + heads[name]["run_filter"] * key_filter.UNIT_BYTES
                run_filter = open(path, "rb").read()[start:end]
                keys = [b.column("key") for t in tasks if t.file == name for b in snap.read(t) if b.num_rows]
                assert keys
                assert key_filter.may_hold(run_filter, key_filter.key_hashes(pa.concat_arrays(keys))).all()
                absent = pa.array([f"absent-{v}" for v in range(2000)]) if text else pa.array(rng.integers(10**6, 10**9, 2000))
                assert key_filter.may_hold(run_filter, key_filter.key_hashes(absent)).mean() < 0.05
        arc.close()


def _damage_run_filters(paths: dict[str, tuple[int, int, int]], pristine: dict[str, bytes], forged: bool) -> None:
    """Clears every set bit of each run's run filter (so that, trusted, it would rule out every
    key); ``forged``: and writes each unit's sum to match (a writer's bug, which only ``ebb
    verify`` can tell), else leaves the sums as they were (damage on disk, which each unit's sum
    catches)."""
    for path, (start, end, first_unit) in paths.items():
        bad = bytearray(pristine[path])
        for u, unit in enumerate(range(start, end, key_filter.UNIT_BYTES)):
            bits = np.unpackbits(np.frombuffer(bad[unit:unit + 60], np.uint8), bitorder="little")
            for i in np.flatnonzero(bits):  # every set bit: the unit then rules out every key
                bad[unit + int(i) // 8] &= ~(1 << (int(i) % 8)) & 0xFF
            if forged:
                bad[unit + 60:unit + 64] = (xxhash.xxh3_64_intdigest(bytes(bad[unit:unit + 60]), first_unit + u)
                                            & 0xFFFFFFFF).to_bytes(4, "little")
        with open(path, "wb") as f:
            f.write(bad)


@needs_native
@pytest.mark.parametrize("text", [False, True])
def test_a_damaged_run_filter_never_hides_a_row(tmp_path, text):
    """Every run filter of a NoRebuild archive emptied (every bit cleared), its sums left: single
    and batch probes of every key still return the oracle's rows (each unit fails its sum, so the
    run's sections are searched) and ``ebb verify`` reports the failing units. The same with the
    sums rewritten to match (a writer's bug): the probes now skip the runs, so they lose rows,
    which shows they consult the run filter; ``ebb verify`` reports the keys it rules out.
    Restored, verify finds nothing."""
    arc, oracle, _ = _archive(tmp_path, text, "norebuild")
    names = _runs(arc)
    paths = {}
    for name in names:
        path, start, end, first_unit = _run_filter_of(arc, name)
        paths[path] = (start, end, first_unit)
    arc.close()
    pristine = {p: open(p, "rb").read() for p in paths}
    keys = sorted({r["key"] for r in oracle.valid(20)})[::7]
    want = sum((oracle.probe(k, 20) for k in keys), Counter())
    for forged in (False, True):
        _damage_run_filters(paths, pristine, forged)
        with Archive(str(tmp_path / "a")) as arc:
            problems, _ = verify(arc)
            reader = ArchiveReader(arc)
            many = rows_multiset(reader.probe_many(keys, 20))
            single = sum((rows_multiset(reader.probe(k, 20)) for k in keys[::10]), Counter())
        if not forged:
            assert sum("units of its run filter fail their sums" in p for p in problems) == len(names), problems
            assert many == want
            assert single == sum((oracle.probe(k, 20) for k in keys[::10]), Counter())
        else:
            assert sum("its run filter rules out" in p for p in problems) == len(names), problems
            assert not many and not single
    for path, data in pristine.items():
        with open(path, "wb") as f:
            f.write(data)
    with Archive(str(tmp_path / "a")) as arc:
        assert verify(arc)[0] == []


@needs_native
def test_norebuild_runs_written_without_run_filters_still_read(tmp_path, monkeypatch):
    """NoRebuild runs written before run filters (no "run_filter" in their heads) are searched
    section by section as before: probes return the oracle's rows, verify finds nothing, and the
    next update's run gets one beside them."""
    from ebb.storage import maintenance
    plain = maintenance.MaintenanceContext.writer
    monkeypatch.setattr(maintenance.MaintenanceContext, "writer", lambda self, i, run_filter=False: plain(self, i))
    arc, oracle, _ = _archive(tmp_path, False, "norebuild")
    assert not any("run_filter" in h for h in _run_heads(arc))
    arc.close()
    monkeypatch.undo()
    _old_runs_read_and_an_update_adds_new_ones(str(tmp_path / "a"), oracle,
                                               lambda heads: any("run_filter" in h for h in heads))
