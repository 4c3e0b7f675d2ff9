"""Property test: for every layout and mode (NoRebuild sections one or more slots wide), random
schedules (rates varying x4, empty intervals, lifetimes 1..S, missed slots, bursts) give exactly
the brute-force oracle's answers for scans, point probes and range probes at random valid as_of
times."""

from __future__ import annotations

import tempfile

import numpy as np
import pyarrow as pa
from hypothesis import HealthCheck, given, settings, strategies as st

from ebb.query.reader import ArchiveReader
from ebb.storage.archive import Archive
from ebb.storage.verify import verify

from support import Oracle, config, rows_multiset

LAYOUTS = [
    dict(layout="doubly", partitioning="round-robin"),
    dict(layout="doubly", partitioning="chronological"),
    dict(layout="doubly", partitioning="random"),
    dict(layout="wave", split="insertion"),
    dict(layout="wave", split="expiration"),
]


@st.composite
def scenarios(draw):
    layout = dict(draw(st.sampled_from(LAYOUTS)))
    delta = draw(st.integers(1, 4))
    p = draw(st.integers(2, 6))
    s = p * delta
    if layout["layout"] == "doubly":
        hi = p if layout["partitioning"] == "chronological" else 4
        layout.update(G=draw(st.integers(1, min(3, hi))), E=draw(st.integers(1, min(3, hi))), seed=draw(st.integers(1, 2**40)))
    else:
        layout.update(n_wave=draw(st.integers(1, p)))
    mode = draw(st.sampled_from(["rebuild", "norebuild"]))
    if mode == "norebuild" and (layout.get("split") == "insertion" or layout.get("E") == 1):
        layout.update(section_slots=draw(st.integers(1, p)))  # sections several slots wide
    block_bytes = draw(st.sampled_from([None, 256, 600, 4096]))  # tiny blocks: many per run and per key
    overlong = draw(st.booleans())
    string_keys = draw(st.booleans())
    tau = draw(st.integers(-20, 20))
    base_rate = draw(st.integers(0, 12))
    steps = draw(st.lists(st.tuples(
        st.integers(0, 2),  # missed slots before this update
        st.integers(0, 4),  # rate multiplier (0 = empty interval, up to x4)
        st.integers(0, 3),  # probes at random as_of after this update
    ), min_size=1, max_size=10))
    seed = draw(st.integers(0, 2**32 - 1))
    return dict(layout=layout, delta=delta, s=s, mode=mode, block_bytes=block_bytes, overlong=overlong,
                string_keys=string_keys, tau=tau, base_rate=base_rate, steps=steps, seed=seed)


def make_rows(rng, n, ts_lo, ts_hi, sc, tag):
    s = sc["s"]
    ts = rng.integers(ts_lo, ts_hi + 1, n)
    life = rng.integers(1, s + 1, n)
    if sc["overlong"]:
        longer = rng.random(n) < 0.2
        life[longer] = rng.integers(s + 1, 3 * s + 1, int(longer.sum()))
    keys = rng.integers(0, 6, n)
    return [
        {"key": (f"k{k}é" if sc["string_keys"] else int(k)), "ts": int(t), "exp": int(t + l), "payload": f"{tag}-{i}" if i % 3 else None}
        for i, (k, t, l) in enumerate(zip(keys, ts, life))
    ]


def check_reads(arc, oracle, t, rng, sc):
    with ArchiveReader(arc) as r:
        assert rows_multiset(r.scan_table(as_of=t)) == oracle.scan(t)
        keys = [r_["key"] for r_ in oracle.records] or [0 if not sc["string_keys"] else "k0é"]
        k = keys[int(rng.integers(0, len(keys)))]
        assert rows_multiset(r.probe(k, as_of=t)) == oracle.probe(k, t)
        a, b = sorted([keys[int(rng.integers(0, len(keys)))], keys[int(rng.integers(0, len(keys)))]])
        assert rows_multiset(r.probe_range(a, b, as_of=t)) == oracle.probe_range(a, b, t)


