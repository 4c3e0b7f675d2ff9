"""The native point probe (storage/point_probe.py, storage/native/point_probe.c) against the
planned read it replaces, for int64 and string keys: the same rows in the same order, no more
blocks searched (key filters rule some out), for every layout and mode, schemas with every stored type and nulls, tiny
blocks (a key spread over several), keys inside, between and outside the stored ones (for
strings: empty, long, non-ASCII, sharing prefixes), and as_of times after the last update; the
batch probe (``probe_many``) against single probes and the oracle. Then what it does with
damage: a flipped byte in any page it uses, a truncated file under an open archive, and a
version reclaimed under a remote reader."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
from collections import Counter
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pyarrow.compute
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ebb.query.reader import ArchiveReader, ReadStats
from ebb.storage import disk_format, files, point_probe
from ebb.storage.archive import Archive
from ebb.storage.errors import CorruptionError, ReadError
from ebb.storage.read_plan import Probe
from ebb.storage.snapshot import ordered

from support import SCHEMA, Oracle, config, rows_multiset

# these tests are about the native point probe: without it (installed with no C compiler) every
# probe takes the planned read, which the other tests check against the oracle
pytestmark = pytest.mark.skipif(not point_probe.NATIVE, reason="the native point probe is not built")

RICH = pa.schema([
    ("key", pa.int64()), ("ts", pa.int64()), ("exp", pa.int64()),
    ("f", pa.float64()), ("b", pa.bool_()), ("s", pa.string()), ("bin", pa.binary()),
    ("i", pa.int32()), ("dec", pa.decimal128(12, 3)), ("fx", pa.binary(3)),
])


# string keys: empty, long, non-ASCII (2-, 3- and 4-byte UTF-8), a NUL, and many sharing prefixes
TEXT_KEYS = sorted({"", "a", "ab", "abc", "b", "é", "日本", "日本語", "\U0001F600", "x" * 300, "x" * 301, "a\x00b",
                    *(f"sensor-{i}" for i in range(0, 2000, 7)), *(f"sensor-{i:05d}" for i in range(0, 2000, 13))})
TEXT_RICH = RICH.set(0, pa.field("key", pa.string()))


def text_key(i: int) -> str:
    """Key number ``i`` (any int) mapped onto TEXT_KEYS, keeping the int keys' spread."""
    return TEXT_KEYS[i % len(TEXT_KEYS)]


def rich_rows(rng: np.random.Generator, n: int, ts_lo: int, ts_hi: int, max_life: int, keys: int,
              text: bool = False) -> list[dict]:
    ts = rng.integers(ts_lo, ts_hi + 1, n)
    life = rng.integers(1, max_life + 1, n)
    key = rng.integers(-keys, keys, n)
    null = rng.random((n, 7)) < 0.15
    out = []
    for r in range(n):
        v = [float(rng.random()), bool(rng.random() < 0.5), "s" * int(rng.integers(0, 40)), bytes(rng.integers(0, 256, 3, np.uint8)),
             int(rng.integers(-2**31, 2**31)), Decimal(int(rng.integers(-10**6, 10**6))) / 1000, bytes(rng.integers(0, 256, 3, np.uint8))]
        row = {"key": text_key(int(key[r])) if text else int(key[r]), "ts": int(ts[r]), "exp": int(ts[r] + life[r])}
        row.update({name: None if null[r, c] else v[c] for c, name in enumerate(["f", "b", "s", "bin", "i", "dec", "fx"])})
        out.append(row)
    return out


def planned(reader: ArchiveReader, key, as_of: int) -> pa.Table:
    """The same probe through read planning and the task reader, its tasks counted in
    ``reader.io``."""
    with reader.snapshot() as snap:
        tasks = snap.plan(Probe((key,)), as_of)
        for task in tasks:
            reader.io.count(task)
        cfg = snap.config
        return ordered(list(snap.read_all(tasks)), snap.schema, cfg.key_column, cfg.exp_column, cfg.ts_column)


