"""`ebb bench quick` end to end (every technique and every peer on a tiny workload), plus the
pieces it is built from: configuration names, the workload generator and its oracle, the plan.

The end-to-end test asserts that results are produced and sane (rows for every configuration,
every probe and scan equal to the brute-force oracle for ebb and for every peer, G + E - 1
sub-indices per doubly partitioned update, block counts and peak anonymous memory recorded,
figures written), never timings. The report tests check the headline and acceptance tables
against summaries built to meet or miss each target. The periodic workload's tests check its
rate, where round-robin puts its bursts, the sub-index sizes ebb reports, and its report section.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ebb.tools import configs
from ebb.tools.measure import measure, measure_short, open_handles
from ebb.tools.plan import Plan
from ebb.tools.workloads import WORKLOADS

pytest.importorskip("duckdb")
pytest.importorskip("rocksdict")
pytest.importorskip("matplotlib")


def test_config_names():
    from dataclasses import replace

    from ebb.storage.config import DEFAULT_BLOCK_BYTES
    from ebb.tools.ebb_store import archive_config

    c = configs.parse("NoRebuild2x8-chr")
    assert (c.family, c.mode, c.partitioning, c.G, c.E, c.n, c.technique) == ("doubly", "norebuild", "chronological", 2, 8, 16, "NoRebuild-chr")
    w = configs.parse("D-exp25")
    assert (w.family, w.mode, w.split, w.n, w.technique) == ("wave", "norebuild", "expiration", 25, "D-exp")
    assert configs.parse("rocksdb").family == "peer"
    b = configs.parse("Rebuild2x2-chr-b128k")  # a block size: the layout's archive is made with it
    assert (b.G, b.partitioning, b.block_kib, b.technique) == (2, "chronological", 128, "Rebuild-chr-b128k")
    assert configs.parse("D-ins4-b64k").technique == "D-ins-b64k" and configs.parse("D-ins4").block_kib == 0
    wide = configs.parse("D-ins4-s2-b64k")  # sections of 2 expiration slots (ebb init --section-slots)
    assert (wide.section_slots, wide.block_kib, wide.technique) == (2, 64, "D-ins-s2-b64k")
    assert configs.parse("NoRebuild4x1-s3").section_slots == 3 and configs.parse("D-ins4").section_slots == 1
    tiny = replace(WORKLOADS["many-keys"], per_slot=100)
    assert archive_config(b, tiny).block_bytes == 128 << 10
    assert archive_config(configs.parse("Rebuild2x2"), tiny).block_bytes == DEFAULT_BLOCK_BYTES
    assert archive_config(wide, tiny).section_slots == 2
    for bad in ("R-ins4-s2", "NoRebuild2x2-s2", "D-exp4-s2", "D-ins4-s0", "R-ins40", "Rebuild4x", "mysql", "sqlite-b64k", "Rebuild2x2-b0k", "Rebuild2x2-b" + "9" * 6 + "k"):
        with pytest.raises(ValueError):
            configs.parse(bad)
    small = configs.default_configs("thesis-small")
    assert len([n for n in small if n.startswith(("R-", "D-"))]) == 16  # R/D x ins/exp x n = 4, 9, 16, 25
    assert len([n for n in small if n.startswith(("Rebuild", "NoRebuild"))]) == 24  # x rr/chr x 2x2..5x5, 2x8, 8x2
    assert set(configs.PEERS) <= set(small)


def test_workload_is_deterministic_and_oracle_matches_batches():
    w = WORKLOADS["quick"].with_updates(3)
    a, b = list(w.batches()), list(w.batches())
    for (j1, t1, x), (j2, t2, y) in zip(a, b):
        assert (j1, t1) == (j2, t2) and x.equals(y)
    bulk = a[0][2]
    assert bulk.column("exp").to_numpy().min() > 0  # only records valid at tau
    seqs = np.concatenate([t.column("seq").to_numpy() for _, _, t in a])
    assert len(np.unique(seqs)) == len(seqs)  # seq is a unique id
    assert all(len(p) == w.payload_bytes for p in bulk.column("payload").to_pylist()[:10])
    # replay SPEC section 2 over the batches and compare with the oracle
    live = pd.concat([t.select(["key", "ts", "exp", "seq"]).to_pandas() for _, _, t in a[:1]])
    oracle = w.oracle()
    for j, at, t in a[1:]:
        live = live[live.exp > at]
        live = pd.concat([live, t.select(["key", "ts", "exp", "seq"]).to_pandas()])
        valid = live[(live.ts <= at) & (live.exp > at)]
        probe = valid[valid.key == w.probe_key(j)]
        assert oracle[j] == {"scan_rows": len(valid), "scan_seq": int(valid.seq.sum()),
                             "probe_rows": len(probe), "probe_seq": int(probe.seq.sum())}


def test_fluctuating_rate_varies_within_factor_four():
    w = WORKLOADS["fluctuating"]
    f = w.rate_factors()
    for part in (f[: w.p], f[w.p:]):  # the bulk load's slots, the updates' slots
        assert 2.0 < part.max() / part.min() <= 4.0 + 1e-9
        assert abs(part.mean() - 1.0) < 1e-9  # the same volume as the steady workload


def test_same_batch_larger_archive_workload():
    small, big = WORKLOADS["thesis-small"], WORKLOADS["thesis-large-smallbatch"]
    assert big.per_slot == small.per_slot and big.record_bytes == small.record_bytes  # the same batch
    assert 9.5 < big.expected_live_bytes / small.expected_live_bytes < 10.5  # an archive 10x larger
    assert WORKLOADS["thesis-large"].per_slot == 10 * small.per_slot  # which thesis-large's batch is not
    assert set(configs.default_configs("thesis-large-smallbatch")) <= set(configs.default_configs("thesis-small"))


def test_periodic_rate_has_period_g_and_round_robin_sends_bursts_to_one_row():
    """Thesis 4.3.3's worst case: the rate repeats every G slots, so round-robin puts every burst
    into one row of the G x E index (docs/spec.md section 3), where chronological and random
    allocation spread the bursts over several rows."""
    from dataclasses import replace

    from ebb.tools.ebb_store import archive_config

    w = WORKLOADS["periodic"]
    g = w.period
    names = configs.default_configs("periodic")
    assert sorted(names) == sorted(f"{m}4x4{s}" for m in ("Rebuild", "NoRebuild") for s in ("", "-chr", "-rand"))
    assert all(configs.parse(n).G == g for n in names)
    small = WORKLOADS["thesis-small"]
    assert (w.per_slot, w.record_bytes, w.keys, w.p) == (small.per_slot, small.record_bytes, small.keys, small.p)
    f = w.rate_factors()
    assert np.allclose(f[g:], f[:-g])  # period G ...
    assert not any(np.allclose(f[d:], f[:-d]) for d in range(1, g))  # ... and no shorter one
    assert np.allclose(f.reshape(-1, g).mean(axis=1), 1.0)  # thesis-small's volume over every period
    assert f.max() / f.min() == pytest.approx(w.fluctuation)

    # the records themselves, on a small copy: insertion slot slot(ts) in the bulk load, j in update j
    tiny = replace(w, per_slot=2000, record_bytes=64, updates=8)
    tables = list(tiny.batches())
    sizes = np.array([t.num_rows for _, _, t in tables[1:]])
    burst = tiny.bursts(np.arange(1, 9))
    assert burst.tolist() == [True, False, False, False] * 2
    assert sizes[burst].min() > 3 * sizes[~burst].max()  # 4x the rate, less the records already expired
    rows_of_bursts = {}
    for name in ("Rebuild4x4", "Rebuild4x4-chr", "Rebuild4x4-rand"):
        cfg = archive_config(configs.parse(name), tiny)
        layout, tm = cfg.layout_obj, cfg.time
        k_ins = np.concatenate([tm.slots(tables[0][2].column("ts").to_numpy())]
                               + [np.full(t.num_rows, j) for j, _, t in tables[1:]])
        k_exp = np.concatenate([tm.slots(t.column("exp").to_numpy()) for _, _, t in tables])
        row = layout.subindex_of(k_ins, k_exp) // layout.E
        in_burst = tiny.bursts(k_ins)
        rows_of_bursts[name] = set(np.unique(row[in_burst]).tolist())
        if name == "Rebuild4x4":
            assert rows_of_bursts[name] == {0}, rows_of_bursts  # every burst record in row 1
            assert (row[~in_burst] != 0).all()  # and nothing else there
    assert len(rows_of_bursts["Rebuild4x4-chr"]) > 1 and len(rows_of_bursts["Rebuild4x4-rand"]) > 1, rows_of_bursts


def test_subindex_balance_is_what_the_archive_holds(tmp_path):
    """The largest and mean sub-index ebb reports after each update are those of the live
    records, which the report also computes from the generated records alone."""
    from dataclasses import replace

    from ebb.tools.ebb_store import EbbStore
    from ebb.tools.peers import make_peer
    from ebb.tools.report import imbalance

    w = replace(WORKLOADS["periodic"], per_slot=500, record_bytes=64, updates=4)
    for name in ("Rebuild4x4", "NoRebuild4x4-rand"):
        st = EbbStore(str(tmp_path / name), w, configs.parse(name))
        os.makedirs(st.path)
        st.create()
        ratios = []
        for j, at, batch in w.batches():
            st.load(batch, at)
            b = st.subindex_balance()
            ratios.append(b["subidx_max_rows"] / b["subidx_mean_rows"])
        st.close()
        assert max(ratios[1:]) == pytest.approx(imbalance(configs.parse(name), w)), name  # after the periodic updates
    assert make_peer("sqlite", str(tmp_path / "sqlite"), w).subindex_balance() == {}


def test_peak_anon_counts_heap_not_mapped_files(tmp_path):
    import mmap
    import time

    def heap():  # 100 MB touched, held for a few sampling intervals, freed before the operation ends
        a = np.ones(100_000_000 // 8)
        time.sleep(0.05)
        del a

    _, s = measure(heap)
    assert s.peak_anon_bytes - s.base_anon_bytes > 90_000_000
    f = tmp_path / "f"
    f.write_bytes(os.urandom(64 << 20))

    def mapped():  # 64 MB of file pages resident in the map: RSS, not anonymous memory
        with open(f, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as m:
            sum(m[i] for i in range(0, len(m), 4096))
            time.sleep(0.05)

    _, s = measure(mapped)
    assert s.peak_anon_bytes - s.base_anon_bytes < 16 << 20


def test_measure_short_times_the_call_alone():
    """A warm probe's time is of one plain call; its memory and I/O come from a second call
    through ``measure`` (whose time is not the one reported)."""
    import time

    calls = []

    def op():
        calls.append(1)
        time.sleep(0.01 if len(calls) == 1 else 0.2)
        return len(calls)

    out, s = measure_short(op)
    assert out == 1 and len(calls) == 2  # the first call's result; the second ran through measure
    assert 0.01 <= s.wall_s < 0.2, s.wall_s
    assert s.base_anon_bytes > 0 and s.peak_anon_bytes >= s.base_anon_bytes


def test_latency_probes_pause_between_stretches_outside_the_timed_span(monkeypatch):
    """``time_probes`` with a stretch pauses after every ``stretch`` probes, then probes the key
    before again, untimed and not counted; no pause is inside a probe's time: the spread that keeps
    one slow episode of the machine off one store's probes, without timing after-idle probes."""
    from ebb.tools import run_config
    from ebb.tools.store import ReadResult

    events = []

    class Store:
        def probe(self, key, at):
            events.append(("probe", key))
            return ReadResult(1, key, {})

    monkeypatch.setattr(run_config.time, "sleep", lambda s: events.append(("sleep", s)))
    times, rows, seq = run_config.time_probes(Store(), [1, 2, 3, 4, 5], 0, stretch=2, gap_s=0.5)
    assert events == [("probe", 1), ("probe", 2), ("sleep", 0.5), ("probe", 2), ("probe", 3), ("probe", 4),
                      ("sleep", 0.5), ("probe", 4), ("probe", 5)]
    assert len(times) == 5 and rows == 5 and seq == 15
    events.clear()
    run_config.time_probes(Store(), [1, 2, 3], 0)  # no stretch: no pause
    assert [e for e in events if e[0] == "sleep"] == []


