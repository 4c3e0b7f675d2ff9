"""Issue 8's acceptance targets and the headline figures of docs/benchmarks.md, computed from the
benchmark summaries (``tools.results``) and machine descriptions (``tools.machine``).

"Best layout" is, as in the issue, ebb's best doubly partitioned layout *for the measure in
question*: the one with the shortest median time for that operation and cache state, a
different layout per measure if need be. Ratios against peers are peer time / ebb time (above
1 = ebb faster) in the headline, and ebb time / fastest peer's time in the targets, which bound
the latter. A target with no data (workload not run, no cold slots, no peers) is "not measured".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

# (summary column, operation, cache) of the six timed measures
MEASURES = (("update_s", "update", "warm"), ("update_cold_s", "update", "cold"), ("probe_s", "probe", "warm"),
            ("probe_cold_s", "probe", "cold"), ("scan_s", "scan", "warm"), ("scan_cold_s", "scan", "cold"))
# issue 8's targets against the fastest peer: workload -> (operation, largest ebb / fastest peer)
PEER_TARGETS = {
    "thesis-small": (("update", 1.0), ("probe", 1.5), ("scan", 1.0)),
    "many-keys": (("probe", 2.0), ("scan", 1.5), ("update", 1.0)),
}
WRITE_AMP_MAX = 1.5
SPACE_AMP_MAX = 1.3
COLD_SCAN_MIN = 0.7  # of the O_DIRECT sequential read bandwidth
PROBE_ALLOWANCE_MAX = 1.0  # cold probe bytes read / (2 x returned + one block per sub-index visited)
MEMORY_TOLERANCE = 0.2
MEMORY_PAIR = ("thesis-small", "thesis-large-smallbatch")  # same batch, archive 10x larger
MODES = ("rebuild", "norebuild")


def finite(x) -> bool:
    try:
        return math.isfinite(x)
    except TypeError:  # None, strings
        return False


def best(s: pd.DataFrame, col: str, family: str = "doubly", largest: bool = False) -> pd.Series | None:
    """The row of ``family`` with the smallest (or largest) finite ``col``, or None."""
    f = s[(s.family == family) & pd.to_numeric(s[col], errors="coerce").notna()]
    if f.empty:
        return None
    v = pd.to_numeric(f[col])
    return f.loc[v.idxmax() if largest else v.idxmin()]


def peers(s: pd.DataFrame) -> pd.DataFrame:
    return s[s.family == "peer"]


def vs_peers(s: pd.DataFrame) -> list[dict]:
    """Per timed measure: ebb's best doubly layout (``ebb``: its row or None), and for each peer
    its time / ebb's (``ratios``, NaN where either is missing)."""
    out = []
    for col, op, cache in MEASURES:
        e = best(s, col)
        ratios = {r.config: (r[col] / e[col] if e is not None and finite(r[col]) and e[col] else float("nan"))
                  for _, r in peers(s).iterrows()}
        out.append({"col": col, "op": op, "cache": cache, "ebb": e, "ratios": ratios})
    return out


# issue 25's "one layout, no trade-off": the timed measures plus the library-level probe latency
ONE_LAYOUT_MEASURES = MEASURES + (("probe_p50_s", "probe p50", "warm"), ("probe_p99_s", "probe p99", "warm"))


def one_layout_vs_peers(s: pd.DataFrame, layout: str) -> list[dict]:
    """Per measure of ONE_LAYOUT_MEASURES: ``layout``'s value (``value``), the fastest peer's row
    (``peer``, None if no peer has the measure) and layout / that peer (``ratio``, NaN if missing:
    at most 1 = at or ahead of every peer)."""
    row = s[s.config == layout]
    out = []
    for col, op, cache in ONE_LAYOUT_MEASURES:
        if col not in s.columns:
            continue
        value = float(row[col].iloc[0]) if len(row) and finite(row[col].iloc[0]) else float("nan")
        p = best(s, col, family="peer")
        ratio = value / p[col] if p is not None and finite(value) and p[col] else float("nan")
        out.append({"col": col, "op": op, "cache": cache, "value": value, "peer": p, "ratio": ratio})
    return out