@st.composite
def archives(draw):
    layout = draw(st.sampled_from([
        dict(layout="doubly", partitioning="round-robin", G=2, E=2),
        dict(layout="doubly", partitioning="chronological", G=2, E=3),
        dict(layout="doubly", partitioning="random", G=3, E=2, seed=7),
        dict(layout="wave", split="insertion", n_wave=3),
        dict(layout="wave", split="expiration", n_wave=2),
    ]))
    return dict(layout=layout, mode=draw(st.sampled_from(["rebuild", "norebuild"])),
                block_bytes=draw(st.sampled_from([256, 700, 4096, 1 << 20])), keys=draw(st.sampled_from([3, 40, 2000])),
                updates=draw(st.integers(1, 7)), seed=draw(st.integers(0, 2**32 - 1)), text=draw(st.booleans()))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(archives())
def test_native_probe_answers_as_the_planned_read_and_the_oracle(sc):
    rng = np.random.default_rng(sc["seed"])
    with tempfile.TemporaryDirectory() as d:
        cfg = config(mode=sc["mode"], block_bytes=sc["block_bytes"], tau=16, delta=2, max_lifetime=12, **sc["layout"])
        with Archive.create(os.path.join(d, "a"), cfg) as arc:
            reader, oracle = ArchiveReader(arc), Oracle()
            text = sc["text"]
            for T in range(16, 16 + 2 * sc["updates"], 2):
                rows = rich_rows(rng, int(rng.integers(0, 300)), T - 12, T, 12, sc["keys"], text)
                oracle.load(rows, T)
                arc.load(pa.Table.from_pylist(rows, TEXT_RICH if text else RICH), T)
                keys = [int(k) for k in rng.integers(-sc["keys"] - 2, sc["keys"] + 2, 6)] + [-(2**63), 2**63 - 1]
                if text:  # stored keys, and ones between, before and after them
                    keys = [text_key(k) for k in keys] + ["", "a\x00", "sensor-", "sensor-00000", "日", "\uffff", "x" * 302]
                many = reader.probe_many(keys, T)
                assert many.equals(pa.concat_tables([planned(reader, k, T) for k in sorted(set(keys))]))
                for k in keys:
                    for as_of in (T, T + int(rng.integers(1, 14))):
                        with arc.snapshot() as snap:
                            got = snap.native_probe(k, as_of)
                        assert got is not None
                        table, searched = got
                        reader.io = ReadStats()
                        want = planned(reader, k, as_of)
                        assert table.equals(want), (k, as_of)  # rows, order (exp, ts) and nulls
                        assert rows_multiset(table) == oracle.probe(k, as_of)
                        counted = {}
                        for i, blocks, nbytes in searched:
                            a, b = counted.get(i, (0, 0))
                            counted[i] = (a + blocks, b + nbytes)
                        # the planned read searches every block whose key range holds the key; the
                        # native probe skips those whose key filter rules it out
                        assert {i + 1 for i in counted} <= reader.io.subindices_read
                        assert sum(a for a, _ in counted.values()) <= reader.io.blocks_read
                        assert sum(b for _, b in counted.values()) <= reader.io.bytes_read


