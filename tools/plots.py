"""Figures in the style of the thesis's Figures 4.4-4.11, plus a peer comparison and an
I/O-amplification chart. Each figure is a PNG with a CSV of exactly the values plotted.

Which figures a workload gives:
  thesis-small  fig4_4 (Rebuild4x4 vs 2x8 vs 8x2, normalised), fig4_5/4_6/4_7 (update, probe,
                scan time vs n), peers, io_amplification
  fluctuating   fig4_8 (update time under a steady and a fluctuating rate; needs thesis-small)
  thesis-large  fig4_9/4_10/4_11 (update, probe, scan time vs n), io_amplification
  many-keys     peers, io_amplification
  thesis-large-smallbatch  io_amplification
  periodic      periodic (update time and sub-index imbalance after each update; drawn from the
                run's ops.csv, so only where ``draw_workload`` is given the operations)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from .configs import parse
from .workloads import WORKLOADS

MARKERS = {"R-ins": "o", "D-ins": "s", "R-exp": "^", "D-exp": "v", "Rebuild": "D", "NoRebuild": "x",
           "Rebuild-chr": "d", "NoRebuild-chr": "+", "Rebuild-rand": "P", "NoRebuild-rand": "*"}
LINES = {"R-ins": "-", "D-ins": "--", "R-exp": "-", "D-exp": "--", "Rebuild": "-", "NoRebuild": "--",
         "Rebuild-chr": ":", "NoRebuild-chr": "-.", "Rebuild-rand": ":", "NoRebuild-rand": "-."}
OPS = (("update_s", "update"), ("probe_s", "probe"), ("scan_s", "scan"))
# partitioning -> (line, marker, colour) in the periodic figure
PARTITIONINGS = {"round-robin": ("-", "o", "black"), "chronological": (":", "d", "0.55"), "random": ("--", "P", "0.3")}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 9, "axes.grid": True, "grid.alpha": 0.3, "figure.dpi": 100})
    return plt


def _save(fig, df: pd.DataFrame, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path.with_suffix(".png"))
    df.to_csv(path.with_suffix(".csv"), index=False, float_format="%.6g")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path.with_suffix(".png")


def _squares(s: pd.DataFrame) -> pd.DataFrame:
    """Wave layouts, and doubly layouts with G == E (the thesis's 2x2..5x5)."""
    return s[(s.family == "wave") | ((s.family == "doubly") & (s.G == s.E))]


def fig_vs_n(s: pd.DataFrame, metric: str, label: str, techniques: list[str], title: str, path: Path) -> Path | None:
    """One line per technique: ``metric`` against n (thesis Figures 4.5-4.7, 4.9-4.11)."""
    d = _squares(s)
    d = d[d.technique.isin(techniques)][["technique", "n", "config", metric]].sort_values(["technique", "n"])
    if d.empty:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    for t in techniques:
        part = d[d.technique == t]
        if len(part):
            wave = t.startswith(("R-", "D-"))
            ax.plot(part.n, part[metric], LINES.get(t, "-"), marker=MARKERS.get(t, "o"), label=t,
                    color="gray" if t.endswith(("-chr", "-rand")) else "black",
                    markerfacecolor="white" if wave else None)  # hollow markers: wave indices
    ax.set_xlabel("number of sub-indices n")
    ax.set_ylabel(f"median {label} time (s)")
    ax.set_xticks(sorted(d.n.unique()))
    ax.set_title(title)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    return _save(fig, d, path)


def fig4_4(s: pd.DataFrame, path: Path) -> Path | None:
    """Rebuild4x4, Rebuild2x8 and Rebuild8x2: update, probe and scan time normalised to the
    largest of the three (as the thesis normalises)."""
    names = ["Rebuild4x4", "Rebuild2x8", "Rebuild8x2"]
    d = s[s.config.isin(names)].set_index("config")
    if len(d) < 3:
        return None
    rows = []
    for metric, op in OPS:
        top = d[metric].max()
        for n in names:
            rows.append({"operation": op, "config": n, "seconds": d.loc[n, metric], "normalised": d.loc[n, metric] / top})
    df = pd.DataFrame(rows)
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    width = 0.25
    x = np.arange(3)
    for k, (n, hatch) in enumerate(zip(names, ("", "//", ".."))):
        vals = df[df.config == n].normalised.to_numpy()
        ax.bar(x + (k - 1) * width, vals, width, label=n, color=["0.2", "0.6", "0.9"][k], edgecolor="black", hatch=hatch)
    ax.set_xticks(x, [op for _, op in OPS])
    ax.set_ylabel("time normalised to the slowest of the three")
    ax.set_title("Figure 4.4: Rebuild4x4 vs Rebuild2x8 vs Rebuild8x2")
    ax.set_ylim(0, 1.1)
    ax.legend(fontsize=8)
    return _save(fig, df, path)


def fig4_8(steady: pd.DataFrame, fluct: pd.DataFrame, path: Path) -> Path | None:
    """Update time of each configuration under the steady rate (light) and the increase caused
    by the fluctuating rate (dark), as the thesis's Figure 4.8."""
    both = fluct.merge(steady[["config", "update_s"]], on="config", suffixes=("", "_steady"))
    both = both[both.family != "peer"]
    extra = fluct[~fluct.config.isin(both.config) & (fluct.family != "peer")]
    if both.empty and extra.empty:
        return None
    d = pd.concat([both, extra.assign(update_s_steady=np.nan)])
    d = d.sort_values(["technique", "n"])[["config", "technique", "n", "update_s_steady", "update_s"]]
    d = d.rename(columns={"update_s": "update_s_fluctuating"})
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4))
    x = np.arange(len(d))
    has = np.isfinite(d.update_s_steady.to_numpy(dtype=float))
    fl = d.update_s_fluctuating.to_numpy(dtype=float)
    base = np.where(has, d.update_s_steady.to_numpy(dtype=float), 0.0)
    low = np.minimum(base, fl)
    inc = fl - base
    ax.bar(x[has], low[has], color="0.85", edgecolor="black", label="steady rate")
    ax.bar(x[has], np.clip(inc, 0, None)[has], bottom=low[has], color="0.25", edgecolor="black",
           label="increase under fluctuating rate")
    dec = np.clip(-inc, 0, None)
    if (dec[has] > 0).any():
        ax.bar(x[has], dec[has], bottom=fl[has], color="white", edgecolor="black", hatch="//",
               label="decrease under fluctuating rate")
    if (~has).any():
        ax.bar(x[~has], fl[~has], color="white", edgecolor="black", hatch="..",
               label="fluctuating rate only (no steady run)")
    labels = [c.replace("NoRebuild", "NoR").replace("Rebuild", "R") for c in d.config]
    ax.set_xticks(x, labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("median update time (s)")
    ax.set_title("Figure 4.8: effect of a data rate fluctuating by up to x4")
    ax.legend(fontsize=8)
    return _save(fig, d, path)


def fig_peers(s: pd.DataFrame, workload: str, path: Path) -> Path | None:
    """Update, probe and scan time (warm and cold, log scale) of ebb's best doubly partitioned
    layout, its best wave layout and every peer."""
    picks = []
    for fam in ("doubly", "wave"):
        f = s[(s.family == fam) & s.update_s.notna()]
        if len(f):
            picks.append(f.loc[f.update_s.idxmin()])
    picks += [r for _, r in s[s.family == "peer"].iterrows()]
    if len(picks) < 2:
        return None
    d = pd.DataFrame(picks)
    d["label"] = [f"ebb {c}" if f != "peer" else c for c, f in zip(d.config, d.family)]
    cols = ["update_s", "update_cold_s", "probe_s", "probe_cold_s", "scan_s", "scan_cold_s"]
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.2))
    x = np.arange(len(cols))
    width = 0.8 / len(d)
    cmap = plt.get_cmap("tab10")
    for k, (_, r) in enumerate(d.iterrows()):
        vals = [r[c] for c in cols]
        ax.bar(x + (k - (len(d) - 1) / 2) * width, vals, width, label=r.label, color=cmap(k % 10), edgecolor="black",
               hatch="//" if r.family != "peer" else "")  # hatched: ebb
    ax.set_xticks(x, ["update", "update cold", "probe", "probe cold", "scan", "scan cold"])
    ax.set_yscale("log")
    ax.set_ylabel("median time (s, log scale)")
    ax.set_title(f"ebb vs peers, {workload} (same records, same schedule)")
    ax.legend(fontsize=7, ncol=2)
    return _save(fig, d[["label", "config"] + cols], path)


