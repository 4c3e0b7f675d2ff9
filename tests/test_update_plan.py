"""The pure part of an update (storage/update_plan.py), without a disk: slots, the sub-index of
each record, the order maintenance writes them in, and the touched sets, against docs/spec.md
sections 2-3 (the worked example) and a brute-force restatement of the closed forms."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings, strategies as st

from ebb.storage.block_format import INS_SLOT
from ebb.storage.config import build_config
from ebb.storage.manifest import ArchiveState, LiveRun, SubIndexState
from ebb.storage.update_plan import plan_update, touched


def _table(key, ts, exp):
    return pa.table({"key": pa.array(key, pa.int64()), "ts": pa.array(ts, pa.int64()), "exp": pa.array(exp, pa.int64())})


def _state(n, min_exps):
    """A state whose sub-index i holds one run with the given min_exp (None: empty)."""
    subs = [SubIndexState([LiveRun(f"r{i}", 0, 1, 1, 1, m, m)] if m is not None else []) for i, m in enumerate(min_exps)]
    assert len(subs) == n
    return ArchiveState(last_slot=0, update_seq=1, subindices=subs)


def test_worked_example_round_robin():
    """docs/spec.md section 3: S = 16, Delta = 2, G = E = 2, tau = 16, round-robin."""
    cfg = build_config(layout="doubly", mode="rebuild", interval=2, max_lifetime=16, start=16, partitioning="round-robin")
    ts = np.arange(1, 17)
    # bulk: I1 holds ts 1-2, 5-6, ... with exp 17-18, 21-22, ...; I2 the same ts with exp 19-20, ...
    exp_i1 = ts + 16  # ts 1 -> exp 17 (slot 1), ts 3 -> 19 (slot 2)...
    plan = plan_update(cfg, None, 0, _table(np.zeros(16, dtype=np.int64), ts, exp_i1))
    assert plan.bulk and plan.deletion_slots is None and plan.planned_insert == [0, 1, 2, 3]
    sub_of_row = np.repeat(np.arange(4), np.diff(plan.cuts))
    got = dict(zip(plan.rows.column("ts").to_pylist(), sub_of_row.tolist()))
    for t in ts.tolist():
        k_ins = -((16 - t) // 2)  # slot(ts) in the bulk load
        k_exp = -((16 - (t + 16)) // 2)
        assert got[t] == ((k_ins - 1) % 2) * 2 + (k_exp - 1) % 2
    # the update at 18 (slot 1) inserts into I1, I2 and deletes from I1, I3
    plan = plan_update(cfg, 0, 1, _table([1, 2], [17, 18], [20, 25]))
    assert plan.planned_insert == [0, 1] and plan.planned_delete == [0, 2]
    deletes, inserts = touched(cfg, plan, _state(4, [17, 19, 18, 20]))
    assert deletes == {0, 2} and inserts <= {0, 1} and len(deletes | {0, 1}) == 3  # G + E - 1
    # the update at 20 (slot 2) inserts into I3, I4 and deletes from I2, I4
    plan = plan_update(cfg, 1, 2, _table([1], [19], [30]))
    assert plan.planned_insert == [2, 3] and plan.planned_delete == [1, 3]


def test_touched_skips_deletion_targets_without_expiring_records():
    cfg = build_config(layout="doubly", mode="norebuild", interval=2, max_lifetime=16, start=16)
    plan = plan_update(cfg, 0, 1, _table([], [], []))
    deletes, inserts = touched(cfg, plan, _state(4, [30, None, 18, 22]))
    assert deletes == {2} and inserts == set()  # I1's records expire later; I3's at 18


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from(["round-robin", "chronological", "random"]),
       st.sampled_from(["rebuild", "norebuild"]), st.integers(1, 3), st.integers(1, 3), st.booleans())
def test_plan_matches_the_closed_forms(seed, partitioning, mode, G, E, bulk):
    rng = np.random.default_rng(seed)
    tau, delta, s = 100, 5, 40
    cfg = build_config(layout="doubly", mode=mode, interval=delta, max_lifetime=s, start=tau, G=G, E=E,
                       partitioning=partitioning, seed=seed)
    lay, tm = cfg.layout_obj, cfg.time
    j = 0 if bulk else int(rng.integers(1, 30))
    T = tm.time_of(j)
    n = int(rng.integers(0, 200))
    ts = rng.integers(T - s + 1, T + 1, n)
    exp = ts + rng.integers(1, s + 1, n)
    key = rng.integers(-3, 3, n)
    plan = plan_update(cfg, None if bulk else j - 1, j, _table(key, ts, exp))
    live = exp > T
    assert plan.dropped == int((~live).sum()) and plan.rows.num_rows == int(live.sum()) and plan.input_rows == n
    k_ins = tm.slots(ts[live]) if bulk else np.full(int(live.sum()), j)
    want_sub = lay.subindex_of(k_ins, tm.slots(exp[live]))
    sub_of_row = np.repeat(np.arange(lay.n), np.diff(plan.cuts))
    # the same multiset of (sub-index, key, ts, exp, insertion slot)
    want = sorted(zip(want_sub.tolist(), key[live].tolist(), ts[live].tolist(), exp[live].tolist(), k_ins.tolist()))
    r = plan.rows
    got_rows = list(zip(sub_of_row.tolist(), r.column("key").to_pylist(), r.column("ts").to_pylist(),
                        r.column("exp").to_pylist(), r.column(INS_SLOT).to_pylist()))
    assert sorted(got_rows) == want
    # in the order maintenance writes: (sub-index, [expiration slot,] key, exp)
    order_key = [(g, int(tm.slots(np.array([e]))[0]) if mode == "norebuild" else 0, k, e) for g, k, _, e, _ in got_rows]
    assert order_key == sorted(order_key)
    assert (plan.exp_slots == tm.slots(np.array(r.column("exp").to_pylist(), dtype=np.int64))).all()
    # every record goes where this update may insert
    assert set(sub_of_row.tolist()) <= set(plan.planned_insert)
