"""The layout advisor (docs/advisor.md): its validation against the recorded thesis-small
benchmark, the structure of its cost model, the counts it predicts against the engine's own, the
statistics it derives from samples, calibration, `layout = "auto"`, and the `ebb advise` CLI.

Nothing here runs a benchmark: the validation uses the recorded summary of the thesis-small run
on commit 7c09555 (tests/data/bench-7c09555/summary-thesis-small.csv, with the run's schedule in
plan-thesis-small.json: copies of what docs/benchmarks held then, so that re-running the
benchmark does not move this test) and the recorded calibration tests/data/advisor-calibration.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest

from ebb.indexer.advisor.bench import compare, measured_candidates, recorded_schedule, spearman, workload_profile
from ebb.indexer.advisor.cost_model import Calibration, Candidate, Mix, candidate_of, candidates, predict, rank
from ebb.indexer.advisor.layout_sim import simulate
from ebb.indexer.advisor.workload_profile import archive_profile, job_profile, uniform_lifetime_offsets
from ebb.indexer.jobspec import load_job
from ebb.storage.errors import UsageError
from ebb.tools.workloads import WORKLOADS, Workload

ROOT = Path(__file__).resolve().parents[1]
SUMMARY = ROOT / "tests" / "data" / "bench-7c09555" / "summary-thesis-small.csv"
CALIBRATION = ROOT / "tests" / "data" / "advisor-calibration.json"
MIX = Mix(probes=10, scans=1)


def calibration() -> Calibration:
    return Calibration.from_dict(json.loads(CALIBRATION.read_text()), str(CALIBRATION))


def ebb(*args, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ebb.tools.cli", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})


def one_error_line(r: subprocess.CompletedProcess) -> str:
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ebb: error: "), r.stderr
    return lines[0]


# -- the acceptance: right where it matters ------------------------------------------------------
@pytest.fixture(scope="module")
def thesis_small():
    prof = workload_profile(WORKLOADS["thesis-small"])
    schedule = recorded_schedule(str(SUMMARY))
    assert schedule is not None and schedule.updates == 12
    ranking = rank(prof, calibration(), MIX, schedule, measured_candidates(str(SUMMARY), prof.p))
    return compare(ranking, str(SUMMARY), MIX)


def test_predicted_ranking_of_update_times_follows_the_benchmark(thesis_small):
    assert len(thesis_small.doubly) == 16
    assert thesis_small.spearman_update >= 0.8


def test_predicted_ranking_of_probe_times_follows_the_benchmark(thesis_small):
    assert thesis_small.spearman_probe >= 0.8


def test_recommended_layout_is_within_15_percent_of_the_best_measured_total(thesis_small):
    assert thesis_small.excess <= 0.15, thesis_small


# -- the model's structure -----------------------------------------------------------------------
def steady(prof, cand):
    return simulate(cand.layout_obj(prof.p), cand.mode, prof.flow(), prof.block_bytes, bulk=False, warmup=prof.p,
                    steps=prof.p)


@pytest.mark.parametrize("g,e", [(2, 2), (3, 3), (4, 4), (5, 5), (2, 8), (8, 2)])
@pytest.mark.parametrize("partitioning", ["round-robin", "chronological"])
def test_rebuild_rewrites_g_plus_e_minus_1_over_g_times_e_of_the_data(g, e, partitioning):
    prof = workload_profile(WORKLOADS["thesis-small"])
    tr = steady(prof, Candidate("doubly", "rebuild", partitioning=partitioning, G=g, E=e))
    share = tr.update["read_bytes"].mean() / tr.live_bytes.mean()
    assert share == pytest.approx((g + e - 1) / (g * e), rel=0.03)
    assert tr.update["touched"].mean() == pytest.approx(g + e - 1, abs=0.01)


def test_norebuild_writes_only_the_new_records():
    prof = workload_profile(WORKLOADS["thesis-small"])
    new = prof.rate * (1 - prof.exp_offsets[0]) * prof.record_bytes
    for cand in (c for c in candidates(prof.p) if c.mode == "norebuild"):
        tr = steady(prof, cand)
        assert not tr.update["read_bytes"].any(), cand.name
        blocks = tr.update["written_blocks"].mean()
        assert tr.update["written_bytes"].mean() == pytest.approx(new + blocks * prof.block_overhead_bytes), cand.name


def test_rebuild_update_time_falls_with_n_and_norebuild_probes_cost_more():
    prof, cal = workload_profile(WORKLOADS["thesis-small"]), calibration()
    times = [predict(prof, Candidate("doubly", "rebuild", G=g, E=g), cal).update_s for g in (2, 3, 4, 5)]
    assert times == sorted(times, reverse=True)
    for g in (2, 3, 4, 5):
        rb = predict(prof, Candidate("doubly", "rebuild", G=g, E=g), cal)
        nr = predict(prof, Candidate("doubly", "norebuild", G=g, E=g), cal)
        assert nr.update_s < rb.update_s and nr.probe_s > rb.probe_s
        assert nr.probe_sections > 10 * rb.probe_sections


def test_only_insert_and_delete_targets_hold_what_an_update_touches():
    """The simulation touches the sub-indices holding records that expire now or arrive now;
    storage/layout.py's targets must contain them (the engine touches no others)."""
    for cand in candidates(36):
        lay = cand.layout_obj(36)
        for j in range(1, 80, 7):
            k = np.arange(j - 36, j)
            expiring = set(lay.subindex_of(k, np.full(k.size, j)).tolist())
            arriving = set(lay.subindex_of(np.full(36, j), j + np.arange(1, 37)).tolist())
            assert expiring <= set(lay.delete_targets([j])), (cand.name, j)
            assert arriving <= set(lay.insert_targets(j)), (cand.name, j)


