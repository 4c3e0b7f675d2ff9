"""Output people can read (issue 27): the picture of the archive (`ebb stats --plot`) and the data
it draws, times as timestamps, JSON from run/explain/verify, the catch-up summary, exit codes.
Every case runs the CLI as a subprocess; none needs Spark (ticks without landed input skip it)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from support import ebb
from test_ops_cli import WINDOW_JOB, chronon_job, write

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def make_archive(tmp_path, mode: str = "norebuild", origin: bool = True, n: int = 3000):
    arc = tmp_path / f"arc-{mode}"
    extra = ["--time-unit", "s"] + (["--origin", "2026-01-01T00:00:00Z"] if origin else [])
    r = ebb("init", arc, "--layout", "doubly", "--G", 3, "--E", 3, "--mode", mode, "--max-lifetime", 600,
            "--interval", 60, "--start", 0, *extra)
    assert r.returncode == 0, r.stderr
    k = np.arange(n, dtype=np.int64)
    f = tmp_path / "bulk.parquet"
    pq.write_table(pa.table({"key": k, "ts": np.zeros(n, np.int64), "exp": k % 600 + 1, "v": k * 0.5}), f)
    assert ebb("load", arc, f, "--at", 0, "--quiet").returncode == 0
    more = tmp_path / "next.parquet"
    pq.write_table(pa.table({"key": k[:100], "ts": np.full(100, 60, np.int64), "exp": 60 + k[:100] % 540 + 1,
                             "v": k[:100] * 1.0}), more)
    assert ebb("load", arc, more, "--at", 60, "--quiet").returncode == 0
    return arc


def true_expiry(n: int = 3000) -> dict[int, int]:
    """Records of ``make_archive`` that expire at each update slot after the one at T=60."""
    k = np.arange(n)
    exps = np.concatenate([k % 600 + 1, 60 + k[:100] % 540 + 1])
    exps = exps[exps > 60]
    slots, counts = np.unique(-(-exps // 60), return_counts=True)
    return dict(zip(slots.tolist(), counts.tolist()))


@pytest.mark.parametrize("mode", ["norebuild", "rebuild"])
def test_plot_writes_a_png_of_what_stats_says(tmp_path, mode):
    pytest.importorskip("matplotlib")
    arc = make_archive(tmp_path, mode)
    png = tmp_path / "arc.png"
    r = ebb("stats", arc, "--plot", png, "--format", "json", "--next", 5)
    assert r.returncode == 0, r.stderr
    assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 10_000
    drawn = json.loads(r.stdout)
    # the data drawn is what `ebb stats` and `ebb plan` say
    plain = json.loads(ebb("stats", arc, "--format", "json", "--next", 5).stdout)
    for key in ("grid", "expiry_timeline", "next_updates", "estimated"):
        assert drawn[key] == plain[key], key
    cells = {c["subindex"]: (c["records"], c["bytes"]) for row in drawn["grid"]["cells"] for c in row}
    assert cells == {s["subindex"]: (s["records"], s["bytes"]) for s in drawn["subindices"]}
    assert (drawn["grid"]["rows"], drawn["grid"]["columns"]) == (3, 3)
    assert drawn["next_updates"] == json.loads(ebb("plan", arc, "--updates", 5, "--format", "json").stdout)
    # the timeline accounts for every stored byte and record: exactly (NoRebuild sections), or
    # spread over each Rebuild block's exp range (estimated, totals kept up to rounding)
    timeline = drawn["expiry_timeline"]
    assert sum(e["bytes"] for e in timeline) == pytest.approx(drawn["bytes"], abs=len(timeline))
    assert sum(e["records"] for e in timeline) == pytest.approx(drawn["records"], abs=len(timeline))
    assert all(e["slot"] > drawn["last_slot"] for e in timeline)
    if mode == "norebuild":
        assert drawn["estimated"] is False
        assert {e["slot"]: e["records"] for e in timeline} == true_expiry()
    else:
        assert drawn["estimated"] is True


def test_plot_without_matplotlib_is_a_usage_error(tmp_path):
    arc = make_archive(tmp_path)
    code = ("import sys; sys.modules['matplotlib'] = None\n"
            "from ebb.tools.cli import main; sys.exit(main(sys.argv[1:]))")
    r = subprocess.run([sys.executable, "-c", code, "stats", str(arc), "--plot", str(tmp_path / "a.png")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "pip install 'ebb[plot]'" in r.stderr and not (tmp_path / "a.png").exists()


def test_times_are_timestamps_when_the_archive_knows_its_clock(tmp_path):
    arc = make_archive(tmp_path)
    r = ebb("probe", arc, 42)
    # key 42: loaded at T=0 expiring at 43, and again at T=60 (ts 60, exp 103), the one valid now
    assert r.returncode == 0 and "2026-01-01T00:01:00Z" in r.stdout and "2026-01-01T00:01:43Z" in r.stdout
    assert r.stderr == "1 record\n"
    r = ebb("probe", arc, 42, "--raw-time")
    assert "2026-01-01" not in r.stdout and r.stdout.splitlines()[2].split()[:3] == ["42", "60", "103"]
    # CSV and JSON lines keep the chronons and add the timestamps beside them
    row = json.loads(ebb("probe", arc, 42, "--format", "jsonl").stdout)
    assert (row["ts"], row["exp"], row["ts_time"], row["exp_time"]) == (60, 103, "2026-01-01T00:01:00Z", "2026-01-01T00:01:43Z")
    assert set(json.loads(ebb("probe", arc, 42, "--format", "jsonl", "--raw-time").stdout)) == {"key", "ts", "exp", "v"}
    head = ebb("scan", arc, "--format", "csv").stdout.splitlines()[0]
    assert head == '"key","ts","exp","v","ts_time","exp_time"'
    out = tmp_path / "s.parquet"
    assert ebb("scan", arc, "--format", "parquet", "--out", out).returncode == 0
    assert pq.read_schema(out).names == ["key", "ts", "exp", "v"]
    # --as-of takes a timestamp: 00:01:30 is chronon 90
    by_time = ebb("scan", arc, "--as-of", "2026-01-01T00:01:30Z", "--format", "csv", "--raw-time").stdout
    assert by_time == ebb("scan", arc, "--as-of", 90, "--format", "csv", "--raw-time").stdout
    # stats and plan
    st = ebb("stats", arc).stdout
    assert "last at T=60 (2026-01-01T00:01:00Z)" in st and "chronon 0 is 2026-01-01T00:00:00Z" in st
    assert "2026-01-01" not in ebb("stats", arc, "--raw-time").stdout.replace("chronon 0 is 2026-01-01T00:00:00Z", "")
    assert "2026-01-01T00:02:00Z" in ebb("plan", arc).stdout
    assert "2026-01-01" not in ebb("plan", arc, "--raw-time").stdout


def test_an_archive_without_origin_shows_chronons(tmp_path):
    arc = make_archive(tmp_path, origin=False)
    r = ebb("probe", arc, 42)
    assert "2026" not in r.stdout and r.stdout.splitlines()[2].split()[:3] == ["42", "60", "103"]
    assert "ts_time" not in ebb("scan", arc, "--format", "csv").stdout.splitlines()[0]
    r = ebb("scan", arc, "--as-of", "2026-01-01T00:01:30Z")
    assert r.returncode == 2 and "time unit and origin" in r.stderr


def test_scan_parquet_without_out_is_a_usage_error(tmp_path):
    arc = make_archive(tmp_path)
    for cmd in (("scan", arc), ("probe", arc, 1)):
        r = ebb(*cmd, "--format", "parquet")
        assert r.returncode == 2 and r.stderr.startswith("ebb: error: --format parquet needs --out FILE"), r.stderr


def test_verify_json(tmp_path):
    arc = make_archive(tmp_path)
    r = ebb("verify", arc, "--format", "json")
    doc = json.loads(r.stdout)
    runs = sum(s["runs"] for s in json.loads(ebb("stats", arc, "--format", "json").stdout)["subindices"])
    assert r.returncode == 0 and doc == {"ok": True, "problems": [], "notes": [], "runs_checked": runs}
    assert ebb("verify", arc).stdout.strip() == f"verify: ok ({runs} runs checked)"
    victim = next((arc / "data").iterdir())
    victim.write_bytes(victim.read_bytes()[:-7])
    r = ebb("verify", arc, "--format", "json")
    doc = json.loads(r.stdout)
    assert r.returncode == 5 and doc["ok"] is False and doc["problems"]


def test_catch_up_prints_a_summary_and_json(tmp_path):
    job = chronon_job(tmp_path)
    r = ebb("run", job, "--ticks", 1)
    assert r.returncode == 0, r.stderr
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("ran 1 tick in ") and "0 results archived from 0 new files, 0 late events dropped" in last
    assert r.stdout.count("Spark skipped") == 1  # a short run shows each tick's line ...
    r = ebb("run", job, "--until", 200)  # ... a long one (ticks 1 to 20) only the summary ...
    assert "Spark skipped" not in r.stdout and r.stdout.splitlines()[0].startswith("20 ticks due")
    assert r.stdout.strip().splitlines()[-1].startswith("ran 20 ticks in ")
    r = ebb("run", job, "--ticks", 12, "--verbose")  # ... unless asked
    assert r.stdout.count("no landed file in its input range, Spark skipped") == 12
    r = ebb("run", job, "--ticks", 3, "--format", "json")
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert [x["event"] for x in lines] == ["tick", "tick", "tick", "summary"]
    assert [x["tick"] for x in lines[:3]] == [33, 34, 35] and [x["time"] for x in lines[:3]] == [330, 340, 350]
    assert lines[-1]["ticks"] == 3 and lines[-1]["last_tick"] == 35 and lines[-1]["results"] == 0
    st = json.loads(ebb("stats", tmp_path / "archive", "--format", "json").stdout)
    assert st["updates"] == 36 and st["config"].get("origin") is None  # chronon time has no origin


def test_run_records_the_jobs_origin(tmp_path):
    job = write(tmp_path, WINDOW_JOB.format(unit="s", origin='origin = "2026-01-01T00:00:00Z"'))
    r = ebb("run", job, "--until", 20, "--max-catchup", 5)
    assert r.returncode == 0, r.stderr
    st = json.loads(ebb("stats", tmp_path / "archive", "--format", "json").stdout)
    assert st["config"]["origin"] == "2026-01-01T00:00:00Z" and st["config"]["time_unit"] == "s"
    assert "last at T=20 (2026-01-01T00:00:20Z)" in ebb("stats", tmp_path / "archive").stdout


def test_explain_checks_every_job_and_reports_each(tmp_path):
    good = chronon_job(tmp_path)
    bad = write(tmp_path, WINDOW_JOB.format(unit="chronon", origin="").replace("range = 60", "range = -5"), "bad.toml")
    r = ebb("explain", bad, good)
    assert r.returncode == 2
    assert f"== {bad}" in r.stdout and f"== {good}" in r.stdout and "pattern    weakest non-monotonic" in r.stdout
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("ebb: error: ")
    r = ebb("explain", good, bad, "--format", "json")
    doc = json.loads(r.stdout)
    assert r.returncode == 2 and doc["exit_code"] == 2
    ok, failed = doc["jobs"]
    assert ok["ok"] and ok["exit_code"] == 0 and ok["pattern"] == "weakest non-monotonic" and ok["delta"] == 10
    assert ok["columns"] is None and ok["columns_unchecked"] == ["clicks"]
    assert not failed["ok"] and failed["exit_code"] == 2 and "range" in failed["error"]
    r = ebb("explain", good, "--format", "json")
    assert r.returncode == 0 and json.loads(r.stdout)["exit_code"] == 0


def test_fast_commands_load_no_optional_module(tmp_path):
    """probe, scan and stats start fast: matplotlib, tqdm, duckdb and pyspark stay unimported."""
    arc = make_archive(tmp_path)
    code = ("import sys\nfrom ebb.tools.cli import main\n"
            f"for argv in (['probe', {str(arc)!r}, '42'], ['scan', {str(arc)!r}, '--format', 'csv', '--out', {str(tmp_path / 'o.csv')!r}], "
            f"['stats', {str(arc)!r}]):\n    assert main(argv) == 0\n"
            "print(sorted(m for m in ('matplotlib', 'tqdm', 'duckdb', 'pyspark') if m in sys.modules), file=sys.stderr)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr.strip().splitlines()[-1] == "[]", r.stderr


def test_spark_messages_hide_internal_columns():
    from ebb.indexer.tick import public_message

    msg = ("[UNRESOLVED_COLUMN.WITH_SUGGESTION] A column with name `nosuch` cannot be resolved. "
           "Did you mean one of the following? [`user`, `__t`, `t`, `__file`].")
    assert public_message(msg).endswith("[`user`, `t`].") and "__" not in public_message(msg)
