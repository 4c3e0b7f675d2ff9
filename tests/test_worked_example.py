"""docs/spec.md section 3's worked example (thesis Figures 4.1 and 4.2), from the planner and from the
I/O accounting of real loads; and G + E - 1 touched sub-indices at every n tested."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from ebb.query.reader import ArchiveReader
from ebb.storage.archive import Archive

from support import SCHEMA, config, ebb

S, DELTA, TAU = 16, 2, 16


def dense_batch(ts_values, lifetimes, keys=3, tag="") -> pa.Table:
    """Every (ts, lifetime, key) combination once: every sub-index a load may touch gets data."""
    ts, life, key = np.meshgrid(np.asarray(ts_values), np.asarray(lifetimes), np.arange(keys), indexing="ij")
    ts, life, key = ts.ravel(), life.ravel(), key.ravel()
    return pa.table({"key": key.astype(np.int64), "ts": ts.astype(np.int64), "exp": (ts + life).astype(np.int64),
                     "payload": pa.array([f"{tag}{i}" for i in range(ts.size)])}, schema=SCHEMA)


EXPECTED = {
    # time -> (insert into, delete from), from docs/spec.md section 3
    "round-robin": {T: (([1, 2], [1, 3]) if (T - TAU) // DELTA % 2 == 1 else ([3, 4], [2, 4])) for T in range(18, 34, 2)},
    "chronological": {T: (([1, 2], [1, 3]) if T <= 24 else ([3, 4], [2, 4])) for T in range(18, 34, 2)},
}


@pytest.mark.parametrize("partitioning", ["round-robin", "chronological"])
def test_plan_cli_matches_spec(tmp_path, partitioning):
    path = tmp_path / "a"
    r = ebb("init", path, "--layout", "doubly", "--partitioning", partitioning, "--G", 2, "--E", 2, "--mode", "rebuild",
            "--max-lifetime", S, "--interval", DELTA, "--start", TAU)
    assert r.returncode == 0, r.stderr
    pq_path = tmp_path / "bulk.parquet"
    import pyarrow.parquet as pq

    pq.write_table(dense_batch(range(1, 17), range(1, 17)), pq_path)
    assert ebb("load", path, pq_path, "--at", TAU).returncode == 0
    r = ebb("plan", path, "--updates", 8, "--format", "json")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert [p["time"] for p in plan] == list(range(18, 34, 2))
    for p in plan:
        assert (p["insert_into"], p["delete_from"]) == EXPECTED[partitioning][p["time"]]
        assert len(p["touched"]) == 3


@pytest.mark.parametrize("mode", ["rebuild", "norebuild"])
@pytest.mark.parametrize("partitioning", ["round-robin", "chronological"])
def test_real_loads_touch_the_spec_sets(tmp_path, partitioning, mode):
    arc = Archive.create(str(tmp_path / "a"), config(partitioning=partitioning, mode=mode))
    bulk = arc.load(dense_batch(range(1, 17), range(1, 17)), TAU)
    assert bulk["kind"] == "bulk"
    # Figures 4.1 / 4.2: what each sub-index holds after the initial load
    with ArchiveReader(arc) as r:
        held = {i + 1: r.scan_table(subindices=[i]) for i in range(4)}
    for i, t in held.items():
        ts = np.asarray(t.column("ts"))
        exp = np.asarray(t.column("exp"))
        if partitioning == "round-robin":
            row, col = (i - 1) // 2, (i - 1) % 2
            assert t.num_rows > 0
            assert set(((ts - 1) // 2) % 2) == {row}  # I1, I2: ts 1-2, 5-6, ...; I3, I4: ts 3-4, 7-8, ...
            assert set(((exp - 17) // 2) % 2) == {col}  # I1, I3: exp 17-18, 21-22, ...; I2, I4: exp 19-20, ...
        else:
            if i == 2:
                assert t.num_rows == 0  # ts 1-8 with exp 25-32 would need lifetimes over S
                continue
            row, col = (i - 1) // 2, (i - 1) % 2
            assert set((ts - 1) // 8) == {row}  # I1, I2: ts 1-8; I3, I4: ts 9-16
            assert set((exp - 17) // 8) == {col}  # I1, I3: exp 17-24; I2, I4: exp 25-32
    for T in range(18, 34, 2):
        rec = arc.load(dense_batch([T - 1, T], range(1, 17), tag=f"t{T}-"), T)
        ins, dele = EXPECTED[partitioning][T]
        per = {p["subindex"]: p for p in rec["per_subindex"]}
        assert sorted(i for i, p in per.items() if p["inserted"]) == ins
        assert sorted(i for i, p in per.items() if p["deleted"]) == dele
        assert rec["subindices_touched"] == sorted(set(ins) | set(dele))
        assert len(rec["subindices_touched"]) == 2 + 2 - 1
        assert rec["planned_insert_into"] == ins and rec["planned_delete_from"] == dele
    arc.close()


def uniform_batch(rng, n, lo, hi, s, keys=50, tag=""):
    ts = rng.integers(lo, hi + 1, n)
    return pa.table({"key": rng.integers(0, keys, n), "ts": ts, "exp": ts + rng.integers(1, s + 1, n),
                     "payload": pa.array([f"{tag}{i}" for i in range(n)])}, schema=SCHEMA)


@pytest.mark.parametrize("mode", ["rebuild", "norebuild"])
@pytest.mark.parametrize("partitioning", ["round-robin", "chronological", "random"])
@pytest.mark.parametrize("G,E", [(1, 1), (2, 2), (3, 3), (4, 4), (2, 8), (8, 2)])
def test_doubly_touches_g_plus_e_minus_1(tmp_path, G, E, partitioning, mode):
    delta, p = 10, 16
    s = p * delta
    rng = np.random.default_rng(G * 100 + E)
    arc = Archive.create(str(tmp_path / "a"), config(G=G, E=E, partitioning=partitioning, mode=mode, tau=0, delta=delta, max_lifetime=s, seed=12345))
    arc.load(uniform_batch(rng, 6000, -s + 1, 0, s), 0)
    for j in range(1, 2 * p + 1):
        T = j * delta
        rec = arc.load(uniform_batch(rng, 1500, T - delta + 1, T, s, tag=f"{j}-"), T)
        touched = rec["subindices_touched"]
        planned = sorted(set(rec["planned_insert_into"]) | set(rec["planned_delete_from"]))
        assert len(planned) == G + E - 1
        if partitioning != "random":
            assert touched == planned, (j, touched)
        else:
            # a random row may hold no records expiring now: it is planned but has no work
            assert set(touched) <= set(planned)
    arc.close()


@pytest.mark.parametrize("mode", ["rebuild", "norebuild"])
@pytest.mark.parametrize("split", ["insertion", "expiration"])
@pytest.mark.parametrize("n", [4, 9])
def test_wave_touches_what_spec_says(tmp_path, n, split, mode):
    """Variable lifetimes: split by insertion deletes from every sub-index, split by expiration
    inserts into every sub-index; with equal lifetimes a wave index touches one sub-index."""
    delta, p = 10, 36
    s = p * delta
    rng = np.random.default_rng(n)
    arc = Archive.create(str(tmp_path / "var"), config(layout="wave", split=split, n_wave=n, mode=mode, tau=0, delta=delta, max_lifetime=s))
    arc.load(uniform_batch(rng, 8000, -s + 1, 0, s), 0)
    for j in range(1, 13):
        T = j * delta
        rec = arc.load(uniform_batch(rng, 2000, T - delta + 1, T, s), T)
        own = (((j - 1) % p) * n) // p + 1
        if split == "insertion":
            assert rec["planned_insert_into"] == [own] and rec["planned_delete_from"] == list(range(1, n + 1))
        else:
            assert rec["planned_delete_from"] == [own] and rec["planned_insert_into"] == list(range(1, n + 1))
        assert rec["subindices_touched"] == list(range(1, n + 1))
    arc.close()
    # equal lifetimes (the weakest pattern the wave index was made for): one sub-index per update
    arc = Archive.create(str(tmp_path / "eq"), config(layout="wave", split=split, n_wave=n, mode=mode, tau=0, delta=delta, max_lifetime=s))
    ts0 = np.repeat(np.arange(-s + 1, 1), 3)
    arc.load(pa.table({"key": ts0 % 7, "ts": ts0, "exp": ts0 + s, "payload": pa.array(["b"] * ts0.size)}, schema=SCHEMA), 0)
    for j in range(1, 13):
        T = j * delta
        ts = np.repeat(np.arange(T - delta + 1, T + 1), 3)
        rec = arc.load(pa.table({"key": ts % 7, "ts": ts, "exp": ts + s, "payload": pa.array(["u"] * ts.size)}, schema=SCHEMA), T)
        own = (((j - 1) % p) * n) // p + 1
        assert rec["subindices_touched"] == [own], (j, rec["subindices_touched"])
    arc.close()
