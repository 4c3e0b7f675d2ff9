"""From per-operation rows (ops.csv) to one summary row per configuration (summary.csv).

Times are medians over the periodic updates (``*_s``; the bulk load is reported apart): the
thesis reports means, but this machine is shared with other jobs whose bursts of CPU use
inflate a few operations, and the median is robust to them; the means are kept as
``*_mean_s``. Amplifications: write amplification = bytes the kernel was asked to
write during updates / bytes of new records; read amplification = bytes read from disk by a
cold read / bytes of records it returned; ebb's own counts give the same ratios for the bytes
ebb itself read and wrote. A cold probe of an ebb layout is also compared with what issue 8
allows it to read: twice the bytes it returns plus one block (``block_bytes``, the target block
size of the archive's runs, which the store reports with each read) per sub-index it visits (``probe_cold_read_vs_allowance``, at most 1 meets
it). Memory is the peak of anonymous memory (RssAnon) during an operation (``tools.measure``):
``peak_anon_update``/``peak_anon_scan`` are the largest over the periodic updates and the scans,
``anon_growth_update`` the largest rise above the level at the start of an update. How even an
update's cost is: ``update_sd_s``, ``update_cv`` (sd / mean) and ``update_max_s`` over the warm
periodic updates; how even the sub-indices are: the imbalance after an update, records in the
largest sub-index / mean records per sub-index, as its mean and maximum over the updates
(``subidx_imbalance_*``; ebb only). Every probe and scan is checked against a brute-force oracle
(``Workload.oracle``): a configuration whose answers differ has ``correct = False``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from .plan import Plan

SUMMARY_COLUMNS = [
    "workload", "config", "family", "technique", "mode", "n", "G", "E",
    "update_s", "update_cold_s", "probe_s", "probe_cold_s", "scan_s", "scan_cold_s", "bulk_s",
    "update_mean_s", "probe_mean_s", "scan_mean_s", "update_sd_s", "update_cv", "update_max_s",
    "update_subindices", "subidx_imbalance_mean", "subidx_imbalance_max", "update_blocks_read", "update_blocks_written",
    "new_bytes", "update_os_write_bytes", "update_store_bytes_written", "update_store_bytes_read",
    "update_cold_os_read_bytes", "write_amp_os", "write_amp_store",
    "probe_rows", "probe_subindices", "probe_blocks", "probe_cold_os_read_bytes", "probe_read_amp_cold",
    "probe_cold_bytes_returned", "probe_cold_subindices", "block_bytes", "probe_cold_read_allowance_bytes",
    "probe_cold_read_vs_allowance",
    "scan_rows", "scan_bytes", "scan_blocks", "scan_cold_os_read_bytes", "scan_read_amp_cold", "scan_read_amp_store",
    "scan_GBps", "scan_cold_GBps", "peak_anon_update", "anon_growth_update", "peak_anon_scan", "disk_bytes", "space_amp",
    "updates", "scans", "cold_samples", "correct",
]


def load_ops(out: Path) -> pd.DataFrame:
    path = Path(out) / "ops.csv"
    if not path.exists() or path.stat().st_size == 0:
        return pd.DataFrame()
    return pd.read_csv(path)


def complete_configs(plan: Plan) -> set[str]:
    """Configurations whose rows in ops.csv cover the whole plan."""
    ops = load_ops(plan.out)
    if ops.empty:
        return set()
    counts = ops.groupby("config").size()
    return {c for c, k in counts.items() if k >= plan.ops_per_config()}


def _mean(s: pd.Series) -> float:
    s = pd.to_numeric(s, errors="coerce").dropna()
    return float(s.mean()) if len(s) else float("nan")


def _median(s: pd.Series) -> float:
    s = pd.to_numeric(s, errors="coerce").dropna()
    return float(s.median()) if len(s) else float("nan")


def _max(s: pd.Series) -> float:
    return float(pd.to_numeric(s, errors="coerce").max())  # NaN if there is no number


def _ratio(num: float, den: float) -> float:
    return float(num / den) if den and np.isfinite(num) and np.isfinite(den) else float("nan")


def _check(rows: pd.DataFrame, oracle: dict[int, dict[str, int]]) -> bool:
    for op in ("probe", "scan"):
        part = rows[rows.op == op]
        for slot, r, s in zip(part.slot.astype(int), part.rows.astype(int), part.seq_sum.astype(np.int64)):
            want = oracle.get(slot)
            if want is None or want[f"{op}_rows"] != r or want[f"{op}_seq"] != s:
                return False
    return True


def summarise(plan: Plan) -> pd.DataFrame:
    """One row per configuration of ``plan`` present in ops.csv (columns SUMMARY_COLUMNS)."""
    ops = load_ops(plan.out)
    if ops.empty:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    oracle = plan.workload_obj.oracle()
    out = []
    for name in [c for c in plan.configs if c in set(ops.config)]:
        d = ops[ops.config == name]
        first = d.iloc[0]
        upd, probe, scan = (d[(d.op == op) & (d.cache == "warm")] for op in ("update", "probe", "scan"))
        updc, probec, scanc = (d[(d.op == op) & (d.cache == "cold")] for op in ("update", "probe", "scan"))
        allupd = d[d.op == "update"]
        upd_s = pd.to_numeric(upd.wall_s, errors="coerce")
        imbalance = pd.to_numeric(allupd.subidx_max_rows, errors="coerce") / pd.to_numeric(allupd.subidx_mean_rows, errors="coerce")
        bulk = d[d.op == "bulk"]
        new_bytes = allupd.data_bytes.sum()
        scan_bytes = _mean(scan.data_bytes)
        last_disk = allupd.disk_bytes.iloc[-1] if len(allupd) else float("nan")
        live_bytes = scan.data_bytes.iloc[-1] if len(scan) else float("nan")
        scans = d[d.op == "scan"]
        # issue 8's bound per cold probe: 2x the bytes returned + one block per sub-index visited (NaN for peers)
        allowance = 2 * probec.data_bytes + pd.to_numeric(probec.subindices, errors="coerce") * probec.block_bytes
        row = {
            "workload": plan.workload, "config": name, "family": first.family, "technique": first.technique,
            "mode": first["mode"] if isinstance(first["mode"], str) else "", "n": int(first.n), "G": int(first.G), "E": int(first.E),
            "update_s": _median(upd.wall_s), "update_cold_s": _median(updc.wall_s),
            "probe_s": _median(probe.wall_s), "probe_cold_s": _median(probec.wall_s),
            "scan_s": _median(scan.wall_s), "scan_cold_s": _median(scanc.wall_s), "bulk_s": _mean(bulk.wall_s),
            "update_mean_s": _mean(upd.wall_s), "probe_mean_s": _mean(probe.wall_s), "scan_mean_s": _mean(scan.wall_s),
            "update_sd_s": float(upd_s.std()), "update_cv": _ratio(float(upd_s.std()), float(upd_s.mean())),
            "update_max_s": _max(upd_s), "update_subindices": _mean(allupd.subindices),
            "subidx_imbalance_mean": _mean(imbalance), "subidx_imbalance_max": _max(imbalance),
            "update_blocks_read": _mean(allupd.blocks_read), "update_blocks_written": _mean(allupd.blocks_written),
            "new_bytes": _mean(allupd.data_bytes), "update_os_write_bytes": _mean(allupd.os_write_bytes),
            "update_store_bytes_written": _mean(allupd.store_bytes_written),
            "update_store_bytes_read": _mean(allupd.store_bytes_read),
            "update_cold_os_read_bytes": _mean(updc.os_read_bytes),
            "write_amp_os": _ratio(allupd.os_write_bytes.sum(), new_bytes),
            "write_amp_store": _ratio(pd.to_numeric(allupd.store_bytes_written, errors="coerce").sum(), new_bytes)
            if allupd.store_bytes_written.notna().any() else float("nan"),
            "probe_rows": _mean(probe.rows), "probe_subindices": _mean(probe.subindices), "probe_blocks": _mean(probe.blocks_read),
            "probe_cold_os_read_bytes": _mean(probec.os_read_bytes),
            "probe_read_amp_cold": _ratio(probec.os_read_bytes.sum(), probec.data_bytes.sum()),
            "probe_cold_bytes_returned": _mean(probec.data_bytes), "probe_cold_subindices": _mean(probec.subindices),
            "block_bytes": _mean(d[d.op == "probe"].block_bytes), "probe_cold_read_allowance_bytes": _mean(allowance),
            "probe_cold_read_vs_allowance": _ratio(probec.os_read_bytes.sum(), allowance.sum()),
            "scan_rows": _mean(scan.rows), "scan_bytes": scan_bytes, "scan_blocks": _mean(scan.blocks_read),
            "scan_cold_os_read_bytes": _mean(scanc.os_read_bytes),
            "scan_read_amp_cold": _ratio(scanc.os_read_bytes.sum(), scanc.data_bytes.sum()),
            "scan_read_amp_store": _ratio(pd.to_numeric(scan.store_bytes_read, errors="coerce").sum(), scan.data_bytes.sum())
            if scan.store_bytes_read.notna().any() else float("nan"),
            "scan_GBps": _ratio(scan.data_bytes.sum(), scan.wall_s.sum()) / 1e9,
            "scan_cold_GBps": _ratio(scanc.data_bytes.sum(), scanc.wall_s.sum()) / 1e9,
            "peak_anon_update": float(allupd.peak_anon_bytes.max()) if len(allupd) else float("nan"),
            "anon_growth_update": float((allupd.peak_anon_bytes - allupd.base_anon_bytes).max()) if len(allupd) else float("nan"),
            "peak_anon_scan": float(scans.peak_anon_bytes.max()) if len(scans) else float("nan"),
            "disk_bytes": float(last_disk), "space_amp": _ratio(float(last_disk), float(live_bytes)),
            "updates": int(len(allupd)), "scans": int(len(scan)), "cold_samples": int(len(updc)),
            "correct": _check(d, oracle),
        }
        out.append(row)
    return pd.DataFrame(out, columns=SUMMARY_COLUMNS)


def write(plan: Plan, summary: pd.DataFrame) -> Path:
    path = plan.out / "summary.csv"
    summary.to_csv(path, index=False, float_format="%.6g")
    return path


def read_machine(out: Path) -> dict:
    p = Path(out) / "machine.json"
    return json.loads(p.read_text()) if p.exists() else {}