def test_closed_stores_hold_no_files(tmp_path):
    """A cold measurement closes the store first: ebb's archive (LMDB and its open run files) and
    the LMDB peer must then hold nothing open or mapped; a store that does is refused."""
    from ebb.tools.ebb_store import EbbStore
    from ebb.tools.peers import make_peer
    from ebb.tools.run_config import HANDLE_GRACE_S, go_cold

    w = WORKLOADS["quick"].with_updates(1)
    stores = [EbbStore(str(tmp_path / "ebb"), w, configs.parse("NoRebuild2x2")), make_peer("lmdb", str(tmp_path / "lmdb"), w)]
    for st in stores:
        os.makedirs(st.path)
        st.create()
        for j, at, batch in w.batches():
            st.load(batch, at)
        st.probe(w.probe_key(1), w.time_of(1))
        st.scan(w.time_of(1))
        keys = w.random_keys(20, 1, unique=True)
        single = [st.probe(k, w.time_of(1)) for k in keys.tolist()]
        batch = st.probe_many(keys, w.time_of(1))  # ebb's ArchiveReader.probe_many, the peer's loop
        assert (batch.rows, batch.seq_sum) == (sum(r.rows for r in single), sum(r.seq_sum for r in single)), st.name
        assert batch.rows > 0
        if st.name == "NoRebuild2x2":  # the reader is an archive of its own, not the writer's
            assert st.reader.archive is not st.archive and st.reader.archive.path == st.archive.path
        assert open_handles(st.path), st.name  # open while in use, so the check sees something
        st.close()
        # as go_cold allows: the last maps may go a moment later (a busy machine's CI saw it once)
        deadline = time.monotonic() + HANDLE_GRACE_S
        while open_handles(st.path) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert open_handles(st.path) == [], st.name

    class Leaky(type(stores[1])):
        def close(self):
            pass  # keeps the LMDB environment mapped

    leaky = Leaky(str(tmp_path / "lmdb"), w)
    leaky.open()
    with pytest.raises(RuntimeError, match="still open after close"):
        go_cold(leaky, leaky.path)
    leaky.env.close()

    # pyarrow's dataset scanner closes files on its I/O threads just after the last batch; the
    # cold step waits for that instead of failing (it did, now and then, before it waited).
    pq = make_peer("parquet", str(tmp_path / "parquet"), w)
    os.makedirs(pq.path)
    pq.create()
    for j, at, batch in w.batches():
        pq.load(batch, at)
    for _ in range(10):
        pq.scan(w.time_of(1))
        go_cold(pq, pq.path)


