"""`python -m ebb.tools.library_bench` end to end at a tiny scale (a few seconds): ebb's Rebuild2x2,
its string-key variant and SQLite, each built and then read from fresh processes, the warm probes
in two passes taking turns. Asserts the
results are complete and sane (every field, positive times, p50 <= p99) and the answers right
(every read equal to the brute-force oracle; ebb's batch equal to its loop of single probes and
to SQLite's batch), never timings themselves."""

from __future__ import annotations

import json
import subprocess
import sys

from ebb.tools.library_bench import BATCH_ROUNDS, STRING_SUFFIX, entries

STORE_FIELDS = (
    "config", "keys", "bulk_s", "update_s", "update_median_s", "disk_bytes", "open_s",
    "probes", "probe_p50_s", "probe_p99_s", "probe_mean_s", "probe_max_s", "probe_rows", "probe_seq_sum",
    "probe_passes", "probe_pass_p50_s", "probe_pass_p99_s", "probe_pass_answers",
    "batch_keys", "batch_s", "batch_runs_s", "batch_per_key_s", "batch_rows", "batch_seq_sum", "batch_answers",
    "batch_speedup",
    "loop_s", "loop_per_key_s", "loop_rows", "loop_seq_sum",
    "scan_s", "scan_runs_s", "scan_rows", "scan_seq_sum",
    "cold_probes", "cold_p50_s", "cold_probe_s", "cold_rows", "cold_seq_sum", "cold_note",
)
POSITIVE = ("bulk_s", "update_median_s", "disk_bytes", "probe_p50_s", "probe_p99_s", "probe_mean_s", "batch_s",
            "batch_per_key_s", "batch_speedup", "loop_s", "scan_s", "probe_rows", "batch_rows", "scan_rows")


def test_entries_add_a_string_key_variant_of_each_ebb_layout():
    assert entries(["Rebuild2x2", "sqlite", "NoRebuild4x4"], True) == [
        ("Rebuild2x2", "Rebuild2x2", False), ("sqlite", "sqlite", False), ("NoRebuild4x4", "NoRebuild4x4", False),
        ("Rebuild2x2" + STRING_SUFFIX, "Rebuild2x2", True), ("NoRebuild4x4" + STRING_SUFFIX, "NoRebuild4x4", True)]
    assert entries(["Rebuild2x2", "sqlite"], False) == [("Rebuild2x2", "Rebuild2x2", False), ("sqlite", "sqlite", False)]


