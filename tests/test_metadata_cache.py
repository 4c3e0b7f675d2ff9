"""The run-metadata cache: it stays within its byte budget whatever the archive's size, only
probes load page sums, and answers are the oracle's whether it holds everything, must evict, or
holds nothing."""

from __future__ import annotations

import numpy as np
import pytest

from ebb.query.reader import ArchiveReader
from ebb.storage.archive import Archive
from ebb.storage.manifest import write_run
from ebb.storage.metadata_cache import MetadataCache

from support import SCHEMA, Oracle, config, random_rows, rows_multiset, table_of

KEYS = 20


def _archive(tmp_path, mode: str, retain: int = 0) -> tuple[Archive, Oracle, int, np.random.Generator]:
    rng = np.random.default_rng(7)
    arc = Archive.create(str(tmp_path / "a"), config(mode=mode, block_bytes=256, retain=retain))
    oracle = Oracle()
    for T in range(16, 40, 2):
        rows = random_rows(rng, 200, T - 1, T, 16, KEYS, tag=str(T))
        arc.load(table_of(rows, SCHEMA), T)
        oracle.load(rows, T)
    return arc, oracle, T, rng


@pytest.mark.parametrize("mode", ["rebuild", "norebuild"])
@pytest.mark.parametrize("limit", [0, 3000, 1 << 20])
def test_answers_and_budget_whatever_the_cache_holds(tmp_path, mode, limit):
    arc, oracle, T, rng = _archive(tmp_path, mode)
    arc.reads.metadata = MetadataCache(limit)
    try:
        for step in range(3):  # reads, then an update that deletes through cached descriptors
            with ArchiveReader(arc) as r:
                for k in range(KEYS):
                    assert rows_multiset(r.probe(k, as_of=T)) == oracle.probe(k, T)
                assert rows_multiset(r.probe_range(3, 9, as_of=T)) == oracle.probe_range(3, 9, T)
                assert rows_multiset(r.scan_table(as_of=T)) == oracle.scan(T)
            assert arc.metadata.bytes <= limit
            T += 2
            rows = random_rows(rng, 200, T - 1, T, 16, KEYS, tag=f"s{step}")
            arc.load(table_of(rows, SCHEMA), T)
            oracle.load(rows, T)
    finally:
        arc.close()


def test_only_probes_load_page_sums_and_lean_descriptors_are_never_stored(tmp_path):
    arc, oracle, T, rng = _archive(tmp_path, "norebuild")
    arc.close()
    arc = Archive(str(tmp_path / "a"))  # opened again: the loads' process had prepared every run for probes
    try:
        with ArchiveReader(arc) as r:
            r.scan_table(as_of=T)
        assert {kind for kind, _ in arc.metadata._entries} == {"run"}
        before = {run.name for sub in arc.state().subindices for run in sub.runs}
        arc.load(table_of(random_rows(rng, 200, T + 1, T + 2, 16, KEYS), SCHEMA), T + 2)
        written = {run.name for sub in arc.state().subindices for run in sub.runs} - before
        # the update kept the page sums its writers made, and loaded none of the older runs'
        assert written and {name for kind, name in arc.metadata._entries if kind == "sums"} == written
        with ArchiveReader(arc) as r:
            for k in range(KEYS):
                r.probe(k, as_of=T + 2)
        assert {name for kind, name in arc.metadata._entries if kind == "sums"} > written
        with arc.env.begin(write=True) as txn:
            name = arc.state().subindices[0].runs[0].name
            lean = arc.metadata.descriptor(txn, name)
            assert lean.paged and lean.sums is None
            with pytest.raises(ValueError, match="without its page sums"):
                write_run(txn, lean)
    finally:
        arc.close()


@pytest.mark.parametrize("mode", ["rebuild", "norebuild"])
def test_a_new_version_drops_the_entries_of_the_runs_it_replaced(tmp_path, mode):
    """The cache holds the current version's runs only, however many updates replaced runs
    before it (they held the whole budget, left to the least-recently-used order); reads of an
    older version read their metadata back and still give the oracle's answers."""
    arc, oracle, T, rng = _archive(tmp_path, mode, retain=30)
    try:
        first = T
        then = oracle.scan(first), oracle.probe(3, first)  # the oracle forgets what expires
        with ArchiveReader(arc) as r:
            for step in range(12):
                for k in range(KEYS):
                    assert rows_multiset(r.probe(k)) == oracle.probe(k, T)
                live = arc.state().run_names()
                cached = {name for _, name in arc.metadata._entries}
                assert cached and cached <= live, (step, sorted(cached - live))
                T += 2
                rows = random_rows(rng, 200, T - 1, T, 16, KEYS, tag=f"s{step}")
                arc.load(table_of(rows, SCHEMA), T)
                oracle.load(rows, T)
            assert (rows_multiset(r.scan_table(as_of=first)), rows_multiset(r.probe(3, as_of=first))) == then
    finally:
        arc.close()
