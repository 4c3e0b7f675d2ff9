"""`python -m ebb.tools.first_probe` end to end on the quick workload (a few seconds): the loader
and each store's reader in separate processes. Asserts the results are complete and the answers
equal across stores (ebb's and SQLite's reader each a process of its own), never timings."""

from __future__ import annotations

import json
import subprocess
import sys


def test_first_probe_tiny(tmp_path):
    out = tmp_path / "first.json"
    proc = subprocess.run([sys.executable, "-m", "ebb.tools.first_probe", "--workload", "quick", "--updates", "3",
                           "--stores", "NoRebuild2x2,NoRebuild2x2+follow,sqlite", "--dir", str(tmp_path), "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(out.read_text())
    stores = report["stores"]
    assert set(stores) == {"NoRebuild2x2", "NoRebuild2x2+follow", "sqlite"} and report["updates"] == 3
    for r in stores.values():
        assert len(r["first_s"]) == len(r["next_s"]) == len(r["rows"]) == 3
        assert all(t > 0 for t in r["first_s"] + r["next_s"])
    assert stores["NoRebuild2x2"]["rows"] == stores["NoRebuild2x2+follow"]["rows"] == stores["sqlite"]["rows"]
    # the following reader probed each commit's version, after a switch it waited for
    lags = stores["NoRebuild2x2+follow"]["switch_lag_s"]
    assert len(lags) == 3 and all(0 < t < 10 for t in lags)
    assert "switch_lag_s" not in stores["NoRebuild2x2"] and "switch_lag_s" not in stores["sqlite"]
    assert sum(sum(r) for r in stores["sqlite"]["rows"]) > 0  # the probes found rows
    assert "x SQLite" in proc.stdout
    assert list(tmp_path.glob("ebb-first-probe-*")) == []  # the stores are removed


def test_first_probe_refuses_a_store_another_process_cannot_read(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "ebb.tools.first_probe", "--stores", "NoRebuild2x2,duckdb",
                           "--dir", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "duckdb: this store cannot be read by another process" in proc.stderr


def test_first_probe_follows_only_ebb_layouts(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "ebb.tools.first_probe", "--stores", "NoRebuild2x2,sqlite+follow",
                           "--dir", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "sqlite+follow: +follow is for ebb layouts" in proc.stderr