def test_probes_of_other_keys_take_the_planned_path(tmp_path):
    """Keys not of the key column's type are not probed natively (a numpy or Arrow scalar is its value,
    and a null key is refused); a string for an integer key
    column, or anything else for a string one, is a ReadError (after the reader kept the
    newest version's snapshot, too), not Python's TypeError from the plan's comparisons."""
    with Archive.create(str(tmp_path / "a"), config()) as arc:
        arc.load(pa.table({"key": ["a", "b"], "ts": [10, 12], "exp": [20, 20]}), 16)
        with arc.snapshot() as snap:
            assert snap.native_probe(1) is None and snap.native_probe(b"a") is None
            assert snap.native_probe("a")[0].num_rows == 1
        reader = ArchiveReader(arc)
        assert reader.probe("a").num_rows == 1
        assert reader.probe(np.str_("a")).equals(reader.probe("a"))  # a key taken from an array
        assert reader.probe(pa.array(["b", "a"])[1]).equals(reader.probe("a"))
        for wrong in (1, b"a", np.int64(1), pa.scalar(1)):
            with pytest.raises(ReadError, match="not of the key column's type, string"):
                reader.probe(wrong)
    with Archive.create(str(tmp_path / "b"), config()) as arc:
        arc.load(pa.table({"key": [1, 2], "ts": [10, 12], "exp": [20, 20]}), 16)
        with arc.snapshot() as snap:
            assert snap.native_probe(2**63) is None and snap.native_probe(True) is None and snap.native_probe(1) is not None
        reader = ArchiveReader(arc)
        assert reader.probe(2**63).num_rows == 0
        assert reader.probe(1).num_rows == 1
        assert reader.probe(pa.array([2, 1])[1]).equals(reader.probe(1))
        for lo, hi in ((np.int64(1), pa.scalar(2)), (pa.array([1])[0], None)):  # range bounds, too
            assert reader.probe_range(lo, hi).equals(reader.probe_range(1, 2))
        for null in (None, pa.scalar(None, pa.int64())):  # not an open bound: one key, and none given
            with pytest.raises(ReadError, match="cannot be null"):
                reader.probe(null)
        for wrong in ("a", b"a"):
            with pytest.raises(ReadError, match="not of the key column's type, int64"):
                reader.probe(wrong)


def _one_run(tmp_path, keys=300):
    """An archive with one sub-index whose run has several blocks of several pages."""
    rng = np.random.default_rng(3)
    rows = rich_rows(rng, 6000, 1, 16, 16, keys)
    arc = Archive.create(str(tmp_path / "a"), config(G=1, E=1, block_bytes=48 << 10))
    arc.load(pa.Table.from_pylist(rows, RICH), 16)
    oracle = Oracle()
    oracle.load(rows, 16)
    with arc.snapshot() as snap:
        run = snap.state.subindices[0].runs[0]
        desc = snap.descriptor(run.name)
        sums = snap.page_sums(run.name)
    assert desc.blocks.size > 3 and desc.page_start[2] - desc.page_start[1] > 4
    return arc, oracle, os.path.join(arc.data_dir, run.name), desc, sums


@pytest.mark.parametrize("keys", [300, 2])
def test_a_flipped_byte_in_any_page_is_the_right_rows_or_a_corruption_error(tmp_path, keys):
    """Bytes flipped in each page of a block in turn: a probe of every key of that block returns
    the oracle's rows or raises CorruptionError naming the sub-index and block; a flipped metadata
    page always raises. With 300 keys a probe checks the pages it reads; with 4, most of a block
    is one key's, so the probe checks the block whole. The archive is reopened for each flip, as
    a new reader would be."""
    arc, oracle, path, desc, _ = _one_run(tmp_path, keys)
    arc.close()
    pristine = open(path, "rb").read()
    b = 1
    e = desc.entry(b)
    probes = sorted({dict(r)["key"] for r in oracle.probe_range(desc.first_keys[b], desc.last_keys[b], 16)})
    failed = 0
    for page in range(int(desc.page_start[b + 1] - desc.page_start[b])):
        bad = bytearray(pristine)
        for at in (77, 1500, 2900, 4000):
            bad[e.offset + min(page * 4096 + at, e.length - 1)] ^= 0x08
        with open(path, "wb") as f:
            f.write(bad)
        with Archive(str(tmp_path / "a")) as arc:
            for k in probes:
                try:
                    got = ArchiveReader(arc).probe(k, 16)
                except CorruptionError as err:
                    assert "sub-index I1" in str(err) and f"block at byte {e.offset}" in str(err)
                    failed += 1
                    continue
                assert page != 0, "a damaged metadata page was read"
                assert rows_multiset(got) == oracle.probe(k, 16), f"page {page}: key {k}"
    assert failed  # the flips in pages the probes use were caught
    with open(path, "wb") as f:
        f.write(pristine)