def fig_io(s: pd.DataFrame, workload: str, machine: dict, path: Path) -> Path | None:
    """Write amplification of updates and read amplification of cold scans and probes."""
    d = s[["config", "family", "write_amp_os", "scan_read_amp_cold", "probe_read_amp_cold", "scan_cold_GBps"]].copy()
    if d.empty:
        return None
    fam_order = {"wave": 0, "doubly": 1, "peer": 2}
    d = d.assign(_o=[fam_order.get(f, 3) for f in d.family], _i=range(len(d))).sort_values(["_o", "_i"], ascending=False)
    d = d.drop(columns=["_o", "_i"])  # summary order within a family, wave on top, peers at the bottom
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, max(3.5, 0.17 * len(d) + 1)), sharey=True)
    y = np.arange(len(d))
    colors = ["0.3" if f == "peer" else "0.7" for f in d.family]
    axes[0].barh(y, d.write_amp_os, color=colors, edgecolor="black")
    axes[0].set_xlabel("bytes written to disk per byte of new records")
    axes[0].set_title("update write amplification")
    axes[1].barh(y - 0.2, d.scan_read_amp_cold, 0.4, color=colors, edgecolor="black", label="scan")
    axes[1].barh(y + 0.2, d.probe_read_amp_cold, 0.4, color="white", edgecolor="black", hatch="//", label="probe")
    axes[1].set_xscale("log")
    axes[1].set_xlabel("bytes read from disk per byte returned (cold, log)")
    axes[1].set_title("read amplification")
    axes[1].legend(fontsize=7)
    axes[0].set_yticks(y, d.config, fontsize=7)
    bw = machine.get("disk", {})
    if bw:
        fig.suptitle(f"{workload}: disk limits {bw['seq_write_Bps'] / 1e9:.2f} GB/s write, "
                     f"{bw['seq_read_Bps'] / 1e9:.2f} GB/s read (O_DIRECT)", fontsize=9)
    return _save(fig, d, path)