def test_plan_schedule():
    p = Plan.create("thesis-small", ["Rebuild2x2"], Path("/nonexistent"), updates=12, scan_every=2, cold_every=3)
    assert p.scan_slots == [2, 4, 6, 8, 10, 12]
    assert len(p.cold_slots) == 2 and set(p.cold_slots) <= set(p.scan_slots)
    assert p.ops_per_config() == 1 + 12 + 12 + 6 + 2 + 2


# a subset of the quick workload's default set, one process each: both wave families (R by
# insertion, D by expiration), Rebuild and NoRebuild, each doubly partitioning (round-robin,
# chronological, random), Figure 4.4's 4x4/2x8/8x2 and every peer
QUICK_CONFIGS = ["R-ins4", "D-exp4", "Rebuild4x4", "Rebuild2x8", "Rebuild8x2", "NoRebuild3x3", "Rebuild2x2-chr",
                 "NoRebuild2x2-rand", "sqlite", "duckdb", "lmdb", "rocksdb", "parquet"]


def test_bench_quick_end_to_end(tmp_path):
    out = tmp_path / "quick"
    proc = subprocess.run([sys.executable, "-m", "ebb.tools.cli", "bench", "quick", "--out", str(out), "--no-progress",
                           "--configs", ",".join(QUICK_CONFIGS)], capture_output=True, text=True, timeout=600)
    logs = "".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in out.glob("failed-*.log"))
    assert proc.returncode == 0, proc.stderr[-3000:] + logs
    names = QUICK_CONFIGS
    assert set(names) <= set(configs.default_configs("quick"))
    summary = pd.read_csv(out / "summary.csv")
    assert sorted(summary.config) == sorted(names)
    assert summary.correct.all(), summary[~summary.correct][["config"]]
    ops = pd.read_csv(out / "ops.csv")
    plan = json.loads((out / "plan.json").read_text())
    for name in names:
        d = ops[ops.config == name]
        assert (d.op == "bulk").sum() == 1
        assert (d[d.op == "update"].slot.tolist()) == list(range(1, plan["updates"] + 1)), name
        assert (d[(d.op == "probe") & (d.cache == "warm")]).shape[0] == plan["updates"]
        assert (d[(d.op == "scan") & (d.cache == "warm")]).shape[0] == len(plan["scan_slots"])
        assert (d.wall_s > 0).all()
        upd = d[d.op == "update"]
        assert (upd.disk_bytes > 0).all()
        assert (d.peak_anon_bytes >= d.base_anon_bytes).all() and (d.base_anon_bytes > 0).all(), name
        c = configs.parse(name)
        loads = d[d.op.isin(["bulk", "update"])]
        if c.family == "peer":
            assert loads.subidx_max_rows.isna().all() and loads.subidx_mean_rows.isna().all(), name
        else:  # the largest and mean sub-index after every load: a sub-index holds at most all records
            assert (loads.subidx_mean_rows > 0).all() and (loads.subidx_max_rows >= loads.subidx_mean_rows).all(), name
            assert (loads.subidx_max_rows <= loads.subidx_mean_rows * c.n + 1e-6).all(), name
        if c.family == "doubly":
            # every periodic update touches exactly G + E - 1 sub-indices (SPEC section 3)
            assert (upd.subindices == c.G + c.E - 1).all(), (name, upd.subindices.tolist())
            assert (upd.blocks_written > 0).all() and (d[d.op == "scan"].blocks_read > 0).all(), name
            assert (d[d.op == "probe"].block_bytes > 0).all(), name  # for the cold probe's allowance
        elif c.family == "wave":
            assert (upd.subindices == c.n).all(), (name, upd.subindices.tolist())  # the wave index's weakness
    # every store returned the same records at every probe and scan
    reads = ops[ops.op.isin(["probe", "scan"])]
    for (slot, op, cache), g in reads.groupby(["slot", "op", "cache"]):
        assert g.rows.nunique() == 1 and g.seq_sum.nunique() == 1, (slot, op, cache)
    # library-level probe latency after the last update: one row per store, plain-timed probes,
    # every answer right (the brute-force oracle of the keys it probed)
    from ebb.tools.report import _workload_table, with_latency
    from ebb.tools.run_config import LATENCY_PROBES, LATENCY_STREAM, QUICK_LATENCY_PROBES

    w = WORKLOADS["quick"].with_updates(plan["updates"])
    g, at = w.generated(), w.time_of(w.updates)
    live = (g["ts"] <= at) & (g["exp"] > at)
    count = np.bincount(g["key"][live], minlength=w.keys)
    seq = np.bincount(g["key"][live], weights=g["seq"][live], minlength=w.keys)
    lat = ops[ops.op == "probe_latency"]
    assert sorted(lat.config) == sorted(names)
    for _, r in lat.iterrows():
        assert r.slot == plan["updates"] and r.cache == "warm", r.config
        assert r.probes == QUICK_LATENCY_PROBES, r.config  # the quick run's count (real runs: 1,000 to 2,000)
        assert 0 < r.p50_s <= r.p99_s and r.wall_s > 0, r.config
        keys = w.random_keys(LATENCY_PROBES, LATENCY_STREAM)[:int(r.probes)]
        assert (r.rows, r.seq_sum) == (count[keys].sum(), round(seq[keys].sum())), r.config
    with_lat = with_latency(summary, ops)
    assert (with_lat.probe_p50_s > 0).all() and (with_lat.probe_p50_s <= with_lat.probe_p99_s).all()
    assert "| probe p50 µs | probe p99 µs |" in _workload_table(with_lat)
    # cold rows exist when the cache can be dropped
    machine = json.loads((out / "machine.json").read_text())
    if machine["cold_cache_problem"] is None:
        assert (ops.cache == "cold").any()
        ebb = summary[summary.family != "peer"]
        assert (ebb.probe_cold_read_allowance_bytes > 0).all() and ebb.probe_cold_read_vs_allowance.notna().all()
        assert machine["disk"]["seq_read_Bps"] > 0 and machine["disk"]["seq_write_Bps"] > 0
    for fig in ("fig4_4", "fig4_5", "fig4_6", "fig4_7", "peers-quick", "io-amplification-quick"):
        assert (out / f"{fig}.png").stat().st_size > 1000, fig
        assert len(pd.read_csv(out / f"{fig}.csv")) > 0, fig
    assert not os.listdir(out / "stores")  # stores are removed after each configuration


