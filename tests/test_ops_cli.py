"""Operating ebb without Spark: strict job files, the catch-up bound, ticks without input that skip
Spark, one-line errors with the exit codes of ebb.storage.errors, and a CLI that loads no heavy
module it does not need. Every case runs the CLI as a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def ebb_in(env: dict, *args) -> subprocess.CompletedProcess:
    """The CLI with exactly ``env`` as its environment."""
    return subprocess.run([sys.executable, "-m", "ebb.tools.cli", *map(str, args)], capture_output=True, text=True, env=env)


def ebb(*args, env: dict | None = None) -> subprocess.CompletedProcess:
    """The CLI in a separate process, with ``env`` added to this one's environment."""
    return ebb_in({**os.environ, **(env or {})}, *args)

WINDOW_JOB = """\
[job]
time_unit = "{unit}"
{origin}
[[source]]
name = "clicks"
path = "landing/clicks"
time_column = "t"
key = "user"
[query]
kind = "window"
source = "clicks"
range = 60
slide = 10
[archive]
path = "archive"
interval = 10
start = 0
"""


def write(tmp_path, text, name="job.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def chronon_job(tmp_path):
    return write(tmp_path, WINDOW_JOB.format(unit="chronon", origin=""))


def one_error_line(r) -> str:
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ebb: error: "), r.stderr
    assert "Traceback" not in r.stderr
    return lines[0]


@pytest.mark.parametrize("old,new,where,suggestion", [
    ("[archive]", "[archiv]", "the job file", "'archive'"),
    ('time_unit = "chronon"', 'time_unt = "chronon"', "[job]", "'time_unit'"),
    ('time_column = "t"', 'time_colum = "t"', "[[source]] number 1 ('clicks')", "'time_column'"),
    ("slide = 10", "slid = 10", "[query] (kind 'window')", "'slide'"),
    ("interval = 10", "intervall = 10", "[archive]", "'interval'"),
    ("slide = 10", "group_by = [\"user\"]", "[query] (kind 'window')", "valid keys:"),
])
def test_unknown_keys_name_the_key_the_place_and_the_closest_valid_key(tmp_path, old, new, where, suggestion):
    text = WINDOW_JOB.format(unit="chronon", origin="")
    assert old in text
    job = write(tmp_path, text.replace(old, new))
    bad = new.split()[0].strip("[]")
    for cmd in ("explain", "run"):
        r = ebb(cmd, job, *(["--ticks", 1] if cmd == "run" else []))
        line = one_error_line(r)
        assert r.returncode == 2
        assert f"unknown key '{bad}' in {where}" in line and suggestion in line, line
    assert not (tmp_path / "archive" / "EBB").exists()


def test_unknown_key_in_a_join_side(tmp_path):
    text = WINDOW_JOB.format(unit="chronon", origin="").replace(
        'kind = "window"\nsource = "clicks"\nrange = 60\nslide = 10',
        'kind = "join"\nleft = {source = "clicks", range = 60}\nright = {source = "clicks", rnge = 30}')
    r = ebb("explain", write(tmp_path, text))
    assert r.returncode == 2 and "unknown key 'rnge' in query.right; did you mean 'range'?" in one_error_line(r)


@pytest.mark.parametrize("query,words", [
    ('kind = "aggregate"\nsource = "clicks"\nrange = 60\nslide = 10\ngroup_by = ["user"]\naggregates = {m = "mean(amount)"}',
     "is not one of count(column)"),
    ('kind = "aggregate"\nsource = "clicks"\nrange = 60\nslide = 10\ngroup_by = ["page"]\naggregates = {n = "count(*)"}',
     "query.key 'user' must be one of query.group_by (page)"),
    ('kind = "distinct"\nsource = "clicks"\nrange = 60', "a distinct query needs the projection"),
])
def test_explain_rejects_what_run_would_and_creates_nothing(tmp_path, query, words):
    text = WINDOW_JOB.format(unit="chronon", origin="").replace(
        'kind = "window"\nsource = "clicks"\nrange = 60\nslide = 10', query)
    job = write(tmp_path, text)
    r = ebb("explain", job)
    assert r.returncode == 2 and words in one_error_line(r)
    r = ebb("run", job, "--ticks", 1)
    assert r.returncode == 2 and words in one_error_line(r)
    assert sorted(os.listdir(tmp_path)) == ["job.toml"]


def test_explain_without_landed_files_says_columns_are_not_checked(tmp_path):
    r = ebb("explain", chronon_job(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "columns    not checked: no file has landed for clicks yet" in r.stdout
    assert "(created by the first `ebb run`)" in r.stdout
    assert sorted(os.listdir(tmp_path)) == ["job.toml"]


def test_missing_job_file_and_debug(tmp_path):
    r = ebb("run", tmp_path / "nope.toml")
    assert r.returncode == 2 and one_error_line(r) == f"ebb: error: job file {tmp_path / 'nope.toml'} does not exist"
    r = ebb("explain", tmp_path / "nope.toml")
    assert r.returncode == 2
    r = ebb("--debug", "run", tmp_path / "nope.toml")
    assert r.returncode == 2 and "Traceback" in r.stderr and r.stderr.strip().endswith("does not exist")
    r = ebb("run", tmp_path / "nope.toml", "--debug")
    assert r.returncode == 2 and "Traceback" in r.stderr


def test_catch_up_bound_refuses_before_creating_anything(tmp_path):
    # origin 2026-01-01, one tick every 10 s: hundreds of thousands of ticks are due
    job = write(tmp_path, WINDOW_JOB.format(unit="s", origin='origin = "2026-01-01T00:00:00Z"'))
    r = ebb("run", job)
    assert r.returncode == 2
    line = one_error_line(r)
    due = int(r.stdout.split(" ticks due")[0].split()[-1])
    assert due > 1000 and "tick 0 at T=0 (2026-01-01 00:00:00 UTC)" in r.stdout
    assert f"{due} ticks are due, more than the catch-up bound of 1000" in line
    for choice in ("--ticks N", "--until T", f"--max-catchup {due}", f"max_catchup = {due}", "archive.start"):
        assert choice in line, choice
    assert not (tmp_path / "archive" / "EBB").exists()
    # --until is bounded too; the job file's max_catchup changes the bound
    r = ebb("run", job, "--until", 20000)
    assert r.returncode == 2 and "2001 ticks are due" in one_error_line(r)
    (tmp_path / "job.toml").write_text(job.read_text().replace("[job]\n", "[job]\nmax_catchup = 5\n"))
    r = ebb("run", job, "--until", 60)
    assert r.returncode == 2 and "7 ticks are due, more than the catch-up bound of 5" in one_error_line(r)
    r = ebb("run", job, "--until", 60, "--max-catchup", 7)
    assert r.returncode == 0, r.stderr
    assert "7 ticks due: tick 0 at T=0" in r.stdout and "ran 7 ticks" in r.stdout


def test_ticks_without_input_skip_spark(tmp_path):
    job = chronon_job(tmp_path)
    r = ebb("run", job, "--ticks", 5)
    assert r.returncode == 0, r.stderr
    assert "starting Spark" not in r.stdout and r.stderr == ""
    assert r.stdout.count("no landed file in its input range, Spark skipped") == 5
    assert r.stdout.splitlines()[-1].startswith("ran 5 ticks in ")
    st = json.loads(ebb("stats", tmp_path / "archive", "--format", "json").stdout)
    assert st["updates"] == 5 and st["last_update_time"] == 40
    r = ebb("run", job, "--until", 40)
    assert r.returncode == 0 and "no tick is due: the next, tick 5, is at T=50" in r.stdout


def test_java_missing_is_one_line(tmp_path):
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    job = chronon_job(tmp_path)
    os.makedirs(tmp_path / "landing" / "clicks")
    pq.write_table(pa.table({"user": np.arange(3), "t": np.arange(3)}), tmp_path / "landing" / "clicks" / "a.parquet")
    r = ebb("run", job, "--ticks", 1, env={"JAVA_HOME": str(tmp_path / "nojava")})
    assert r.returncode == 1 and "Spark needs Java 17 or newer, and JAVA_HOME=" in one_error_line(r)
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = os.path.dirname(sys.executable)
    r = ebb_in(env, "run", job, "--ticks", 1)
    assert r.returncode == 1 and "no `java` on PATH" in one_error_line(r)


def test_stats_lines(tmp_path):
    job = chronon_job(tmp_path)
    assert ebb("run", job, "--ticks", 2).returncode == 0
    out = ebb("stats", tmp_path / "archive").stdout
    layout = next(x for x in out.splitlines() if x.startswith("layout"))
    assert layout.count("n=") <= 1 and "sub-indices" in layout
    state = next(x for x in out.splitlines() if x.startswith("state"))
    assert "last at T=10" in state and "0 late events dropped" in state
    empty = tmp_path / "empty"
    assert ebb("init", empty, "--layout", "wave", "--mode", "rebuild", "--max-lifetime", 20, "--interval", 5,
               "--start", 0).returncode == 0
    state = next(x for x in ebb("stats", empty).stdout.splitlines() if x.startswith("state"))
    assert "no update yet" in state and "None" not in state


def imported(*args) -> set[str]:
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "ebb.tools.cli", *map(str, args)],
                       capture_output=True, text=True)
    return {line.split("|")[-1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")}


def test_light_commands_import_no_heavy_modules(tmp_path):
    mods = imported("--help")
    assert not {"pyspark", "pandas", "pyarrow", "pyarrow.flight"} & mods
    job = chronon_job(tmp_path)
    assert ebb("run", job, "--ticks", 1).returncode == 0
    for args in (("stats", tmp_path / "archive"), ("probe", tmp_path / "archive", 1), ("scan", tmp_path / "archive")):
        mods = imported(*args)
        assert "pyspark" not in mods and "pyarrow.flight" not in mods, args