def test_rate_variation_spreads_rebuild_updates_more_than_norebuild():
    prof = replace(workload_profile(WORKLOADS["thesis-small"]), rate_cv=0.5)
    cal = calibration()
    rb = predict(prof, Candidate("doubly", "rebuild", G=2, E=2), cal)
    nr = predict(prof, Candidate("doubly", "norebuild", G=2, E=2), cal)
    assert rb.update_sd_s > 3 * nr.update_sd_s > 0
    assert predict(replace(prof, rate_cv=0.0), Candidate("doubly", "rebuild", G=2, E=2), cal).update_sd_s == 0


def test_counts_follow_the_engine(tmp_path):
    """The simulated counts of a small workload against the engine's own: update records and
    read plans of a real archive fed the same workload."""
    from ebb.storage.archive import Archive
    from ebb.storage.config import build_config
    from ebb.storage.read_plan import Probe, Scan

    w = Workload("tiny", record_bytes=200, keys=50, per_slot=3000, updates=6, p=8)
    prof = replace(workload_profile(w), block_bytes=16384)
    for cand in (Candidate("doubly", "rebuild", G=3, E=3), Candidate("doubly", "norebuild", partitioning="chronological", G=2, E=4),
                 Candidate("wave", "rebuild", n=4), Candidate("wave", "norebuild", n=4, section_slots=3)):
        cfg = build_config(interval=w.delta, max_lifetime=w.max_lifetime, start=0, block_bytes=16384, **cand.settings())
        got = {k: [] for k in ("touched", "read", "written", "blocks", "probe_blocks", "scan_blocks")}
        with Archive.create(str(tmp_path / cand.name), cfg) as arc:
            for j, at, batch in w.batches():
                rec = arc.load(batch, at)
                if j == 0:
                    continue
                with arc.snapshot() as snap:
                    probes = [sum(len(t.blocks) for t in snap.plan(Probe((key,)))) for key in range(w.keys)]
                    scan = sum(len(t.blocks) for t in snap.plan(Scan()))
                for k, v in zip(got, (len(rec["subindices_touched"]), rec["bytes_read"], rec["bytes_written"],
                                      rec["blocks_written"], np.mean(probes), scan)):
                    got[k].append(v)
        tr = simulate(cand.layout_obj(w.p), cand.mode, prof.flow(), prof.block_bytes, bulk=True, warmup=0, steps=w.updates,
                      section_slots=cand.section_slots)
        model = {"touched": tr.update["touched"], "read": tr.update["read_bytes"], "written": tr.update["written_bytes"],
                 "blocks": tr.update["written_blocks"], "probe_blocks": tr.probe["blocks"], "scan_blocks": tr.scan["blocks"]}
        for k, v in model.items():
            assert v.mean() == pytest.approx(np.mean(got[k]), rel=0.1, abs=1), (cand.name, k)