def _summary(workload: str, names: list[str], **override) -> pd.DataFrame:
    """A made-up summary: ebb's doubly layouts beat every peer by 2x, amplification within the
    targets; ``override`` maps a column to {config: value} to change single cells."""
    from ebb.tools.results import SUMMARY_COLUMNS

    rows = []
    for name in names:
        c = configs.parse(name)
        sub = c.G + c.E - 1 if c.family == "doubly" else c.n
        k = 2.0 if c.family == "peer" else 1.0
        rows.append({"workload": workload, "config": name, "family": c.family, "technique": c.technique,
                     "mode": c.mode, "n": c.n, "G": c.G, "E": c.E, "update_s": k * (1.0 + 0.1 * sub), "update_cold_s": 2.0 * k,
                     "probe_s": k * 0.01 * (1 + c.n / 10), "probe_cold_s": 0.05 * k, "scan_s": 1.0 * k, "scan_cold_s": 2.0 * k,
                     "bulk_s": 5.0, "update_subindices": sub, "write_amp_os": 1.2, "write_amp_store": 1.1,
                     "scan_read_amp_cold": 1.1, "probe_read_amp_cold": 20.0, "probe_cold_os_read_bytes": 2e6,
                     "probe_cold_bytes_returned": 1e6, "probe_cold_subindices": 4, "block_bytes": {"rebuild": 512 << 10, "norebuild": 64 << 10}.get(c.mode, np.nan),
                     "probe_cold_read_allowance_bytes": 4e6, "probe_cold_read_vs_allowance": 0.5, "disk_bytes": 5e8,
                     "peak_anon_update": 2e8, "anon_growth_update": 5e7, "peak_anon_scan": 1e8,
                     "update_os_write_bytes": 1e8, "scan_GBps": 1.0, "scan_cold_GBps": 0.8, "space_amp": 1.05,
                     "probe_blocks": 16, "correct": True})
    df = pd.DataFrame(rows, columns=SUMMARY_COLUMNS)  # columns not set above are NaN
    for col, cells in override.items():
        for config, v in cells.items():
            df.loc[df.config == config, col] = v
    return df


