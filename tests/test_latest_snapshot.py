"""A reader that does not follow versions keeps the newest version's prepared snapshot between
point probes (storage/latest_snapshot.py): while no version commits its probes open no snapshot,
every answer is the oracle's for the newest version after each commit, instants it cannot answer
open a snapshot as before, and a probe whose blocks garbage collection reclaimed under it (a
version committed after the probe checked) is asked again of a fresh snapshot, while damage with
no commit behind it is still raised."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ebb.query.reader import ArchiveReader
from ebb.storage import point_probe
from ebb.storage.archive import Archive
from ebb.storage.errors import ArchiveError, CorruptionError, ReadError
from ebb.storage.timemodel import MAX_TIME

from support import SCHEMA, Oracle, config, random_rows, rows_multiset, table_of

# the kept snapshot answers through the native point probe's prepared run set; without it
# (EBB_NATIVE=0) nothing is kept and every probe opens a snapshot (the other tests' path)
pytestmark = pytest.mark.skipif(not point_probe.NATIVE, reason="the native point probe is off")

KEYS = 10


def _loaded(tmp_path, mode: str, seed: int, life: int) -> tuple[str, Archive, Oracle]:
    """An archive (blocks of 512 bytes: many a run) of 400 rows loaded at 16, lifetimes 1..``life``."""
    path = str(tmp_path / "a")
    writer = Archive.create(path, config(mode=mode, block_bytes=512))
    oracle = Oracle()
    rows = random_rows(np.random.default_rng(seed), 400, 15, 16, life, KEYS)
    writer.load(table_of(rows, SCHEMA), 16)
    oracle.load(rows, 16)
    return path, writer, oracle


class Opens:
    """Counts the snapshots a reader's archive opens."""

    def __init__(self, reader: ArchiveReader):
        self.n = 0
        archive, opened = reader.archive, reader.archive.snapshot

        def counted():
            self.n += 1
            return opened()

        archive.snapshot = counted


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mode=st.sampled_from(["rebuild", "norebuild"]), seed=st.integers(0, 2**32 - 1),
       sizes=st.lists(st.sampled_from([0, 0, 3, 40, 200]), min_size=3, max_size=9))
def test_probes_answer_each_commit_and_open_no_snapshot_while_none_commits(tmp_path_factory, mode, seed, sizes):
    rng = np.random.default_rng(seed)
    path = str(tmp_path_factory.mktemp("a") / "a")
    writer = Archive.create(path, config(mode=mode, block_bytes=512))
    reader = ArchiveReader(path)  # an archive of its own, as in another process
    opens, oracle = Opens(reader), Oracle()
    try:
        for j, n in enumerate(sizes):  # bursts, and intervals with nothing new
            T = 16 + 2 * j
            rows = random_rows(rng, n, max(T - 3, 1), T, 16, KEYS, tag=f"{T}.")
            writer.load(table_of(rows, SCHEMA), T)
            oracle.load(rows, T)
            before = opens.n
            for k in range(KEYS):
                assert rows_multiset(reader.probe(k)) == oracle.probe(k, T)
                assert rows_multiset(reader.probe(k, as_of=T + 1)) == oracle.probe(k, T + 1)  # later: same version
            assert rows_multiset(reader.probe_many(list(range(KEYS)))) == rows_multiset(oracle.valid(T))
            assert opens.n - before == 1  # the first probe after the commit, then none
            with pytest.raises(ReadError, match="before"):  # an earlier instant is not the kept version's
                reader.probe(0, as_of=T - 1)
    finally:
        reader.close()
        writer.close()


def test_a_probe_whose_blocks_were_reclaimed_under_it_asks_a_fresh_snapshot(tmp_path, monkeypatch):
    """Stands in for a commit landing between the kept snapshot's check and its reads: the check
    is made to pass once against a version that has since been replaced and reclaimed."""
    path, writer, oracle = _loaded(tmp_path, "norebuild", 7, 16)  # a run whose first blocks expire long before its last
    reader = ArchiveReader(path)
    rng = np.random.default_rng(8)
    key = 3
    assert rows_multiset(reader.probe(key)) == oracle.probe(key, 16)  # keeps version 1
    stale = reader.archive.newest_version()
    for T in range(18, 26, 2):  # garbage collection punches out the runs' expired first blocks
        later = random_rows(rng, 20, T - 1, T, 16, KEYS, tag=f"{T}.")
        writer.load(table_of(later, SCHEMA), T)
        oracle.load(later, T)

    newest, calls = reader.archive.newest_version, []

    def once_stale():
        calls.append(1)
        return stale if len(calls) == 1 else newest()

    monkeypatch.setattr(reader.archive, "newest_version", once_stale)
    retried = []
    outdated = reader._latest.outdated
    monkeypatch.setattr(reader._latest, "outdated", lambda kept: retried.append(1) or outdated(kept))
    assert rows_multiset(reader.probe(key)) == oracle.probe(key, T)  # the newest version's answer
    assert retried == [1], "the kept snapshot's reads did not fail: this test did not reach the retry"
    reader.close()
    writer.close()