def periodic_series(ops: pd.DataFrame, workload: str) -> pd.DataFrame:
    """Per update of each doubly partitioned layout in ``ops``: its time, whether its slot is a
    burst, and the imbalance of the sub-indices after it (records in the largest / mean)."""
    d = ops[(ops.op == "update") & (ops.family == "doubly")]
    w = WORKLOADS[workload].with_updates(int(d.slot.max()) if len(d) else 0)
    d = d.assign(partitioning=[parse(c).partitioning for c in d.config], burst=w.bursts(d.slot.to_numpy(dtype=np.int64)),
                 update_s=d.wall_s, imbalance=d.subidx_max_rows / d.subidx_mean_rows)
    return d[["config", "mode", "partitioning", "slot", "burst", "cache", "update_s", "subidx_max_rows",
              "subidx_mean_rows", "imbalance"]].sort_values(["mode", "partitioning", "slot"], ascending=[False, True, True])


def fig_periodic(ops: pd.DataFrame, workload: str, path: Path) -> Path | None:
    """Update time (top) and sub-index imbalance (bottom) after each update, one line per
    partitioning, a column per mode; burst slots shaded."""
    d = periodic_series(ops, workload)
    if d.empty:
        return None
    modes = list(d["mode"].unique())
    plt = _plt()
    fig, axes = plt.subplots(2, len(modes), figsize=(5.5 * len(modes), 6), sharex=True, squeeze=False)
    bursts = np.unique(d.slot[d.burst])
    for k, mode in enumerate(modes):
        m = d[d["mode"] == mode]
        for row, (col, label) in enumerate((("update_s", "update time (s)"),
                                            ("imbalance", "largest / mean sub-index (records)"))):
            ax = axes[row, k]
            for b in bursts:
                ax.axvspan(b - 0.5, b + 0.5, color="0.92", lw=0)
            for part, (line, marker, colour) in PARTITIONINGS.items():
                p = m[m.partitioning == part]
                if len(p):
                    ax.plot(p.slot, p[col], line, marker=marker, color=colour, markersize=4, label=part)
            ax.set_ylabel(label)
            ax.set_ylim(bottom=0 if row == 0 else 1)  # an imbalance of 1 is perfectly even
        c = parse(m.config.iloc[0])
        axes[0, k].set_title(f"{'Rebuild' if mode == 'rebuild' else 'NoRebuild'} {c.G}x{c.E}")
        axes[1, k].set_xlabel("update slot (shaded: bursts)")
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(f"{workload}: a burst every {WORKLOADS[workload].period} updates", fontsize=9)
    return _save(fig, d, path)