DISK = {"disk": {"seq_read_Bps": 1e9, "seq_write_Bps": 1e9, "method": "O_DIRECT", "bytes": 1 << 30},
        "ebb_commit": "abc123def456", "cpu": "Test CPU", "cores": 2, "memory_bytes": 8 << 30}


def _verdicts(text: str) -> dict[tuple[str, str], str]:
    """(workload, measure) -> verdict cell of the acceptance table."""
    table = text.split("## Issue 8 acceptance targets", 1)[1].split("\n## ", 1)[0]
    rows = [r.split(" | ") for r in table.splitlines() if r.startswith("| ") and not r.startswith("| workload")]
    return {(r[0].lstrip("| "), r[1]): r[-1].rstrip(" |") for r in rows}


def test_bench_report_renders(tmp_path):
    """The docs generator turns summaries into benchmarks.md: commit and machine, a headline table
    per workload, the acceptance targets with verdicts, and every claim section."""
    from ebb.tools import report

    small = _summary("thesis-small", configs.default_configs("thesis-small"))
    text = report.render({"thesis-small": small}, {"thesis-small": DISK}, tmp_path)
    assert text.index("## Headline") < text.index("## Issue 8 acceptance") < text.index("## Protocol")
    assert "abc123def456" in text and "Test CPU" in text
    headline = text.split("### thesis-small", 1)[1].split("\n\n")[2]
    assert headline.count("\n") == 7 and "| sqlite / ebb |" in headline  # header, rule, six measures
    assert "| update (warm) | Rebuild2x2 | 1.30 | 1.54 | 1.54 |" in headline  # best doubly layout, peer time / its time
    v = _verdicts(text)
    for name in ("update", "probe", "scan", "write amplification", "space amplification", "cold scan bandwidth",
                 "cold probe bytes read", "answers"):
        assert v[("thesis-small", name)] == "met", (name, v)
    assert v[("many-keys", "probe")] == "not measured"
    assert v[("thesis-small vs thesis-large-smallbatch", "update peak anon memory")] == "not measured"
    for heading in ("Doubly partitioned indices update", "Round-robin is 10-20%", "Rebuild4x4 is about 20%",
                    "two orders of magnitude", "NoRebuild is faster to update", "Physical limits", "format version 2"):
        assert heading in text, heading
    assert "Held." in text
    for stale in ("MADV", "PAX", "Known issues", "Problems found", "bucket maps", "peak RSS MB"):
        assert stale not in text, stale