def test_library_bench_tiny(tmp_path):
    out, stores = tmp_path / "out", tmp_path / "stores"
    proc = subprocess.run([sys.executable, "-m", "ebb.tools.library_bench", "--stores", "Rebuild2x2,sqlite",
                           "--scale", "0.002", "--cold", "2", "--passes", "2", "--bandwidth-mib", "0", "--dir", str(stores),
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Rebuild2x2: build" in proc.stderr and "sqlite: read" in proc.stderr  # progress on stderr
    assert "pass 2/2 of the warm probes: 3 stores" in proc.stderr
    r = json.loads((out / "library.json").read_text())
    assert r["answers_correct"] and not r["wrong_answers"] and not r["failed"]
    assert r["commit"] and r["machine"]["cpu"] and r["workload"]["name"] == "library" and r["workload"]["updates"] == 8
    assert r["probes"] == 2000 and r["warmup"] == 200 and r["passes"] == 2
    labels = ["Rebuild2x2", "sqlite", "Rebuild2x2" + STRING_SUFFIX]
    assert list(r["stores"]) == labels
    cold = r["cold_note"] is None
    for label in labels:
        s = r["stores"][label]
        missing = [f for f in STORE_FIELDS if f not in s]
        assert not missing, (label, missing)
        for f in POSITIVE:
            assert s[f] > 0, (label, f, s[f])
        assert len(s["update_s"]) == 8 and all(t > 0 for t in s["update_s"])
        assert s["probes"] == 2000 and s["probe_p50_s"] <= s["probe_p99_s"] <= s["probe_max_s"], label
        # the figures are over both passes' probes, each pass answering as the oracle (checked in the tool)
        each = s["probe_pass_p50_s"]
        assert s["probe_passes"] == len(each) == len(s["probe_pass_answers"]) == 2, label
        assert min(each) <= s["probe_p50_s"] <= max(each) and max(s["probe_pass_p99_s"]) <= s["probe_max_s"], label
        assert s["probe_pass_answers"][0] == s["probe_pass_answers"][1] == [s["probe_rows"], s["probe_seq_sum"]]
        assert s["batch_keys"] == r["batch"] > 0 and s["batch_s"] == min(s["batch_runs_s"])
        # the batch, timed in each pass's rounds (the stores taking turns), answered alike every time
        assert len(s["batch_runs_s"]) == len(s["batch_answers"]) == 2 * BATCH_ROUNDS, label
        assert all(a == [s["batch_rows"], s["batch_seq_sum"]] for a in s["batch_answers"]), label
        if cold:
            assert s["cold_probes"] == 2 and s["cold_p50_s"] > 0, label
        else:
            assert s["cold_probes"] == 0 and s["cold_p50_s"] is None, label
    ebb, sq, st = (r["stores"][k] for k in labels)
    # ebb's probe_many returns what its single probes return, and what SQLite's batch returns
    assert (ebb["batch_rows"], ebb["batch_seq_sum"]) == (ebb["loop_rows"], ebb["loop_seq_sum"])
    assert (ebb["batch_rows"], ebb["batch_seq_sum"]) == (sq["batch_rows"], sq["batch_seq_sum"])
    assert (sq["batch_rows"], sq["batch_seq_sum"]) == (sq["loop_rows"], sq["loop_seq_sum"])
    for read in ("probe", "batch", "scan"):  # string keys: the same records
        assert (st[f"{read}_rows"], st[f"{read}_seq_sum"]) == (ebb[f"{read}_rows"], ebb[f"{read}_seq_sum"]), read
    assert st["keys"] == "string" and ebb["keys"] == "int64"
    ratios = r["ratios"]
    assert ratios["warm_p50_vs_sqlite"]["ebb"] == "Rebuild2x2" and ratios["warm_p50_vs_sqlite"]["ratio"] > 0
    assert ratios["warm_p99_vs_sqlite"]["ratio"] > 0 and ratios["batch_per_key_vs_sqlite"]["ratio"] > 0
    assert ratios["string_vs_int_keys"]["Rebuild2x2"]["p50"] > 0
    assert "cold_p50_vs_rocksdb" not in ratios  # RocksDB not run
    md = (out / "library.md").read_text()
    assert "| probe p50 µs | passes' p50 µs | probe p99 µs |" in md and all(f"| {k} |" in md for k in labels)
    assert "Answers: every store returned the same records" in md
    assert not any(stores.iterdir())  # the stores are removed without --keep


def test_library_bench_refuses_a_bad_store_name(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "ebb.tools.library_bench", "--stores", "mysql", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "mysql" in proc.stderr
    assert not (tmp_path / "library.json").exists()


def test_string_keys_sort_as_their_numbers():
    import numpy as np
    import pyarrow as pa

    from ebb.tools.workloads import string_keys, with_string_keys

    keys = np.array([999_999, 0, 42, 5], dtype=np.int64)
    s = string_keys(keys).to_pylist()
    assert s == ["sensor-0999999", "sensor-0000000", "sensor-0000042", "sensor-0000005"]
    assert np.argsort(s).tolist() == np.argsort(keys).tolist()  # string order is numeric order
    t = with_string_keys(pa.table({"key": keys, "seq": keys}))
    assert t.schema.field("key").type == pa.string() and t.column("seq").to_pylist() == keys.tolist()
