"""``ebb advise``: recommend a layout for a workload, or calibrate the advisor on this machine.

A thin layer over the rest of the advisor: the statistics come from ``workload_profile`` (a job
and its landed files, an archive) or ``bench`` (a benchmark workload), the predictions from
``cost_model`` with the calibration ``auto`` finds, the calibration from ``calibrate``.
``register`` adds the command to the ``ebb`` parser (``tools/cli.py``); nothing heavy is imported
until it runs, and ebb.tools (``ebb bench``'s workloads and timing) only with ``--workload`` or
``--calibrate``. docs/advisor.md explains the model.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from ...storage.errors import UsageError

DESCRIPTION = """\
Recommend an archive layout for a workload: predict, for every candidate layout, the seconds
per update, per probe and per scan and the disk space, and rank them by the total cost of the
expected reads per update (docs/advisor.md).

Candidates: wave indices of n = 4, 9, 16, 25 sub-indices split by insertion or expiration time,
and doubly partitioned indices 2x2, 3x3, 4x4, 5x5, 2x8, 8x2 with round-robin, chronological or
random partitioning, each in Rebuild and NoRebuild mode (named as `ebb bench` names them:
R-ins4, D-exp9, Rebuild4x4, NoRebuild2x8-chr, Rebuild3x3-rand, ...). An archive's own layout
(--archive) is ranked too, sections wider than a slot included (D-ins4-s2).

The workload is one of:
  JOB.toml             a job file (docs/jobs.md) and a sample of its landed events (by default
                       each source's landing directory; --sample to point elsewhere): the
                       query's results are worked out from the events (rate and its variation
                       per update, lifetimes, keys, record size)
  --archive PATH       an existing archive: its update log and a sample of its records; its
                       current layout is marked in the ranking
  --workload NAME      a benchmark workload of `ebb bench` (tools/workloads.py)

The machine's constants come from `ebb advise --calibrate` (about a minute of micro-benchmarks
of ebb's storage code), stored in $XDG_CONFIG_HOME/ebb/calibration.json (~/.config/ebb/...).
A job with layout = "auto" uses the advisor once that file exists.
"""

EPILOG = """\
examples:
  ebb advise --calibrate                              # once per machine, about a minute
  ebb advise job.toml                                 # 10 probes and 1 scan per update assumed
  ebb advise job.toml --probes-per-update 100 --scans-per-update 0 --top 5
  ebb advise job.toml --sample temperature=archive-of-landed/2026-01
  ebb advise --archive /data/arc --format json
  ebb advise --workload thesis-small --compare docs/benchmarks/summary-thesis-small.csv
