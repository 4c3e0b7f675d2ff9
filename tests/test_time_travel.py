"""Reads as of an earlier instant (``retain``): random schedules, every layout and mode, checked
against a brute-force oracle of every version; an instant before the retained window fails
naming the oldest readable one; the space kept versions need is reclaimed once they leave the
window; and the update log stays bounded."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import test_oracle as base
from ebb.query.reader import ArchiveReader
from ebb.storage.archive import Archive
from ebb.storage.errors import ReadError
from ebb.storage.verify import verify

from support import Oracle, config, rows_multiset


def oldest_readable(history: list[tuple[int, list]], retain: int) -> int:
    """The time of the oldest version kept: the newest one current at ``last - retain``."""
    last = history[-1][0]
    times = [t for t, _ in history]
    return max([t for t in times if t <= last - retain], default=times[0])


def version_oracle(history: list[tuple[int, list]], t: int) -> Oracle:
    o = Oracle()
    o.records = [rows for T, rows in history if T <= t][-1]
    return o


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(base.scenarios(), st.integers(1, 12))
def test_as_of_any_retained_instant_matches_that_versions_oracle(sc, retain_slots):
    retain = retain_slots * sc["delta"] // 2 + (retain_slots % 3)  # not always a multiple of Delta
    with tempfile.TemporaryDirectory() as d:
        rng = np.random.default_rng(sc["seed"])
        ktype = pa.string() if sc["string_keys"] else pa.int64()
        schema = pa.schema([("key", ktype), ("ts", pa.int64()), ("exp", pa.int64()), ("payload", pa.string())])
        cfg = config(mode=sc["mode"], tau=sc["tau"], delta=sc["delta"], max_lifetime=sc["s"],
                     accept_overlong=sc["overlong"], block_bytes=sc["block_bytes"] or 512 << 10, retain=retain,
                     update_log=3, **sc["layout"])
        arc = Archive.create(d + "/a", cfg)
        oracle = Oracle()
        history = []
        j = 0
        for step, (missed, mult, probes) in enumerate([(0, 3, 1)] + sc["steps"]):
            T = sc["tau"] + j * sc["delta"]
            lo = T - sc["s"] + 1 if step == 0 else T - 2 * sc["delta"] + 1
            rows = base.make_rows(rng, sc["base_rate"] * mult, lo, T, sc, f"u{j}")
            arc.load(pa.Table.from_pylist(rows, schema=schema), T)
            oracle.load(rows, T)
            history.append((T, list(oracle.records)))
            first = oldest_readable(history, retain)
            with ArchiveReader(arc) as r:
                for t in {first, T - retain, *(int(x) for x in rng.integers(first, T + 1, 2 + probes))}:
                    if t < first:
                        continue
                    want = version_oracle(history, t)
                    assert rows_multiset(r.scan_table(as_of=t)) == want.scan(t)
                    keys = [x["key"] for x in want.records] or [0 if not sc["string_keys"] else "k0é"]
                    k = keys[int(rng.integers(0, len(keys)))]
                    assert rows_multiset(r.probe(k, as_of=t)) == want.probe(k, t)
                    a, b = sorted([keys[0], keys[-1]])
                    assert rows_multiset(r.probe_range(a, b, as_of=t)) == want.probe_range(a, b, t)
                with pytest.raises(ReadError, match=f"before {first}, the oldest instant"):
                    r.probe(0 if not sc["string_keys"] else "k0é", as_of=first - 1)
            j += 1 + missed
        assert len(arc.updates()) == min(3, len(history))
        problems, _ = verify(arc)
        assert problems == []
        arc.close()


def test_space_of_versions_that_leave_the_window_is_reclaimed(tmp_path):
    """NoRebuild drops whole runs and dead prefixes; Rebuild replaces runs: either way, what a
    kept version reads stays on disk until the version leaves the retained window, then goes."""
    schema = pa.schema([("key", pa.int64()), ("ts", pa.int64()), ("exp", pa.int64())])
    for mode in ("rebuild", "norebuild"):
        cfg = config(mode=mode, tau=0, delta=1, max_lifetime=4, retain=3, block_bytes=256)
        arc = Archive.create(str(tmp_path / mode), cfg)
        for T in range(12):
            rows = [{"key": k, "ts": T, "exp": T + 1 + k % 4} for k in range(40)]
            arc.load(pa.Table.from_pylist(rows, schema=schema), T)
        with ArchiveReader(arc) as r:
            assert r.scan_table(as_of=8).num_rows == 40 + 30 + 20 + 10  # rows of T=5..8 valid at 8
            with pytest.raises(ReadError):
                r.scan_table(as_of=7)
        # every run file on disk is one the current or a kept version reads
        with arc.snapshot() as snap:
            from ebb.storage.manifest import oldest_kept_version

            assert oldest_kept_version(snap.txn).time == 8
        on_disk = {n for n in os.listdir(arc.data_dir) if n.endswith(".run")}
        needed = set()
        with arc.snapshot() as snap:
            for t in range(8, 12):
                needed |= snap.version_at(t)[1].run_names()
        assert on_disk == needed
        # the window moves on: a later update lets go of what only version 8 read
        arc.load(pa.Table.from_pylist([], schema=schema), 12)
        with arc.snapshot() as snap:
            needed = set().union(*(snap.version_at(t)[1].run_names() for t in range(9, 13)))
        assert {n for n in os.listdir(arc.data_dir) if n.endswith(".run")} == needed
        assert verify(arc)[0] == []
        arc.close()


def test_metadata_stays_bounded_over_many_idle_updates(tmp_path):
    """The update log and the kept versions are trimmed: after 3,000 idle updates the metadata
    holds as many entries as after 1,000, and its file has grown by at most the few pages of
    LMDB's free list (measured: 27 -> 29 pages, then flat to 10,000 updates)."""
    cfg = config(mode="norebuild", tau=0, delta=1, max_lifetime=4, retain=5, update_log=50)
    arc = Archive.create(str(tmp_path / "a"), cfg)
    schema = pa.schema([("key", pa.int64()), ("ts", pa.int64()), ("exp", pa.int64())])
    arc.load(pa.Table.from_pylist([{"key": 1, "ts": 0, "exp": 3}], schema=schema), 0)

    mdb = os.path.join(arc.path, "index", "data.mdb")

    def entries() -> int:
        with arc.env.begin() as txn:
            return txn.stat()["entries"]

    for T in range(1, 3001):
        arc.load(pa.Table.from_pylist([], schema=schema), T)
        if T == 1000:
            entries_1000, size_1000 = entries(), os.path.getsize(mdb)
    assert entries() == entries_1000 and os.path.getsize(mdb) <= size_1000 + 4 * 4096
    assert len(arc.updates()) == 50 and arc.stats()["updates"] == 3001
    arc.close()