def draw_workload(workload: str, summaries: dict[str, pd.DataFrame], outdir: Path, machine: dict | None = None,
                  ops: pd.DataFrame | None = None) -> list[Path]:
    """The figures ``workload`` gives (module docstring), into ``outdir``; ``ops`` are the run's
    operations (ops.csv), which the per-update figure needs."""
    s = summaries.get(workload)
    if s is None or s.empty:
        return []
    if workload == "periodic":  # a study of one question: its own figure, not the I/O one
        fig = fig_periodic(ops, workload, Path(outdir) / "periodic") if ops is not None else None
        return [fig] if fig is not None else []
    machine = machine or {}
    outdir = Path(outdir)
    out: list[Path | None] = []
    core = ["R-ins", "D-ins", "Rebuild", "NoRebuild"]
    if workload in ("thesis-small", "quick"):
        out.append(fig4_4(s, outdir / "fig4_4"))
        out.append(fig_vs_n(s, "update_s", "update", core + ["Rebuild-chr", "NoRebuild-chr"],
                            "Figure 4.5: update times, small window", outdir / "fig4_5"))
        out.append(fig_vs_n(s, "probe_s", "probe", core, "Figure 4.6: probe times, small window", outdir / "fig4_6"))
        out.append(fig_vs_n(s, "scan_s", "scan", core, "Figure 4.7: scan times, small window", outdir / "fig4_7"))
    if workload == "fluctuating" and "thesis-small" in summaries:
        out.append(fig4_8(summaries["thesis-small"], s, outdir / "fig4_8"))
    if workload == "thesis-large":
        out.append(fig_vs_n(s, "update_s", "update", core, "Figure 4.9: update times, large data set", outdir / "fig4_9"))
        out.append(fig_vs_n(s, "probe_s", "probe", core, "Figure 4.10: probe times, large data set", outdir / "fig4_10"))
        out.append(fig_vs_n(s, "scan_s", "scan", core, "Figure 4.11: scan times, large data set", outdir / "fig4_11"))
    if workload in ("thesis-small", "many-keys", "quick"):
        out.append(fig_peers(s, workload, outdir / f"peers-{workload}"))
    out.append(fig_io(s, workload, machine, outdir / f"io-amplification-{workload}"))
    return [p for p in out if p is not None]