def test_machine_names_damon_pageout_and_the_report_shows_it(tmp_path):
    """A DAMON scheme that pages out idle memory is recorded with its age, filters and quota (in
    a fake sysfs tree built like the kernel's); a stopped kdamond or another action is not."""
    from ebb.tools import report
    from ebb.tools.machine import page_reclaim

    def kdamond(i: int, state: str, action: str) -> None:
        ctx = tmp_path / str(i) / "contexts" / "0"
        files = {"../../state": state, "monitoring_attrs/intervals/aggr_us": "5000000",
                 "schemes/0/action": action, "schemes/0/access_pattern/age/min": "12",
                 "schemes/0/quotas/bytes": str(128 << 20), "schemes/0/quotas/reset_interval_ms": "1000",
                 "schemes/0/ops_filters/0/type": "anon", "schemes/0/ops_filters/0/allow": "N",
                 "schemes/0/ops_filters/1/type": "unmapped", "schemes/0/ops_filters/1/allow": "Y"}
        for rel, text in files.items():
            f = (ctx / rel).resolve() if rel.startswith("..") else ctx / rel
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(text + "\n")

    assert page_reclaim(str(tmp_path)) is None
    kdamond(0, "off", "pageout")
    kdamond(1, "on", "stat")
    assert page_reclaim(str(tmp_path)) is None
    kdamond(2, "on", "pageout")
    got = page_reclaim(str(tmp_path))
    assert got == ("DAMON pageout of memory idle for 60 s or more (not anon pages, only unmapped pages), "
                   "at most 128 MiB per 1 s"), got
    text = report.render({"thesis-small": _summary("thesis-small", configs.default_configs("thesis-small"))},
                         {"thesis-small": {**DISK, "page_reclaim": got}}, tmp_path / "out")
    assert "Proactive reclaim by the kernel: DAMON pageout of memory idle for 60 s" in text


def test_report_shows_library_level_probe_latency(tmp_path):
    """The run's probe_latency rows become the summary's latency columns, shown in the workload's
    table and in a section of their own with each store's ratio to SQLite's."""
    from ebb.tools import report

    names = ["Rebuild2x2", "NoRebuild2x2", "sqlite", "lmdb"]
    ops = pd.DataFrame([{"config": n, "op": "probe_latency", "wall_s": 2e-5 * (i + 1), "p50_s": 1e-5 * (i + 1),
                         "p99_s": 4e-5 * (i + 1), "probes": 2000} for i, n in enumerate(names)])
    s = report.with_latency(_summary("thesis-small", names), ops)
    assert s.probe_p50_s.tolist() == pytest.approx([1e-5, 2e-5, 3e-5, 4e-5])
    text = report.render({"thesis-small": s}, {"thesis-small": DISK}, tmp_path)
    table = text.split("## thesis-small:", 1)[1]
    assert "| probe p50 µs | probe p99 µs |" in table and "| Rebuild2x2 | 1.30 | 2.00 | 0.014 | 0.05 | 10.0 | 40.0 |" in table
    section = text.split("### Library-level probe latency", 1)[1].split("\n## ", 1)[0]
    assert "| Rebuild2x2 | 2,000 | 10.0 | 40.0 | 20.0 | 0.333 | 0.333 |" in section
    assert "| sqlite | 2,000 | 30.0 | 120 | 60.0 | 1.00 | 1.00 |" in section
    # a summary from before the latency rows: dashes, and no section
    old = report.with_latency(_summary("thesis-small", names), pd.DataFrame())
    text = report.render({"thesis-small": old}, {"thesis-small": DISK}, tmp_path)
    assert "### Library-level probe latency" not in text and "| Rebuild2x2 | 1.30 | 2.00 | 0.014 | 0.05 | - | - |" in text