# -- statistics from samples ---------------------------------------------------------------------
def test_uniform_lifetime_offsets():
    h = uniform_lifetime_offsets(1000, 36)
    assert h.sum() == pytest.approx(1.0)
    assert h[0] == pytest.approx(1 / 72, rel=0.01) and h[36] == pytest.approx(1 / 72, rel=0.01)
    assert np.allclose(h[1:36], 1 / 36, rtol=0.01)


JOB = """\
[job]
time_unit = "chronon"
[[source]]
name = "temperature"
path = "landing/temperature"
time_column = "t"
key = "sensor"
lifetime = 600
[[source]]
name = "humidity"
path = "landing/humidity"
time_column = "t"
key = "sensor"
lifetime = 900
[query]
{query}
[archive]
path = "archive"
interval = 60
start = 0
"""


def landed_job(tmp_path, query: str, hours: int = 6) -> Path:
    from ebb.indexer.synthetic import SensorFleet, land

    temp, hum = SensorFleet(1000, 600, seed=1), SensorFleet(1000, 900, seed=2)
    for i in range(hours):
        land(temp.polls(i * 3600, (i + 1) * 3600), str(tmp_path / "landing" / "temperature"), f"t{i:03d}.parquet")
        land(hum.polls(i * 3600, (i + 1) * 3600), str(tmp_path / "landing" / "humidity"), f"h{i:03d}.parquet")
    path = tmp_path / "job.toml"
    path.write_text(JOB.format(query=query))
    return path


def test_window_profile_from_landed_events(tmp_path):
    job = load_job(str(landed_job(tmp_path, 'kind = "window"\nsource = "temperature"\nrange = 600\nslide = 60')))
    prof = job_profile(job)
    assert prof.p == 10 and prof.keys == 1000
    assert prof.rate == pytest.approx(1000 * 60 / 600 * 0.98, rel=0.05)  # 2% of polls are lost
    assert prof.rate_cv < 0.1
    assert prof.exp_offsets[10] > 0.99  # every result lives the window: 10 updates
    assert prof.visible_bytes == pytest.approx(8 + 8 + 16)  # sensor, value, ts, exp
    assert prof.record_bytes == prof.visible_bytes + 8


def test_aggregate_profile_is_bursty_and_lives_one_slide(tmp_path):
    q = 'kind = "aggregate"\nsource = "temperature"\nrange = 1800\nslide = 300\ngroup_by = ["sensor"]\naggregates = { n = "count(*)" }'
    prof = job_profile(load_job(str(landed_job(tmp_path, q))))
    assert prof.p == 5 and prof.exp_offsets[5] == pytest.approx(1.0)
    assert prof.rate == pytest.approx(1000 * 60 / 300, rel=0.05)  # a row per sensor per slide
    assert prof.rate_cv > 1.5  # all of them land in every fifth update