# run in a fresh process (argv: archive, JSON keys, as_of): each key's probe, its rows in order, or
# 'damaged: ' and the CorruptionError
_PROBE_EVERY_KEY = ("import json, sys\n"
                    "from ebb.query.reader import ArchiveReader\n"
                    "from ebb.storage.errors import CorruptionError\n"
                    "out = {}\n"
                    "with ArchiveReader(sys.argv[1]) as r:\n"
                    "    for k in json.loads(sys.argv[2]):\n"
                    "        try:\n"
                    "            out[k] = list(map(repr, r.probe(k, int(sys.argv[3])).to_pylist()))\n"
                    "        except CorruptionError as err:\n"
                    "            out[k] = 'damaged: ' + str(err)\n"
                    "print(json.dumps(out))\n")


def test_page_sums_with_and_without_avx2_give_the_same_answers_and_catch_the_same_damage(tmp_path):
    """The module sums pages with AVX2 where the CPU has it, else as built (EBB_NO_AVX2=1 forces
    that): in fresh processes both probe every key of an archive to the oracle's rows, and with a
    byte flipped in a page of a block both fail the same probes."""
    arc, oracle, path, desc, _ = _one_run(tmp_path, 300)
    arc.close()
    keys = sorted({dict(r)["key"] for r in oracle.scan(16)})

    def probe_all(**env) -> dict:
        done = subprocess.run([sys.executable, "-c", _PROBE_EVERY_KEY, str(tmp_path / "a"), json.dumps(keys), "16"],
                              capture_output=True, text=True, env=dict(os.environ, **env), check=True)
        return json.loads(done.stdout)

    want = {}
    with Archive(str(tmp_path / "a")) as arc:
        for k in keys:
            got = ArchiveReader(arc).probe(k, 16)
            assert rows_multiset(got) == oracle.probe(k, 16)
            want[str(k)] = list(map(repr, got.to_pylist()))
    assert probe_all() == probe_all(EBB_NO_AVX2="1") == want
    bad = bytearray(open(path, "rb").read())
    e = desc.entry(1)
    bad[e.offset + e.length // 2] ^= 0x08
    with open(path, "wb") as f:
        f.write(bad)
    damaged = probe_all()
    assert any(str(v).startswith("damaged") for v in damaged.values()) and damaged == probe_all(EBB_NO_AVX2="1")


def test_a_run_file_truncated_under_an_open_archive_is_a_corruption_error(tmp_path):
    """Touching a mapped page past the end of a file would kill the process; the probe checks
    the file's size first."""
    arc, oracle, path, desc, _ = _one_run(tmp_path)
    reader = ArchiveReader(arc)
    k = desc.last_keys[desc.blocks.size - 1]
    assert rows_multiset(reader.probe(k, 16)) == oracle.probe(k, 16)
    os.truncate(path, int(desc.blocks["offset"][-1]) + 10)
    with pytest.raises(CorruptionError, match="file ends before byte"):
        reader.probe(k, 16)
    arc.close()


def test_an_update_lets_go_of_the_runs_it_replaced(tmp_path):
    """Point probes keep each run of the current version mapped; once an update replaces a run
    (Rebuild rewrites it) and reclaims its file, no map keeps the deleted file's space."""
    rng = np.random.default_rng(4)
    with Archive.create(str(tmp_path / "a"), config(G=1, E=1)) as arc:
        reader = ArchiveReader(arc)
        for T in (16, 18, 20):
            arc.load(pa.Table.from_pylist(rich_rows(rng, 200, T - 8, T, 12, 50), RICH), T)
            reader.probe(3)
        assert files.RELEASER.idle()  # replaced runs are let go of in the background
        with open("/proc/self/maps") as f:
            stale = [line for line in f if arc.data_dir in line and "(deleted)" in line]
        assert stale == []


def test_prepare_probes_reads_every_runs_directory_within_the_budget(tmp_path):
    """A probe-serving process prepares the current version once after opening: every run's
    arrays are then in memory and the first probe reads no metadata. Over the metadata budget
    it prepares nothing, and probes still answer right."""
    rng = np.random.default_rng(6)
    oracle = Oracle()
    with Archive.create(str(tmp_path / "a"), config(mode="norebuild")) as arc:
        for T in (16, 18, 20, 22):
            rows = rich_rows(rng, 300, T - 10, T, 12, 40)
            oracle.load(rows, T)
            arc.load(pa.Table.from_pylist(rows, RICH), T)
    for limit, prepared in ((4 << 20, True), (1000, False)):
        with Archive(str(tmp_path / "a"), readonly=True) as arc:
            arc.metadata.limit = limit
            reader = ArchiveReader(arc)
            reader.prepare_probes()
            names = {run.name for sub in arc.state().subindices for run in sub.runs}
            assert ({name for kind, name in arc.metadata._entries if kind == "arrays"} == names) == prepared
            assert arc.reads.holds_point_runs == prepared
            for k in range(-41, 41, 5):
                assert rows_multiset(reader.probe(k)) == oracle.probe(k, 22)


def test_more_runs_than_the_open_files_allow_take_the_planned_path(tmp_path):
    """The native probe holds every run open at once; with more runs than half the open-files
    limit it steps aside, and the planned read (one run at a time) answers."""
    rng = np.random.default_rng(8)
    oracle = Oracle()
    with Archive.create(str(tmp_path / "a"), config(mode="norebuild", G=1, E=1)) as arc:
        for T in (16, 18, 20, 22, 24):
            rows = rich_rows(rng, 100, T - 10, T, 12, 20)
            oracle.load(rows, T)
            arc.load(pa.Table.from_pylist(rows, RICH), T)
        runs = len(arc.state().subindices[0].runs)
    assert runs > 2
    for limit, native in ((2 * runs, True), (2 * runs - 2, False)):
        with Archive(str(tmp_path / "a"), readonly=True) as arc:
            arc.open_files.limit = limit
            reader = ArchiveReader(arc)
            reader.prepare_probes()
            with arc.snapshot() as snap:
                assert (snap.native_probe(3) is not None) == native
            for k in range(-21, 21, 3):
                assert rows_multiset(reader.probe(k)) == oracle.probe(k, 24)


def _read_bytes() -> int:
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("read_bytes:")).split()[1])