def test_damage_with_no_commit_behind_it_is_raised(tmp_path):
    path, writer, _ = _loaded(tmp_path, "rebuild", 3, 16)
    writer.close()
    reader = ArchiveReader(path)
    for k in range(KEYS):
        reader.probe(k)  # kept, every block's pages checked
    runs = [os.path.join(reader.archive.data_dir, f) for f in os.listdir(reader.archive.data_dir) if f.endswith(".run")]
    for run in runs:  # every byte of every block flipped after the first page: no row survives unread
        with open(run, "r+b") as f:
            data = bytearray(f.read())
            for i in range(64, len(data)):
                data[i] ^= 0x5A
            f.seek(0)
            f.write(data)
    with pytest.raises(CorruptionError):
        for k in range(KEYS):
            reader.probe(k)
    reader.close()


def test_newest_version_is_lmdbs_last_commit(tmp_path):
    """``Archive.newest_version`` reads the meta pages natively; it must say what LMDB says, in the
    writer's process and in a reader's, after every commit."""
    rng = np.random.default_rng(5)
    path = str(tmp_path / "a")
    writer = Archive.create(path, config(mode="norebuild", block_bytes=512))
    reader = Archive(path, readonly=True)
    seen = set()
    for T in range(16, 40, 2):
        writer.load(table_of(random_rows(rng, 30, T - 1, T, 8, KEYS), SCHEMA), T)
        lmdb_says = writer.env.info()["last_txnid"]
        assert writer.newest_version() == reader.newest_version() == lmdb_says
        with reader.snapshot() as snap:
            assert snap.version_token() == lmdb_says
        seen.add(lmdb_says)
    assert len(seen) == 12
    not_lmdb = tmp_path / "not-lmdb"
    not_lmdb.write_bytes(b"\x00" * 16384)
    with open(not_lmdb, "rb") as f:
        assert point_probe._point_probe.newest_txnid(point_probe._point_probe.map_lmdb_file(f.fileno(), 16384), 16384) is None
    reader.close()
    writer.close()
    with pytest.raises(ArchiveError, match="closed"):
        reader.newest_version()


def test_prepare_probes_keeps_its_snapshot_for_the_first_probe(tmp_path):
    path, writer, oracle = _loaded(tmp_path, "rebuild", 9, 16)
    reader = ArchiveReader(path)
    reader.prepare_probes()
    opens = Opens(reader)
    assert [rows_multiset(reader.probe(k)) for k in range(KEYS)] == [oracle.probe(k, 16) for k in range(KEYS)]
    assert opens.n == 0
    with pytest.raises(ReadError, match="outside ebb's time range"):  # not the kept version's to answer
        reader.probe(0, as_of=MAX_TIME + 1)
    reader.close()
    writer.close()


@pytest.mark.parametrize("as_numpy", [np.int64, np.int32, np.uint16])
def test_numpy_integer_keys_take_the_path_of_the_ints_they_hold(tmp_path, as_numpy):
    """A key taken from an array is a numpy scalar: it answers as its Python value, by the kept
    snapshot (no snapshot opened), not by the planned read of every sub-index."""
    path, writer, oracle = _loaded(tmp_path, "norebuild", 11, 16)
    reader = ArchiveReader(path)
    opens = Opens(reader)
    try:
        reader.probe(0)  # keeps the version
        for k in range(KEYS):
            assert rows_multiset(reader.probe(as_numpy(k))) == oracle.probe(k, 16)
            with reader.archive.snapshot() as snap:  # a snapshot's own probe, too
                assert rows_multiset(snap.probe(as_numpy(k))[0]) == oracle.probe(k, 16)
        assert opens.n == 1 + KEYS  # the first probe's, then only the snapshots opened above
    finally:
        reader.close()
        writer.close()
