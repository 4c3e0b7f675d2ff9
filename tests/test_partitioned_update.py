"""An update written in parts by other processes (storage/partitioned_update.py), with the
executors played in-process: the plan and every result cross a pickle, as they do to and from
Spark tasks. Random schedules give exactly the oracle's answers and the same answers as
``Archive.load``; missing parts commit nothing; parts written but never committed are removed."""

from __future__ import annotations

import os
import pickle
import tempfile

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ebb.query.reader import ArchiveReader
from ebb.storage.archive import Archive
from ebb.storage.errors import ArchiveError, RejectedBatch
from ebb.storage.partitioned_update import finish, prepare
from ebb.storage.recovery import collect_garbage, recover
from ebb.storage.verify import verify

from support import SCHEMA, Oracle, archive_answers, config, random_rows, rows_multiset
from test_oracle import check_reads, make_rows, scenarios


def load_in_parts(arc: Archive, table: pa.Table, at: int, part_bytes: int, batches: int = 3) -> dict:
    """``arc.load`` done the way Spark does it: plan, route each batch, one write per part, adopt."""
    with arc.writer_lock():
        recover(arc.env, arc.data_dir)
        pu = pickle.loads(pickle.dumps(prepare(arc, table.schema, at, part_bytes)))
        cuts = np.linspace(0, table.num_rows, batches + 1).astype(int)
        chunks = [table.slice(a, b - a) for a, b in zip(cuts, cuts[1:])]
        routed = [(c, pu.part_of(c)) for c in chunks]
        results = []
        for k in range(len(pu.parts)):
            mine = pa.concat_tables([c.filter(pa.array(ids == k)) for c, ids in routed])
            results.append(pickle.loads(pickle.dumps(pu.write_part(k, mine))))
        rec = finish(arc, pu, results[::-1])  # any order
        collect_garbage(arc.env, arc.data_dir)
    return rec


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.sampled_from([1, 700, 1 << 30]))
def test_parts_match_the_oracle_and_a_single_process(sc, part_bytes):
    rng = np.random.default_rng(sc["seed"])
    ktype = pa.string() if sc["string_keys"] else pa.int64()
    schema = pa.schema([("key", ktype), ("ts", pa.int64()), ("exp", pa.int64()), ("payload", pa.string())])
    cfg = config(mode=sc["mode"], tau=sc["tau"], delta=sc["delta"], max_lifetime=sc["s"], accept_overlong=sc["overlong"],
                 block_bytes=sc["block_bytes"] or 512 << 10, **sc["layout"])
    oracle = Oracle()
    with tempfile.TemporaryDirectory() as d:
        parted, single = Archive.create(d + "/p", cfg), Archive.create(d + "/s", cfg)
        tau, delta, s = sc["tau"], sc["delta"], sc["s"]
        rows = make_rows(rng, sc["base_rate"] * 3, tau - s + 1, tau, sc, "bulk")
        batch = pa.Table.from_pylist(rows, schema=schema)
        load_in_parts(parted, batch, tau, part_bytes)
        single.load(batch, tau)
        oracle.load(rows, tau)
        j = 0
        for missed, mult, _ in sc["steps"]:
            j += 1 + missed
            T = tau + j * delta
            rows = make_rows(rng, sc["base_rate"] * mult, T - 2 * delta + 1, T, sc, f"u{j}")
            batch = pa.Table.from_pylist(rows, schema=schema)
            rec = load_in_parts(parted, batch, T, part_bytes)
            want = single.load(batch, T)
            oracle.load(rows, T)
            for k in ("inserted", "deleted", "dropped_expired", "input_rows", "slot", "planned_insert_into",
                      "planned_delete_from"):
                assert rec[k] == want[k], k
            assert len(rec["subindices_touched"]) <= len(set(rec["planned_insert_into"]) | set(rec["planned_delete_from"]))
            check_reads(parted, oracle, T, rng, sc)
            t = T + int(rng.integers(0, s + 3))
            with ArchiveReader(parted) as a, ArchiveReader(single) as b:
                assert rows_multiset(a.scan_table(as_of=t)) == rows_multiset(b.scan_table(as_of=t))
        problems, notes = verify(parted)
        assert problems == [] and notes == []
        parted.close()
        single.close()


def _archive(tmp_path, mode="rebuild"):
    arc = Archive.create(str(tmp_path / "a"), config(mode=mode, block_bytes=256))
    rng = np.random.default_rng(3)
    load_in_parts(arc, pa.Table.from_pylist(random_rows(rng, 300, 1, 16, 16, 40), schema=SCHEMA), 16, 2000)
    return arc, rng


def test_rebuild_sub_index_split_into_key_ranges(tmp_path):
    arc, rng = _archive(tmp_path)
    rec = load_in_parts(arc, pa.Table.from_pylist(random_rows(rng, 300, 17, 18, 16, 40), schema=SCHEMA), 18, 2000)
    state = arc.state()
    assert max(len(s.runs) for s in state.subindices) > 1  # several tasks wrote one sub-index
    assert len(rec["subindices_touched"]) <= 3  # G + E - 1
    assert verify(arc) == ([], [])
    arc.load(pa.Table.from_pylist(random_rows(rng, 50, 19, 20, 16, 40), schema=SCHEMA), 20)  # one process again
    assert verify(arc) == ([], [])


@pytest.mark.parametrize("mode", ["rebuild", "norebuild"])
def test_a_missing_part_commits_nothing_and_its_siblings_are_removed(tmp_path, mode):
    arc, rng = _archive(tmp_path, mode)
    before = archive_answers(arc, 18)
    seq = arc.state().update_seq
    table = pa.Table.from_pylist(random_rows(rng, 200, 17, 18, 16, 40), schema=SCHEMA)
    with arc.writer_lock():
        pu = prepare(arc, table.schema, 18, 2000)
        ids = pu.part_of(table)
        results = [pu.write_part(k, table.filter(pa.array(ids == k))) for k in range(len(pu.parts))]
        written = [r.run_name for r in results if r.run_name]
        assert written and all(os.path.exists(os.path.join(arc.data_dir, n)) for n in written)
        with pytest.raises(ArchiveError, match="parts came back"):
            finish(arc, pu, results[1:])
        with pytest.raises(ArchiveError, match="parts came back"):
            finish(arc, pu, results + results[:1])  # a duplicate (speculative task) is refused too
    assert arc.state().update_seq == seq
    problems, notes = verify(arc)
    assert problems == [] and len(notes) == len(written)  # the uncommitted runs, reported as leftovers
    arc.recover()
    assert verify(arc) == ([], [])
    assert not any(os.path.exists(os.path.join(arc.data_dir, n)) for n in written)
    assert archive_answers(arc, 18) == before


def test_bad_records_are_rejected_where_they_are_routed(tmp_path):
    arc, rng = _archive(tmp_path)
    rows = random_rows(rng, 20, 17, 18, 16, 40)
    rows[5]["exp"] = rows[5]["ts"]  # exp <= ts
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    with arc.writer_lock():
        pu = prepare(arc, table.schema, 18, 2000)
        with pytest.raises(RejectedBatch, match="exp"):
            pu.part_of(table)
    with pytest.raises(RejectedBatch, match="not after the last update"):
        with arc.writer_lock():
            prepare(arc, table.schema, 16, 2000)