def test_one_layout_section_names_each_measure_it_loses(tmp_path):
    """A run published with --one-layout lands in docs/benchmarks/one-layout/, leaves the
    workload's own summary alone, and the section gives the named layout's figure against the
    fastest peer per measure, saying which measures it is behind on and by how much."""
    from ebb.tools import report
    from ebb.tools.plan import Plan

    names = ["D-ins4", "NoRebuild2x2", "sqlite", "lmdb"]
    out = tmp_path / "run"
    out.mkdir()
    (out / "machine.json").write_text(json.dumps(DISK))
    ops = pd.DataFrame([{"config": n, "op": "probe_latency", "wall_s": 3e-5, "p50_s": 1e-5 * (i + 1),
                         "p99_s": 4e-5, "probes": 2000} for i, n in enumerate(names)])
    ops.to_csv(out / "ops.csv", index=False)
    # D-ins4 (the made-up summary's ebb layouts are 2x faster than the peers) loses one measure:
    # its cold probe takes 5x lmdb's
    s = _summary("many-keys", names, probe_cold_s={"D-ins4": 0.3, "lmdb": 0.06})
    plan = Plan.create("many-keys", names, out, updates=4, scan_every=1, cold_every=2)
    docs = tmp_path / "docs"
    report.publish(plan, s, docs, one_layout="D-ins4")
    d = docs / "benchmarks" / "one-layout"
    assert sorted(p.name for p in d.iterdir()) == ["machine-many-keys.json", "plan-many-keys.json", "summary-many-keys.csv"]
    assert not (docs / "benchmarks" / "summary-many-keys.csv").exists()
    text = (docs / "benchmarks.md").read_text()
    section = text.split("## One layout against every peer", 1)[1].split("\n## ", 1)[0]
    assert "### many-keys: D-ins4" in section and "abc123def456" in section
    assert "| probe (cold) | 0.3 | lmdb 0.06 | 5.00 | **behind** |" in section
    assert "| update (warm) | 1.40 | sqlite 2.00 | 0.7 | ahead |" in section
    assert "| probe p50 | 10.0 | sqlite 30.0 | 0.333 | ahead |" in section
    assert "D-ins4 is behind on: probe (cold) 5.00x lmdb." in section
    assert "Also run (in the workload table's columns): NoRebuild2x2." in section
    # no measure lost: said so
    report.publish(plan, _summary("many-keys", names), docs, one_layout="D-ins4")
    assert "D-ins4 is at or ahead of every peer on every measure." in (docs / "benchmarks.md").read_text()
    assert "D-ins4 at the library level" not in (docs / "benchmarks.md").read_text()  # no library run published
    # with a published library run that measured D-ins4, its figures against the fastest peer's
    # there (int64 peers only; a string-key variant is not a peer), under the layout's tables
    lib = docs / "benchmarks" / "library"
    lib.mkdir()
    fields = ("update_median_s", "probe_p50_s", "probe_p99_s", "cold_p50_s", "batch_per_key_s", "scan_s")

    def store(config, keys, *values):
        return {"config": config, "keys": keys, **dict(zip(fields, values))}

    (lib / "library.json").write_text(json.dumps({"ebb_commit": "fedcba987654", "stores": {
        "D-ins4": store("D-ins4", "int64", 0.08, 29e-6, 170e-6, 780e-6, 7e-6, 0.06),
        "Rebuild2x2": store("Rebuild2x2", "int64", 0.01, 1e-6, 1e-6, 1e-6, 1e-6, 0.01),
        "sqlite": store("sqlite", "int64", 2.0, 30e-6, 150e-6, 900e-6, 4.6e-6, 2.0),
        "rocksdb": store("rocksdb", "int64", 0.6, 50e-6, 150e-6, 730e-6, 67e-6, 1.0),
        "D-ins4-str": store("D-ins4-str", "string", 0.001, 1e-6, 1e-6, 1e-6, 1e-6, 0.001)}}))
    report.rewrite(docs)
    section = (docs / "benchmarks.md").read_text().split("### D-ins4 at the library level", 1)[1].split("\n## ", 1)[0]
    assert "fedcba987654" in section
    assert "| update | 0.08 | rocksdb 0.6 | 0.133 | ahead |" in section
    assert "| probe p50 | 29.0 | sqlite 30.0 | 0.967 | ahead |" in section
    assert "| probe p99 | 170 | sqlite 150 | 1.13 | **behind** |" in section
    assert "| probe cold p50 | 780 | rocksdb 730 | 1.07 | **behind** |" in section
    assert "| batch probe per key | 7.00 | sqlite 4.60 | 1.52 | **behind** |" in section
    assert "| scan | 0.06 | rocksdb 1.00 | 0.06 | ahead |" in section
    assert "first probe after each commit" not in (docs / "benchmarks.md").read_text()  # no first_probe run published
    # with a published first_probe run of the workload: the layout's first probe, following and
    # not, against the fastest peer's first probe (lmdb here), every store's row shown
    def fp(first, after, lag=None):
        return {"first_p50_s": first, "next_p50_s": after, **({"switch_lag_p50_s": lag} if lag else {})}

    (docs / "benchmarks" / "first-probe-many-keys.json").write_text(json.dumps({
        "workload": "many-keys", "updates": 12, "commit": "0123456789ab", "machine": DISK, "stores": {
            "D-ins4": fp(900e-6, 50e-6), "D-ins4+follow": fp(90e-6, 45e-6, 1.2e-3),
            "sqlite": fp(120e-6, 20e-6), "lmdb": fp(100e-6, 25e-6)}}))
    report.rewrite(docs)
    section = (docs / "benchmarks.md").read_text().split("### many-keys: D-ins4's first probe after each commit", 1)[1]
    section = section.split("\n## ", 1)[0]
    assert "0123456789ab" in section and "The fastest peer: lmdb." in section
    assert "| D-ins4 | 900 | 50.0 | - | 9.00 | **behind** |" in section
    assert "| D-ins4+follow | 90.0 | 45.0 | 1200 | 0.9 | ahead |" in section
    assert "| sqlite | 120 | 20.0 | - | - | - |" in section