@pytest.mark.parametrize("text", [False, True])
def test_cold_probes_of_many_blocks_read_ahead_and_answer_as_the_oracle(tmp_path, text):
    """On a cold cache the native probe asks for each read round's pages of every candidate
    block at once (its metadata and key, the found rows, then their strings where their lengths
    made the first guess miss). Few keys and many NoRebuild runs give each probe dozens of
    candidate blocks; strings of 0-3,000 bytes make that guess miss. Each probe runs in a new
    reader after the run files' pages are dropped from the cache, and answers as the oracle."""
    rng = np.random.default_rng(11)
    oracle = Oracle()
    with Archive.create(str(tmp_path / "a"), config(mode="norebuild", block_bytes=16 << 10, max_lifetime=20)) as arc:
        for T in range(16, 40, 2):
            rows = rich_rows(rng, 400, T - 12, T, 20, 6, text)
            for r in rows:
                r["s"] = None if r["s"] is None else "s" * int(rng.integers(0, 3000))
            oracle.load(rows, T)
            arc.load(pa.Table.from_pylist(rows, TEXT_RICH if text else RICH), T)
        data_dir = arc.data_dir
    keys = [text_key(k) for k in range(-7, 7)] if text else list(range(-7, 7))
    read = 0
    for k in keys:
        with Archive(str(tmp_path / "a"), readonly=True) as arc:
            reader = ArchiveReader(arc)
            reader.prepare_probes()
            for name in os.listdir(data_dir):  # the runs' pages, clean since their commit
                fd = os.open(os.path.join(data_dir, name), os.O_RDONLY)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                os.close(fd)
            before = _read_bytes()
            with arc.snapshot() as snap:
                table, searched = snap.native_probe(k, 38)
            read += _read_bytes() - before
            assert rows_multiset(table) == oracle.probe(k, 38), k
            if oracle.probe(k, 38):
                assert sum(blocks for _, blocks, _ in searched) > 8
        assert files.RELEASER.idle()
    if read == 0:
        pytest.skip("this filesystem keeps the run files' pages: the probes ran on a warm cache")