def test_join_profile_counts_overlapping_pairs(tmp_path):
    q = 'kind = "join"\nkey = "sensor"\nleft = { source = "temperature", range = 600 }\nright = { source = "humidity", range = 900 }'
    prof = job_profile(load_job(str(landed_job(tmp_path, q))))
    # per sensor, a reading every 600 and one every 900 chronons: intervals of 600 and 900 overlap
    # when their starts are less than 600 (one way) or 900 (the other) apart: 1500 / (600 * 900)
    # pairs per chronon and sensor
    assert prof.rate == pytest.approx(1000 * 60 * 1500 / (600 * 900) * 0.98 ** 2, rel=0.1)
    assert prof.p == 10  # S = min(600, 900)
    assert 0.05 < prof.exp_offsets[0] < 0.5  # short overlaps expire in the slot they start in: dropped at load


def test_sample_option_and_its_errors(tmp_path):
    path = landed_job(tmp_path, 'kind = "lifetime"\nsources = ["humidity"]')
    job = load_job(str(path))
    one = sorted((tmp_path / "landing" / "humidity").iterdir())[:2]
    prof = job_profile(job, {"humidity": [str(f) for f in one]})
    assert prof.p == 15 and prof.exp_offsets[15] > 0.99
    with pytest.raises(UsageError, match="does not exist"):
        job_profile(job, {"humidity": [str(tmp_path / "nothing")]})


def test_archive_profile_recovers_the_workload(tmp_path):
    from ebb.storage.archive import Archive
    from ebb.storage.config import build_config

    w = Workload("tiny", record_bytes=200, keys=40, per_slot=2000, updates=14, p=8)
    cfg = build_config(layout="doubly", mode="norebuild", G=2, E=2, interval=w.delta, max_lifetime=w.max_lifetime, start=0)
    with Archive.create(str(tmp_path / "a"), cfg) as arc:
        for _, at, batch in w.batches():
            arc.load(batch, at)
    prof, config = archive_profile(str(tmp_path / "a"))
    expected = workload_profile(w)
    # the workload hands ebb only records not yet expired: compare what is stored
    stored = lambda pr: pr.rate * (1 - pr.exp_offsets[0])
    assert stored(prof) == pytest.approx(stored(expected), rel=0.02) and prof.keys == 40 and prof.p == 8
    h, h_expected = np.array(prof.exp_offsets[1:]), np.array(expected.exp_offsets[1:])
    assert np.abs(h / h.sum() - h_expected / h_expected.sum()).sum() < 0.15
    assert prof.record_bytes == pytest.approx(expected.record_bytes, rel=0.02)
    assert config["mode"] == "norebuild"


# -- calibration ---------------------------------------------------------------------------------
def test_nnls_recovers_non_negative_coefficients():
    from ebb.indexer.advisor.calibrate import nnls

    rng = np.random.default_rng(1)
    a = rng.random((40, 4))
    x = np.array([2.0, 0.0, 0.5, 3.0])
    assert np.allclose(nnls(a, a @ x), x, atol=1e-9)
    assert (nnls(a, a @ np.array([1.0, -2.0, 1.0, 1.0])) >= 0).all()


def test_recorded_calibration_says_where_it_was_measured():
    cal = calibration()
    for field in ("when", "ebb_commit", "cpu", "cores", "load_average_before", "fit"):
        assert field in cal.measured
    assert cal.update["read_bytes"] > 0 and cal.update["written_bytes"] > 0 and cal.probe["blocks"] > 0


def test_spearman_with_ties():
    assert spearman(np.array([1, 2, 3, 4.0]), np.array([10, 20, 30, 40.0])) == pytest.approx(1.0)
    assert spearman(np.array([1, 2, 3, 4.0]), np.array([4, 3, 2, 1.0])) == pytest.approx(-1.0)
    assert spearman(np.array([1, 1, 2, 3.0]), np.array([1, 2, 3, 4.0])) == pytest.approx(0.9487, abs=1e-4)