def _periodic_run(out: Path, random_gain: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A made-up periodic run of 8 updates written to ``out``/ops.csv: round-robin's update time
    doubles on every burst slot and its largest sub-index holds 2.4x the mean; random allocation
    divides the burst penalty and the excess imbalance by ``random_gain``. Returns (summary, ops)."""
    from ebb.tools.results import load_ops, summarise
    from ebb.tools.run_config import COLUMNS

    names = configs.default_configs("periodic")
    w = WORKLOADS["periodic"].with_updates(8)
    slots = np.arange(1, 9)
    rows = []
    for name in names:
        c = configs.parse(name)
        gain = random_gain if c.partitioning == "random" else 1.0
        base = 1.0 if c.mode == "rebuild" else 0.1
        wall = base * (1 + w.bursts(slots) / gain)
        imbalance = 1 + 1.4 / gain
        rows += [{"workload": "periodic", "config": name, "family": c.family, "technique": c.technique, "mode": c.mode,
                  "n": c.n, "G": c.G, "E": c.E, "op": "update", "slot": j, "cache": "warm", "wall_s": t,
                  "data_bytes": 1e6, "os_write_bytes": 1e6, "subindices": 7, "subidx_max_rows": 1000 * imbalance,
                  "subidx_mean_rows": 1000.0} for j, t in zip(slots, wall)]
    out.mkdir()
    pd.DataFrame(rows, columns=COLUMNS).to_csv(out / "ops.csv", index=False)
    return summarise(Plan("periodic", names, out, 8)), load_ops(out)


def test_periodic_report_section(tmp_path):
    """The periodic workload's section: its own table, a figure of every update, and a conclusion
    that says whether random allocation helped, computed from the numbers; no peer or issue 8 rows."""
    from ebb.tools import plots, report

    summary, ops = _periodic_run(tmp_path / "helps", random_gain=4.0)
    assert summary.update_cv.notna().all() and (summary.update_max_s >= summary.update_s).all()
    rr = summary[summary.config == "Rebuild4x4"].iloc[0]
    assert rr.subidx_imbalance_max == pytest.approx(2.4) and rr.update_max_s == pytest.approx(2.0)
    figs = plots.draw_workload("periodic", {"periodic": summary}, tmp_path, ops=ops)
    assert figs == [tmp_path / "periodic.png"] and figs[0].stat().st_size > 1000
    series = pd.read_csv(tmp_path / "periodic.csv")
    assert len(series) == len(ops) and series.burst.sum() == 2 * len(summary)  # slots 1 and 5 of each layout
    text = report.render({"periodic": summary}, {"periodic": DISK}, tmp_path)
    section = text.split("## periodic:", 1)[1].split("\n## ", 1)[0]
    assert "### Does random allocation help?" in section and "](benchmarks/periodic.png)" in section
    assert section.count("\n| Rebuild4x4 |") == 2  # the workload's table and the allocation table
    assert "| Rebuild4x4 | round-robin | 9/0/0/0 |" in section  # every live burst in row 1
    assert "**Held.**" in section and "random allocation helps in Rebuild and NoRebuild mode, by up to 38%" in section
    assert "### periodic" not in text and all(w != "periodic" for w, _ in _verdicts(text))  # no headline, no issue 8 rows

    summary, ops = _periodic_run(tmp_path / "same", random_gain=1.0)  # random no better than round-robin
    section = report.render({"periodic": summary}, {"periodic": DISK}, tmp_path).split("## periodic:", 1)[1]
    assert "**Did not hold.**" in section and "random allocation does not help here, in Rebuild or NoRebuild mode" in section
    assert section.count("random allocation makes no measurable difference") == 2


def test_bench_report_flags_missed_targets(tmp_path):
    from ebb.tools import report

    names = ["Rebuild2x2", "NoRebuild2x2", "Rebuild4x4", "NoRebuild4x4"]
    small = _summary("thesis-small", names + list(configs.PEERS),
                     update_s={"duckdb": 0.5},  # a peer updates faster than every ebb layout (1.3 s)
                     space_amp={"NoRebuild4x4": 1.4}, probe_cold_read_vs_allowance={"NoRebuild2x2": 3.0},
                     correct={"lmdb": False})
    big = _summary("thesis-large-smallbatch", names, peak_anon_update={"Rebuild4x4": 2.3e8, "NoRebuild4x4": 2.5e8})
    text = report.render({"thesis-small": small, "thesis-large-smallbatch": big},
                         {"thesis-small": DISK, "thesis-large-smallbatch": {**DISK, "disk": {"seq_read_Bps": 2e9}}}, tmp_path)
    v = _verdicts(text)
    assert v[("thesis-small", "update")].startswith("**not met** (2.60x too slow")
    assert v[("thesis-small", "probe")] == "met" and v[("thesis-small", "scan")] == "met"
    assert v[("thesis-small", "space amplification")].startswith("**not met**")
    assert v[("thesis-small", "cold probe bytes read")] == "met"  # NoRebuild2x2 is not the best cold prober
    assert v[("thesis-small", "answers")].startswith("**not met**")
    assert v[("thesis-large-smallbatch", "cold scan bandwidth")].startswith("**not met**")  # 0.8 of 2 GB/s
    assert v[("thesis-small vs thesis-large-smallbatch", "update peak anon memory")] == "**not met** (differs by up to 25%)"
    big.loc[big.config == "NoRebuild4x4", "peak_anon_update"] = 2.2e8
    v = _verdicts(report.render({"thesis-small": small, "thesis-large-smallbatch": big}, {"thesis-small": DISK}, tmp_path))
    assert v[("thesis-small vs thesis-large-smallbatch", "update peak anon memory")] == "met"


def test_bench_migration_drains_without_writing_and_copies_the_live_data(tmp_path):
    """`ebb bench-migration` end to end on the quick workload: both clones answer alike (the
    command fails otherwise), draining writes nothing at the switch and is gone after p updates,
    copying writes every live record."""
    out = tmp_path / "mig"
    proc = subprocess.run([sys.executable, "-m", "ebb.tools.cli", "bench-migration", "--workload", "quick",
                           "--before", "2", "--from", "Rebuild2x2", "--to", "NoRebuild3x3-chr", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads((out / "migration.json").read_text())
    drain, copy = r["methods"]["drain"], r["methods"]["copy"]
    assert drain["switch"]["bytes_written"] == drain["switch"]["os_write_bytes"] == 0
    assert drain["switch"]["records_left_draining"] == copy["switch"]["records_copied"] > 0
    assert copy["switch"]["bytes_written"] > 0 and drain["draining_left"] == copy["draining_left"] == 0
    assert len(drain["updates"]) == len(copy["updates"]) == r["p"]