@pytest.mark.parametrize("text", [False, True])
def test_a_probe_of_many_blocks_shared_by_threads_answers_and_fails_as_one_thread(tmp_path, text):
    """A probe with at least 32 candidate blocks shares their searches and page checks among
    threads, and copies the columns of an answer of 1,024 rows or more side by side
    (``EBB_PROBE_THREADS``, else the CPUs the process may use). In fresh processes with 1 and 3
    threads every key answers the same rows in the same order, the oracle's; with a byte flipped
    in every 200, so that threads meet damaged blocks at once, both fail the same probes with the
    same error (that of the first damaged block, as one thread meets it), in every one of 5 runs."""
    rng = np.random.default_rng(5)
    oracle = Oracle()
    with Archive.create(str(tmp_path / "a"), config(mode="norebuild", block_bytes=256, max_lifetime=20)) as arc:
        for T in range(16, 32, 2):
            rows = rich_rows(rng, 1800, T - 12, T, 20, 2, text)
            oracle.load(rows, T)
            arc.load(pa.Table.from_pylist(rows, TEXT_RICH if text else RICH), T)
        keys = [text_key(k) for k in range(-4, 4)] if text else list(range(-4, 4))
        with arc.snapshot() as snap:
            searched = [sum(blocks for _, blocks, _ in snap.native_probe(k, 30)[1]) for k in keys]
        data_dir = arc.data_dir
    assert max(searched) >= 64  # well past the threshold: every stored key's probe is shared
    assert max(sum(oracle.probe(k, 30).values()) for k in keys) >= 1024  # and its copy too

    def probe_all(threads: int) -> dict:
        done = subprocess.run([sys.executable, "-c", _PROBE_EVERY_KEY, str(tmp_path / "a"), json.dumps(keys), "30"],
                              capture_output=True, text=True, env=dict(os.environ, EBB_PROBE_THREADS=str(threads)),
                              check=True)
        return json.loads(done.stdout)

    alone, shared = probe_all(1), probe_all(3)
    assert alone == shared
    with Archive(str(tmp_path / "a"), readonly=True) as arc:
        for k in keys:
            got = ArchiveReader(arc).probe(k, 30)
            assert rows_multiset(got) == oracle.probe(k, 30), k
            assert list(map(repr, got.to_pylist())) == alone[str(k)]
    for name in sorted(os.listdir(data_dir)):  # a byte flipped in every 200 of every run file
        path = os.path.join(data_dir, name)
        bad = bytearray(open(path, "rb").read())
        for at in range(100, len(bad), 200):
            bad[at] ^= 0x20
        with open(path, "wb") as f:
            f.write(bad)
    alone = probe_all(1)
    assert sum(str(v).startswith("damaged") for v in alone.values()) >= 2
    for _ in range(5):
        assert probe_all(3) == alone