# -- layout = "auto" -----------------------------------------------------------------------------
def test_auto_layout_uses_the_advisor_once_calibrated(tmp_path, monkeypatch):
    from ebb.indexer.patterns import classify
    from ebb.indexer.scheduler import archive_config

    path = landed_job(tmp_path, 'kind = "lifetime"\nsources = ["temperature", "humidity"]')
    job = load_job(str(path))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))  # tests/conftest.py sets an empty one too
    before = archive_config(job, classify(job))
    assert (before.layout, before.G, before.E, before.mode) == ("doubly", 2, 2, "rebuild")  # the pattern's default
    (tmp_path / "config" / "ebb").mkdir(parents=True)
    (tmp_path / "config" / "ebb" / "calibration.json").write_text(CALIBRATION.read_text())
    cfg = archive_config(job, classify(job))
    assert candidate_of(asdict(cfg)) == rank(job_profile(job), calibration(), MIX)[0].candidate


# -- the CLI -------------------------------------------------------------------------------------
def test_cli_json_for_a_workload_against_its_summary():
    r = ebb("advise", "--workload", "thesis-small", "--compare", SUMMARY, "--calibration", CALIBRATION, "--format", "json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["schedule"].startswith("updates 1..12") and out["mix"] == {"probes_per_update": 10.0, "scans_per_update": 1.0}
    assert out["recommended"] == out["ranking"][0] and len(out["ranking"]) == 18
    assert {"update_s", "probe_s", "scan_s", "disk_bytes", "total_s", "settings"} <= set(out["recommended"])
    assert out["comparison"]["spearman_update"] >= 0.8 and out["comparison"]["excess"] <= 0.15


def test_cli_text_for_a_job(tmp_path):
    path = landed_job(tmp_path, 'kind = "window"\nsource = "temperature"\nrange = 600', hours=2)
    r = ebb("advise", path, "--calibration", CALIBRATION, "--top", 3, "--probes-per-update", 100)
    assert r.returncode == 0, r.stderr
    assert "recommended: " in r.stdout and "100 probes and 1 scan per update" in r.stdout
    assert "steady state" in r.stdout and "more: --top" in r.stdout


@pytest.mark.parametrize("args,needle", [
    ((), "give one of"),
    (("--workload", "nope"), "unknown workload 'nope'"),
    (("--workload", "thesis-small", "--top", "0"), "--top and --updates must be at least 1"),
    (("--calibrate", "--workload", "thesis-small"), "--calibrate measures the machine"),
    (("--workload", "thesis-small", "--sample", "x"), "--sample goes with a job file"),
    (("--workload", "thesis-small", "--probes-per-update", "-1"), "must not be negative"),
    (("--archive", "/nonexistent/arc"), "is not an ebb archive"),
])
def test_cli_errors_are_one_line(args, needle):
    r = ebb("advise", *args, "--calibration", CALIBRATION)
    assert r.returncode in (1, 2) and needle in one_error_line(r), r.stderr


def test_cli_without_calibration_says_how_to_make_one(tmp_path):
    r = ebb("advise", "--workload", "thesis-small", env={"XDG_CONFIG_HOME": str(tmp_path)})
    assert r.returncode == 2 and "ebb advise --calibrate" in one_error_line(r)
    bad = tmp_path / "bad.json"
    bad.write_text('{"update": {"fixed": -1}}')
    r = ebb("advise", "--workload", "thesis-small", "--calibration", bad)
    assert r.returncode == 2 and "bad.json" in one_error_line(r)


def test_cli_sample_needs_a_source_name_when_the_query_reads_several(tmp_path):
    q = 'kind = "join"\nkey = "sensor"\nleft = { source = "temperature", range = 600 }\nright = { source = "humidity", range = 900 }'
    path = landed_job(tmp_path, q, hours=1)
    r = ebb("advise", path, "--calibration", CALIBRATION, "--sample", tmp_path / "landing")
    assert r.returncode == 2 and "--sample SOURCE=PATH" in one_error_line(r)