def worst_space_amp(s: pd.DataFrame) -> dict[str, pd.Series]:
    """Per mode, the doubly partitioned layout with the largest space amplification."""
    out = {}
    for mode in MODES:
        r = best(s[s["mode"] == mode], "space_amp", largest=True)
        if r is not None:
            out[mode] = r
    return out


def cold_scan_fraction(row: pd.Series | None, machine: dict) -> float:
    """Cold scan bandwidth (bytes of records returned per second) / O_DIRECT sequential read."""
    bw = ((machine or {}).get("disk") or {}).get("seq_read_Bps")
    if row is None or not finite(bw) or not finite(row.scan_cold_GBps):
        return float("nan")
    return row.scan_cold_GBps * 1e9 / bw


@dataclass
class Target:
    workload: str  # a workload, "all" rows are expanded per workload
    measure: str
    target: str
    measured: str
    met: bool | None  # None: not measured
    shortfall: str = ""  # by how much a target that is not met misses


def _peer_goal(limit: float) -> str:
    return "faster than every peer (ebb / fastest peer <= 1.0)" if limit == 1.0 else f"<= {limit:g}x the fastest peer's time"


def _peer_target(w: str, s: pd.DataFrame | None, op: str, limit: float) -> Target:
    goal = _peer_goal(limit)
    if s is None:
        return Target(w, op, goal, f"not measured (run `ebb bench {w}`)", None)
    parts, worst = [], float("nan")
    if not peers(s).empty:
        for col, o, cache in MEASURES:
            if o != op:
                continue
            e, p = best(s, col), best(s, col, family="peer")
            if e is None or p is None or not p[col]:
                continue
            r = e[col] / p[col]
            worst = r if not finite(worst) else max(worst, r)
            parts.append(f"{cache} {r:.2f}x ({e.config} {e[col]:.3g} s, {p.config} {p[col]:.3g} s)")
    if not parts:
        return Target(w, op, goal, "not measured", None)
    met = worst <= limit
    return Target(w, op, goal, "; ".join(parts), met, "" if met else f"{worst / limit:.2f}x too slow")


def _write_amp_target(w: str, s: pd.DataFrame) -> Target:
    goal = f"write amplification (OS bytes / new bytes) <= {WRITE_AMP_MAX:g} for the best-updating mode"
    e = best(s, "update_s")
    if e is None or not finite(e.write_amp_os):
        return Target(w, "write amplification", goal, "not measured", None)
    met = e.write_amp_os <= WRITE_AMP_MAX
    return Target(w, "write amplification", goal, f"{e.write_amp_os:.2f} ({e.config}, fastest update)", met,
                  "" if met else f"{e.write_amp_os / WRITE_AMP_MAX:.2f}x over")


def _space_amp_target(w: str, s: pd.DataFrame) -> Target:
    goal = f"space amplification <= {SPACE_AMP_MAX:g} for every mode (worst doubly layout of each), after updates"
    worst = worst_space_amp(s)
    if not worst:
        return Target(w, "space amplification", goal, "not measured", None)
    top = max(r.space_amp for r in worst.values())
    met = top <= SPACE_AMP_MAX
    measured = "; ".join(f"{m} {r.space_amp:.2f} ({r.config})" for m, r in worst.items())
    return Target(w, "space amplification", goal, measured, met, "" if met else f"{top / SPACE_AMP_MAX:.2f}x over")


def _cold_scan_target(w: str, s: pd.DataFrame, machine: dict) -> Target:
    goal = f"cold scan >= {COLD_SCAN_MIN:.0%} of the O_DIRECT sequential read bandwidth of the same run"
    e = best(s, "scan_cold_s")
    frac = cold_scan_fraction(e, machine)
    if not finite(frac):
        why = "no cold scan" if e is None else "no O_DIRECT read bandwidth recorded for this run"
        return Target(w, "cold scan bandwidth", goal, f"not measured ({why})", None)
    bw = machine["disk"]["seq_read_Bps"]
    met = frac >= COLD_SCAN_MIN
    return Target(w, "cold scan bandwidth", goal,
                  f"{frac:.0%} ({e.config}: {e.scan_cold_GBps:.3g} GB/s of {bw / 1e9:.3g} GB/s)", met,
                  "" if met else f"{COLD_SCAN_MIN / frac:.2f}x too slow")