def test_a_read_of_a_kept_version_outlives_the_window_moving_past_it(tmp_path):
    """A scan as of a kept version leases it: updates that move the retention window past it
    (and would reclaim what it reads) do not fail it, and once it ends the space goes."""
    schema = pa.schema([("key", pa.int64()), ("ts", pa.int64()), ("exp", pa.int64()), ("pad", pa.string())])
    cfg = config(mode="rebuild", tau=0, delta=1, max_lifetime=4, retain=2, block_bytes=256)
    arc = Archive.create(str(tmp_path / "a"), cfg)
    oracle, history = Oracle(), []
    for T in range(6):
        rows = [{"key": k, "ts": T, "exp": T + 1 + k % 4, "pad": "x" * 40} for k in range(60)]
        arc.load(pa.Table.from_pylist(rows, schema=schema), T)
        oracle.load(rows, T)
        history.append((T, list(oracle.records)))
    with ArchiveReader(arc) as r:
        stream = r.scan(as_of=3)  # the version of update 3, kept while the window holds 3..5
        first = next(stream)
        for T in range(6, 12):  # Rebuild replaces every run version 3 reads
            arc.load(pa.Table.from_pylist([], schema=schema), T)
            arc.open_files.close()  # nothing cached: every block is read after the updates
        got = pa.Table.from_batches([first, *stream])
        assert rows_multiset(got) == version_oracle(history, 3).scan(3)
        with pytest.raises(ReadError, match="oldest instant"):
            r.scan_table(as_of=3)
    arc.load(pa.Table.from_pylist([], schema=schema), 12)
    assert os.listdir(os.path.join(arc.data_dir, "leases")) == []
    assert verify(arc)[0] == []
    arc.close()