@pytest.mark.parametrize("text", [False, True])
def test_probe_many_is_every_single_probe_in_key_order(tmp_path, text):
    """10,000 keys (repeats, absent keys, keys outside the stored range) in one call: the rows of
    each key's single probe, in (key, exp, ts) order, each equal to the oracle's; each block
    counted once however many keys it held; an empty list gives no rows; keys of the wrong type
    are a ReadError."""
    rng = np.random.default_rng(5)
    arc = Archive.create(str(tmp_path / "a"), config(block_bytes=16 << 10))
    oracle = Oracle()
    for T in (16, 18, 20):
        rows = rich_rows(rng, 3000, T - 12, T, 14, 500, text)
        oracle.load(rows, T)
        arc.load(pa.Table.from_pylist(rows, TEXT_RICH if text else RICH), T)
    reader = ArchiveReader(arc)
    ints = rng.integers(-520, 520, 10_000)
    keys = [text_key(int(k)) for k in ints] if text else ints
    many = reader.probe_many(keys, 21)
    unique = sorted(set(keys.tolist() if not text else keys))
    assert many.equals(pa.concat_tables([reader.probe(k, 21) for k in unique]))
    for k in unique[::25]:
        assert rows_multiset(many.filter(pa.compute.equal(many["key"], k))) == oracle.probe(k, 21)
    reader.io = ReadStats()
    reader.probe_many(keys, 21)
    with arc.snapshot() as snap:
        blocks = sum(snap.descriptor(run.name).blocks.size for sub in snap.state.subindices for run in sub.runs)
    assert reader.io.blocks_read <= blocks
    assert reader.probe_many([], 21).num_rows == 0
    with pytest.raises(ReadError):
        reader.probe_many([1, 2] if text else ["a"], 21)
    arc.close()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, (1 << 64) - 1), st.integers(0, (1 << 32) - 1)), max_size=40))
def test_block_extent_is_numpys(entries):
    """``_point_probe.block_extent``, which a sealed descriptor's parse checks its parts against
    (run_descriptor._extent), gives numpy's end of the last block and page count, for any
    offsets and lengths the entries can hold (a damaged offset wraps the same way)."""
    blocks = np.zeros(len(entries), disk_format.BLOCK)
    if entries:
        blocks["offset"], blocks["length"] = zip(*entries)
    with np.errstate(over="ignore"):
        last = int(blocks["offset"][-1] + blocks["length"][-1]) if entries else 0
    pages = int(disk_format.page_count(blocks["length"].astype(np.int64)).sum())
    assert point_probe._point_probe.block_extent(blocks) == (last, pages)
    assert point_probe._point_probe.block_extent(blocks.tobytes()) == (last, pages)


def test_the_native_module_refuses_another_format():
    """The extension compares each format fact it was compiled with to disk_format's: the same
    facts pass; one changed (in a dict, or in disk_format before the first import, in a fresh
    process) makes the import fail naming it, so a stale build never reads at the wrong offsets."""
    facts = disk_format.native_constants()
    assert point_probe._point_probe.check_format(facts) == []
    for name in ("entry_bytes", "entry.rows", "page_bytes", "ipc_prefix_bytes", "filter_probes", "filter_text_multiplier"):
        with pytest.raises(ImportError, match=name):
            point_probe.check_native_format(point_probe._point_probe, dict(facts, **{name: facts[name] + 1}))
    with pytest.raises(ImportError, match="metadata_guess_bytes.*absent"):
        point_probe.check_native_format(point_probe._point_probe, {k: v for k, v in facts.items() if k != "metadata_guess_bytes"})
    changed = subprocess.run([sys.executable, "-c", "import ebb.storage.disk_format as f; f.FILTER_PROBES = 8; "
                              "import ebb.storage.point_probe"], capture_output=True, text=True)
    assert changed.returncode != 0 and "filter_probes: 7 here, 8 in Python" in changed.stderr, changed.stderr


