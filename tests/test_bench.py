"""`ebb bench quick` end to end (every technique and every peer on a tiny workload), plus the
pieces it is built from: configuration names, the workload generator and its oracle, the plan.

The end-to-end test asserts that results are produced and sane (rows for every configuration,
every probe and scan equal to the brute-force oracle for ebb and for every peer, G + E - 1
sub-indices per doubly partitioned update, figures written), never timings.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ebb.tools import configs
from ebb.tools.plan import Plan
from ebb.tools.workloads import WORKLOADS

pytest.importorskip("duckdb")
pytest.importorskip("rocksdict")
pytest.importorskip("matplotlib")


def test_config_names():
    c = configs.parse("NoRebuild2x8-chr")
    assert (c.family, c.mode, c.partitioning, c.G, c.E, c.n, c.technique) == ("doubly", "norebuild", "chronological", 2, 8, 16, "NoRebuild-chr")
    w = configs.parse("D-exp25")
    assert (w.family, w.mode, w.split, w.n, w.technique) == ("wave", "norebuild", "expiration", 25, "D-exp")
    assert configs.parse("rocksdb").family == "peer"
    for bad in ("R-ins40", "Rebuild4x", "mysql"):
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


def test_plan_schedule():
    p = Plan.create("thesis-small", ["Rebuild2x2"], Path("/nonexistent"), updates=12, scan_every=2, cold_every=3)
    assert p.scan_slots == [2, 4, 6, 8, 10, 12]
    assert len(p.cold_slots) == 2 and set(p.cold_slots) <= set(p.scan_slots)
    assert p.ops_per_config() == 1 + 12 + 12 + 6 + 2 + 2


def test_bench_quick_end_to_end(tmp_path):
    out = tmp_path / "quick"
    proc = subprocess.run([sys.executable, "-m", "ebb.query.cli", "bench", "quick", "--out", str(out), "--no-progress"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    names = configs.default_configs("quick")
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
        c = configs.parse(name)
        if c.family == "doubly":
            # every periodic update touches exactly G + E - 1 sub-indices (SPEC section 3)
            assert (upd.subindices == c.G + c.E - 1).all(), (name, upd.subindices.tolist())
        elif c.family == "wave":
            assert (upd.subindices == c.n).all(), (name, upd.subindices.tolist())  # the wave index's weakness
    # every store returned the same records at every probe and scan
    reads = ops[ops.op.isin(["probe", "scan"])]
    for (slot, op, cache), g in reads.groupby(["slot", "op", "cache"]):
        assert g.rows.nunique() == 1 and g.seq_sum.nunique() == 1, (slot, op, cache)
    # cold rows exist when the cache can be dropped
    machine = json.loads((out / "machine.json").read_text())
    if machine["cold_cache_problem"] is None:
        assert (ops.cache == "cold").any()
        assert machine["disk"]["seq_read_Bps"] > 0 and machine["disk"]["seq_write_Bps"] > 0
    for fig in ("fig4_4", "fig4_5", "fig4_6", "fig4_7", "peers-quick", "io-amplification-quick"):
        assert (out / f"{fig}.png").stat().st_size > 1000, fig
        assert len(pd.read_csv(out / f"{fig}.csv")) > 0, fig
    assert not os.listdir(out / "stores")  # stores are removed after each configuration


def test_bench_report_renders(tmp_path):
    """The docs generator turns a summary into benchmarks.md with every claim section."""
    from ebb.tools import report

    rows = []
    for name in configs.default_configs("thesis-small"):
        c = configs.parse(name)
        sub = c.G + c.E - 1 if c.family == "doubly" else c.n
        rows.append({"workload": "thesis-small", "config": name, "family": c.family, "technique": c.technique,
                     "mode": c.mode, "n": c.n, "G": c.G, "E": c.E, "update_s": 1.0 + 0.1 * sub, "update_cold_s": 2.0,
                     "probe_s": 0.01 * (1 + c.n / 10), "probe_cold_s": 0.05, "scan_s": 1.0, "scan_cold_s": 2.0, "bulk_s": 5.0,
                     "update_subindices": sub, "write_amp_os": 3.0, "write_amp_store": 2.5, "scan_read_amp_cold": 1.1,
                     "probe_read_amp_cold": 20.0, "disk_bytes": 5e8, "peak_rss_update": 1e9, "peak_rss_scan": 1e9,
                     "update_os_write_bytes": 1e8, "scan_GBps": 1.0, "scan_cold_GBps": 0.5, "space_amp": 1.05,
                     "probe_buckets": 16, "correct": True})
    from ebb.tools.results import SUMMARY_COLUMNS

    small = pd.DataFrame(rows, columns=SUMMARY_COLUMNS)  # columns not set above are NaN
    text = report.render({"thesis-small": small}, {"thesis-small": {"disk": {"seq_read_Bps": 1e9, "seq_write_Bps": 1e9,
                                                                             "method": "O_DIRECT", "bytes": 1 << 30}}}, tmp_path)
    for heading in ("Doubly partitioned indices update", "Round-robin is 10-20%", "Rebuild4x4 is about 20%",
                    "two orders of magnitude", "NoRebuild is faster to update", "ebb against its peers", "Physical limits"):
        assert heading in text, heading
    assert "Held." in text