def bulk_loaded(sc, path):
    """The scenario's archive created at ``path`` after its bulk load: (archive, oracle, rng, schema)."""
    rng = np.random.default_rng(sc["seed"])
    ktype = pa.string() if sc["string_keys"] else pa.int64()
    schema = pa.schema([("key", ktype), ("ts", pa.int64()), ("exp", pa.int64()), ("payload", pa.string())])
    cfg = config(mode=sc["mode"], tau=sc["tau"], delta=sc["delta"], max_lifetime=sc["s"], accept_overlong=sc["overlong"],
                 block_bytes=sc["block_bytes"] or 512 << 10, **sc["layout"])
    oracle = Oracle()
    arc = Archive.create(path, cfg)
    rows = make_rows(rng, sc["base_rate"] * 3, sc["tau"] - sc["s"] + 1, sc["tau"], sc, "bulk")
    arc.load(pa.Table.from_pylist(rows, schema=schema), sc["tau"])
    oracle.load(rows, sc["tau"])
    return arc, oracle, rng, schema


def update_and_check(arc, oracle, rng, schema, sc, j, mult, probes) -> int:
    """The update of slot ``j`` (rate x ``mult``), checked against the oracle, then ``probes``
    reads at random later times. Returns the update's time."""
    T = sc["tau"] + j * sc["delta"]
    # mostly this interval's records, some late ones from earlier intervals
    rows = make_rows(rng, sc["base_rate"] * mult, T - 2 * sc["delta"] + 1, T, sc, f"u{j}")
    rec = arc.load(pa.Table.from_pylist(rows, schema=schema), T)
    oracle.load(rows, T)
    assert rec["inserted"] == sum(1 for r in rows if r["exp"] > T)
    assert rec["dropped_expired"] == sum(1 for r in rows if r["exp"] <= T)
    assert set(rec["subindices_touched"]) <= set(rec["planned_insert_into"]) | set(rec["planned_delete_from"])
    check_reads(arc, oracle, T, rng, sc)
    for _ in range(probes):
        check_reads(arc, oracle, T + int(rng.integers(0, sc["s"] + 3)), rng, sc)
    return T


@settings(max_examples=90, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_random_schedules_match_oracle(sc):
    with tempfile.TemporaryDirectory() as d:
        arc, oracle, rng, schema = bulk_loaded(sc, d + "/a")
        j = 0
        for missed, mult, probes in sc["steps"]:
            j += 1 + missed
            update_and_check(arc, oracle, rng, schema, sc, j, mult, probes)
        problems, _ = verify(arc)
        assert problems == []
        arc.close()


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios().filter(lambda sc: sc["layout"].get("section_slots", 1) > 1), st.data())
def test_wide_sections_drop_records_when_their_last_slot_is_due(sc, data):
    """With sections K slots wide, reads still equal the oracle's, and the archive stores exactly
    the records whose section (the last slot of their group of K) is not yet due: an expired
    record stays until then, never longer."""
    with tempfile.TemporaryDirectory() as d:
        arc, oracle, rng, schema = bulk_loaded(sc, d + "/a")
        cfg, stored = arc.config, list(oracle.records)
        j = 0
        for missed, mult, probes in sc["steps"]:
            j += 1 + missed
            before = oracle.records
            T = update_and_check(arc, oracle, rng, schema, sc, j, mult, probes)
            new = oracle.records[sum(1 for r in before if r["exp"] > T):]  # the oracle appends the update's rows
            stored += new
            section = cfg.section_slot(cfg.time.slots(np.array([r["exp"] for r in stored], dtype=np.int64)))
            stored = [r for r, sec in zip(stored, section) if sec > j]
            assert sum(s_["records"] for s_ in arc.stats()["subindices"]) == len(stored)
        problems, _ = verify(arc)
        assert problems == []
        arc.close()