"""


def register(sub) -> None:
    p = sub.add_parser("advise", help="recommend a layout for a workload (ebb advise --calibrate first)",
                       description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("job", nargs="?", help="the job's TOML file")
    p.add_argument("--archive", metavar="PATH", help="advise for what an existing archive receives")
    p.add_argument("--workload", metavar="NAME", help="advise for a benchmark workload (thesis-small, many-keys, ...)")
    p.add_argument("--sample", action="append", default=[], metavar="[SOURCE=]PATH",
                   help="landed files or directories to sample instead of the source's landing directory "
                        "(repeatable; SOURCE= is needed when the query reads several sources)")
    p.add_argument("--probes-per-update", type=float, default=10.0, metavar="N", help="probes expected per update (default 10)")
    p.add_argument("--scans-per-update", type=float, default=1.0, metavar="M", help="full scans expected per update (default 1)")
    p.add_argument("--updates", type=int, metavar="N",
                   help="predict the first N updates after the initial bulk load, as `ebb bench --updates N` measures "
                        "them (default: the steady state, or with --compare the compared run's schedule)")
    p.add_argument("--calibration", metavar="FILE", help="the calibration to use (default: $XDG_CONFIG_HOME/ebb/calibration.json)")
    p.add_argument("--top", type=int, default=10, metavar="K", help="show the K best layouts (default 10)")
    p.add_argument("--format", choices=["text", "json"], default="text", help="output format (default: text)")
    p.add_argument("--compare", metavar="SUMMARY.csv",
                   help="with --workload: put the predictions beside a recorded `ebb bench` summary (Spearman rank "
                        "correlations of update and probe times; the recommended layout's measured total)")
    p.add_argument("--calibrate", action="store_true", help="measure this machine's constants (about a minute) and store them")
    p.add_argument("--out", metavar="FILE", help="with --calibrate: where to store them (default: the calibration path above)")
    p.add_argument("--dir", metavar="DIR", help="with --calibrate: where to build the micro-benchmark archives "
                                                "(default: the temporary directory; use the disk your archives live on)")
    p.set_defaults(handler=run)


def run(a) -> int:
    inputs = [x for x in (a.job, a.archive, a.workload) if x]
    if a.calibrate:
        if inputs or a.compare or a.sample:
            raise UsageError("--calibrate measures the machine; give no job, --archive, --workload, --sample or --compare with it")
        return _calibrate(a)
    if a.out or a.dir:
        raise UsageError("--out and --dir go with --calibrate")
    if len(inputs) != 1:
        raise UsageError("give one of: a job file, --archive PATH or --workload NAME (or --calibrate)")
    if a.sample and not a.job:
        raise UsageError("--sample goes with a job file")
    if a.compare and not a.workload:
        raise UsageError("--compare goes with --workload (a summary of `ebb bench WORKLOAD`)")
    if a.compare and not os.path.isfile(a.compare):
        raise UsageError(f"--compare {a.compare}: no such file")
    if a.probes_per_update < 0 or a.scans_per_update < 0:
        raise UsageError("--probes-per-update and --scans-per-update must not be negative")
    if a.top < 1 or (a.updates is not None and a.updates < 1):
        raise UsageError("--top and --updates must be at least 1")
    return _advise(a)


def _calibrate(a) -> int:
    from .auto import default_calibration_path
    from .calibrate import calibrate, describe, save

    out = a.out or default_calibration_path()
    say = lambda m: print(m, file=sys.stderr, flush=True)
    say("calibrating: micro-benchmarks of ebb's storage code (about a minute)")
    cal = calibrate(a.dir, say)
    save(cal, out)
    if a.format == "json":
        print(json.dumps(cal.to_dict(), indent=2))
    else:
        print(describe(cal))
        print(f"stored in {out}")
    return 0


def _advise(a) -> int:
    from dataclasses import asdict

    from .auto import check_slots, default_calibration_path, load_calibration
    from .cost_model import Mix, Schedule, candidate_of, rank

    cal = load_calibration(a.calibration)
    mix = Mix(a.probes_per_update, a.scans_per_update)
    schedule = Schedule(updates=a.updates)
    current = None
    among = None
    if a.job:
        prof = _job_profile(a)
    elif a.archive:
        from .cost_model import candidates
        from .workload_profile import archive_profile

        prof, cfg = archive_profile(a.archive)
        cur = candidate_of(cfg)
        current = cur.name
        among = candidates(prof.p) + ([] if cur in candidates(prof.p) else [cur])
    else:
        from ...tools.workloads import WORKLOADS  # `ebb bench`'s workloads
        from . import bench as ab

        if a.workload not in WORKLOADS:
            raise UsageError(f"unknown workload {a.workload!r}; one of {', '.join(WORKLOADS)}")
        prof = ab.workload_profile(WORKLOADS[a.workload])
        if a.updates is not None:
            schedule = ab.bench_schedule(a.workload, a.updates)
        elif a.compare:
            schedule = ab.recorded_schedule(a.compare) or ab.bench_schedule(a.workload)
        if a.compare:
            among = ab.measured_candidates(a.compare, prof.p)
    check_slots(prof)
    ranking = rank(prof, cal, mix, schedule, among)
    comparison = None
    if a.compare:
        from .bench import compare

        comparison = compare(ranking, a.compare, mix)
    if a.format == "json":
        print(json.dumps({
            "workload": asdict(prof),
            "calibration": {"path": a.calibration or default_calibration_path(), "measured": cal.measured},
            "mix": {"probes_per_update": mix.probes, "scans_per_update": mix.scans},
            "schedule": schedule.describe(), "current": current,
            "recommended": ranking[0].to_dict(mix), "ranking": [pr.to_dict(mix) for pr in ranking],
            "comparison": comparison.to_dict() if comparison else None,
        }, indent=2))
        return 0
    print(_report(prof, cal, a.calibration, mix, schedule, ranking, a.top, current, comparison, a.compare))
    return 0


def _job_profile(a):
    from ..commands import load_job_file
    from .workload_profile import job_profile

    job = load_job_file(a.job)
    sources = list(dict.fromkeys(w.source for w in job.query.windows))
    samples: dict[str, list[str]] = {}
    for spec in a.sample:
        name, sep, path = spec.partition("=")
        if not sep:
            if len(sources) > 1:
                raise UsageError(f"the query reads {', '.join(sources)}: write --sample SOURCE=PATH")
            name, path = sources[0], spec
        if name not in sources:
            raise UsageError(f"--sample {spec}: the query reads no source {name!r} (it reads {', '.join(sources)})")
        samples.setdefault(name, []).append(path)
    return job_profile(job, samples)


def _report(prof, cal, cal_path, mix, schedule, ranking, top, current, comparison, summary) -> str:
    """The text output: the workload, the machine, the recommendation, the ranking."""
    import numpy as np

    from .auto import default_calibration_path
    from .bench import measured_layouts

    h = np.asarray(prof.exp_offsets)
    ahead = np.flatnonzero(h[1:] > 0) + 1
    m = cal.measured
    best = ranking[0]
    settings = ", ".join(f"{k} = {json.dumps(v)}" for k, v in best.candidate.settings().items())
    lines = [
        f"workload   {prof.source}",
        f"           {prof.rate:,.0f} records per update (variation {100 * prof.rate_cv:.0f}%), {prof.keys:,} keys, "
        f"{prof.record_bytes:,.0f} bytes stored per record; they expire {ahead.min()}..{ahead.max()} updates after "
        f"arriving (mean {float((np.arange(h.size) * h).sum()):.1f}; {100 * h[0]:.1f}% already expired); "
        f"p = {prof.p}; about {prof.live_records * prof.record_bytes / 1e6:,.1f} MB live",
        f"machine    {cal_path or default_calibration_path()}: measured {m.get('when', '?')} on commit "
        f"{m.get('ebb_commit', '?')} (load {m.get('load_average_before', ['?'])[0]})",
        f"reads      {mix.probes:g} probe{'' if mix.probes == 1 else 's'} and {mix.scans:g} scan{'' if mix.scans == 1 else 's'} per update; {schedule.describe()}",
        "",
        f"recommended: {best.candidate.name}  (in a job's [archive]: {settings})",
    ]
    if current is not None:
        pos = next(i for i, pr in enumerate(ranking) if pr.candidate.name == current)
        cur = ranking[pos]
        lines.append(f"current:     {current}, ranked {pos + 1} of {len(ranking)}; its total is "
                     f"{cur.total(mix) / best.total(mix):.2f}x the recommended layout's")
    meas = measured_layouts(summary) if summary else {}
    head = f"{'rank':>4}  {'layout':<18} {'update s':>9} {'+-':>7} {'probe s':>9} {'scan s':>8} {'disk MB':>9} {'total s':>9}"
    lines += ["", head + ("   measured: update    probe     scan    total" if meas else "")]
    for i, pr in enumerate(ranking, 1):
        name = pr.candidate.name
        if i > top and name != current:
            continue
        row = (f"{i:>4}  {name + (' *' if name == current else ''):<18} {pr.update_s:>9.4g} {pr.update_sd_s:>7.2g} "
               f"{pr.probe_s:>9.4g} {pr.scan_s:>8.4g} {pr.disk_bytes / 1e6:>9,.1f} {pr.total(mix):>9.4g}")
        if name in meas:
            x = meas[name]
            row += (f"   {x['update_s']:>15.4g} {x['probe_s']:>8.4g} {x['scan_s']:>8.4g} "
                    f"{x['update_s'] + mix.probes * x['probe_s'] + mix.scans * x['scan_s']:>8.4g}")
        lines.append(row)
    if len(ranking) > top:
        lines.append(f"      ({len(ranking) - top} more: --top {len(ranking)})")
    if comparison is not None:
        c = comparison
        lines += ["", f"against {summary} ({len(c.doubly)} doubly partitioned layouts):",
                  f"  Spearman rank correlation, update times {c.spearman_update:.3f}, probe times {c.spearman_probe:.3f}",
                  f"  recommended {c.recommended}: measured total {c.recommended_total_s:.4g} s; best measured "
                  f"{c.best} {c.best_total_s:.4g} s ({100 * c.excess:+.1f}%)"]
    if prof.notes:
        lines += [""] + [f"note: {n}" for n in dict.fromkeys(prof.notes)]
    return "\n".join(lines)