@pytest.mark.parametrize("text", [False, True])
@pytest.mark.parametrize("mode", ["rebuild", "norebuild"])
def test_a_planned_probe_of_many_keys_runs_as_one_batch_task_a_run(tmp_path, text, mode):
    """A Probe of BATCH_PROBE_KEYS keys or more (a Spark source's pushed IN list) is planned as
    one task a run that the native batch probe executes where only the data files are (as a
    Spark executor does, ``read_unpinned``): the same rows as planning key by key and as the
    oracle, at the last update and at a later instant (some blocks expired)."""
    from ebb.storage.read_plan import Probe
    from ebb.storage.snapshot import read_unpinned
    from ebb.storage.tuning import BATCH_PROBE_KEYS

    rng = np.random.default_rng(12)
    arc = Archive.create(str(tmp_path / "a"), config(mode=mode, block_bytes=8 << 10))
    oracle = Oracle()
    for T in (16, 18, 20, 22):
        rows = rich_rows(rng, 1500, T - 12, T, 14, 400, text)
        oracle.load(rows, T)
        arc.load(pa.Table.from_pylist(rows, TEXT_RICH if text else RICH), T)
    keys = sorted({text_key(int(k)) if text else int(k) for k in rng.integers(-420, 420, 3 * BATCH_PROBE_KEYS)})
    assert len(keys) >= BATCH_PROBE_KEYS
    with arc.snapshot() as snap:
        for as_of in (22, 27):
            tasks = snap.plan(Probe(tuple(keys)), as_of)
            assert tasks and all(t.batch is not None for t in tasks)
            got = Counter()
            for task in tasks:  # pickled, as Spark ships a partition
                for b in read_unpinned(pickle.loads(pickle.dumps(task)), *snap.read_args()):
                    got += rows_multiset(pa.Table.from_batches([b]))
            want = sum((oracle.probe(k, as_of) for k in keys), Counter())
            assert got == want, as_of
            parts = [t.part(0, len(t.blocks)) for t in tasks]  # planned key by key (no batch)
            assert all(p.batch is None for p in parts)
            assert sum((rows_multiset(pa.Table.from_batches(list(snap.read(p)))) if p.blocks else Counter()
                        for p in parts), Counter()) == want
    arc.close()


def test_a_one_shot_probe_answers_without_loading_pandas(tmp_path):
    """``ebb probe`` in a fresh process: pyarrow's ``Schema.empty_table`` (a probe's answer with
    no rows) would load pandas, 0.2 s of the command's time."""
    arc, oracle, _, _, _ = _one_run(tmp_path)
    arc.close()
    held = next(k for k in range(300) if oracle.probe(k, 16))
    for key in (held, 10**6):  # a key with rows, then one without
        r = subprocess.run([sys.executable, "-X", "importtime", "-m", "ebb.tools.cli", "probe", str(tmp_path / "a"),
                            str(key), "--format", "jsonl"], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-500:]
        assert (r.stdout.count("\n") > 0) == (key == held)
        modules = {line.split("|")[-1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")}
        assert "pandas" not in modules, key


def test_a_large_answer_reuses_the_memory_of_the_last_one(tmp_path):
    """A probe's answer is one allocation. The C library maps a fresh one of megabytes anew
    (after an update it trims its heap), and each first touch of a page is a page fault: the
    native probe keeps the last large answer's memory for the next, so probing again after
    the heap was trimmed takes a handful of faults, not one a page."""
    import ctypes
    import gc
    import resource

    rows = [{"key": 7, "ts": 15, "exp": 17 + i % 6, "payload": "p" * 1000 + str(i)} for i in range(3000)]
    with Archive.create(str(tmp_path / "a"), config(G=1, E=1)) as arc:
        arc.load(pa.Table.from_pylist(rows, SCHEMA), 16)
        reader = ArchiveReader(arc)
        want = rows_multiset(reader.probe(7, 16))
        assert len(want) == 3000  # about 3 MB
        trim = ctypes.CDLL(None).malloc_trim
        for _ in range(3):
            gc.collect()
            trim(0)
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            got = reader.probe(7, 16)
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
            assert rows_multiset(got) == want
            del got
            assert faults < 100  # the answer alone is over 700 pages