def _cold_probe_target(w: str, s: pd.DataFrame) -> Target:
    goal = "cold probe reads <= 2x the bytes it returns + one block per sub-index visited"
    e = best(s, "probe_cold_s")
    if e is None or not finite(e.probe_cold_read_vs_allowance):
        return Target(w, "cold probe bytes read", goal, "not measured", None)
    r = e.probe_cold_read_vs_allowance
    met = r <= PROBE_ALLOWANCE_MAX
    return Target(w, "cold probe bytes read", goal,
                  f"{r:.2f} of the allowance ({e.config}: {e.probe_cold_os_read_bytes / 1e6:.3g} MB read for "
                  f"{e.probe_cold_bytes_returned / 1e6:.3g} MB returned over {e.probe_cold_subindices:.3g} sub-indices; "
                  f"allowance {e.probe_cold_read_allowance_bytes / 1e6:.3g} MB)", met,
                  "" if met else f"{r:.2f}x the allowance")


def _correct_target(w: str, s: pd.DataFrame) -> Target:
    wrong = s[~s.correct.astype(bool)].config.tolist()
    return Target(w, "answers", "every probe and scan equal to the brute-force oracle",
                  f"{len(s) - len(wrong)} of {len(s)} configurations correct"
                  + (f"; wrong: {', '.join(wrong)}" if wrong else ""), not wrong)


def memory_target(summaries: dict[str, pd.DataFrame]) -> Target:
    small, large = (summaries.get(w) for w in MEMORY_PAIR)
    goal = (f"update peak anonymous memory within {MEMORY_TOLERANCE:.0%}, {MEMORY_PAIR[1]} vs {MEMORY_PAIR[0]} "
            "(same batch, archive 10x larger), per doubly layout run in both")
    name = f"{MEMORY_PAIR[0]} vs {MEMORY_PAIR[1]}"
    if small is None or large is None:
        return Target(name, "update peak anon memory", goal, f"not measured (run `ebb bench {MEMORY_PAIR[1]}`)", None)
    both = small[small.family == "doubly"].merge(large[large.family == "doubly"], on="config", suffixes=("_s", "_l"))
    both = both[both.peak_anon_update_s.notna() & both.peak_anon_update_l.notna() & (both.peak_anon_update_s > 0)]
    if both.empty:
        return Target(name, "update peak anon memory", goal, "not measured (no doubly layout in both runs)", None)
    ratio = both.peak_anon_update_l / both.peak_anon_update_s
    dev = (ratio - 1).abs()
    met = bool(dev.max() <= MEMORY_TOLERANCE)
    measured = "; ".join(f"{r.config} {r.peak_anon_update_s / 1e6:.0f} -> {r.peak_anon_update_l / 1e6:.0f} MB "
                         f"({q:.2f}x; growth above the update's start {r.anon_growth_update_s / 1e6:.0f} -> "
                         f"{r.anon_growth_update_l / 1e6:.0f} MB)" for (_, r), q in zip(both.iterrows(), ratio))
    return Target(name, "update peak anon memory", goal, measured, met,
                  "" if met else f"differs by up to {dev.max():.0%}")


def targets(summaries: dict[str, pd.DataFrame], machines: dict[str, dict]) -> list[Target]:
    """Every target of issue 8 that the published summaries can check, in the issue's order."""
    out = []
    for w, goals in PEER_TARGETS.items():
        out += [_peer_target(w, summaries.get(w), op, limit) for op, limit in goals]
    for w, s in summaries.items():
        m = machines.get(w) or {}
        out += [_write_amp_target(w, s), _space_amp_target(w, s), _cold_scan_target(w, s, m), _cold_probe_target(w, s)]
    out.append(memory_target(summaries))
    out += [_correct_target(w, s) for w, s in summaries.items()]
    return out
