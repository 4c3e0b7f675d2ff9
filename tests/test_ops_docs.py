"""Every job example in the documentation is checked by `ebb explain` with Spark analysing it over
real landed files, and the first one runs for a few ticks, so none can rot. Also: explain's
Spark-side checks, quiet Spark, and the one-line error of a landed file that changed. The CLI
runs as a subprocess; explain's Spark-side checks run once that way and, case by case, in this
process on the tests' Spark session (the CLI reuses it; a JVM start per case was half a minute)."""

from __future__ import annotations

import datetime as dt
import glob
import os
import re
import subprocess
import sys
import tomllib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JVM_NOISE = ("WARN", "log4j", "incubator", "NativeCodeLoader", "Using Spark's default")


def ebb(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ebb.tools.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=600)


def doc_examples() -> list[tuple[str, str]]:
    out = []
    for path in sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))) + [os.path.join(ROOT, "README.md")]:
        with open(path) as f:
            for i, block in enumerate(re.findall(r"```toml\n(.*?)```", f.read(), re.S)):
                out.append((f"{os.path.basename(path)}#{i}", block))
    return out


def land_for(job_dir, text: str, times_s=(3500, 3550, 3610, 3650)) -> None:
    """A Parquet file per source with the columns the examples use: key, time column, value."""
    job = tomllib.loads(text)
    origin = dt.datetime.fromisoformat(job["job"]["origin"].replace("Z", "+00:00"))
    for src in job["source"]:
        d = job_dir / src["path"]
        d.mkdir(parents=True, exist_ok=True)
        t = [origin + dt.timedelta(seconds=s) for s in times_s]
        pq.write_table(pa.table({src["key"]: pa.array([1, 2, 1, 3], pa.int64()),
                                 src["time_column"]: pa.array(t, pa.timestamp("us", tz="UTC")),
                                 "value": pa.array([31.5, 20.0, 35.0, 40.0])}), d / "f1.parquet")


def test_every_job_example_in_the_docs_is_checked_by_explain_and_the_first_runs(tmp_path):
    examples = doc_examples()
    kinds = {tomllib.loads(text)["query"]["kind"] for _, text in examples}
    assert kinds == {"window", "join", "lifetime", "aggregate", "distinct"}  # one example per kind at least
    paths = []
    for name, text in examples:
        d = tmp_path / re.sub(r"\W", "_", name)
        d.mkdir()
        (d / "job.toml").write_text(text)
        land_for(d, text)
        paths.append(d / "job.toml")
    r = ebb("explain", *paths)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("columns    ") == len(paths) and "not checked" not in r.stdout
    assert not any(w in r.stderr for w in JVM_NOISE), r.stderr
    for p in paths:
        assert not os.path.exists(p.parent / tomllib.loads(p.read_text())["archive"]["path"])  # explain creates nothing

    first = paths[0]
    r = ebb("run", first, "--ticks", 1)
    assert r.returncode == 0, r.stderr
    assert "starting Spark" in r.stdout and "ran 1 tick" in r.stdout
    assert r.stderr == "", r.stderr  # no JVM or log4j output without --verbose
    st = ebb("stats", first.parent / tomllib.loads(first.read_text())["archive"]["path"])
    assert st.returncode == 0 and re.search(r"\b1 update\b", st.stdout), st.stdout


@pytest.fixture(scope="module")
def landed(tmp_path_factory):
    d = tmp_path_factory.mktemp("explain")
    text = doc_examples()[0][1]
    land_for(d, text)
    return d, text


@pytest.mark.parametrize("old,new,words", [
    ('select = ["sensor", "value"]', 'select = ["value"]', "query.key 'sensor' is not an output column (columns: value)"),
    ('select = ["sensor", "value"]', 'select = ["sensor", "nosuch + 1"]', "Spark cannot run it: [UNRESOLVED_COLUMN"),
    ('filter = "value > 30"', 'filter = "value >"', "Spark cannot run it: [PARSE_SYNTAX_ERROR]"),
], ids=["select-without-key", "unknown-column", "bad-expression"])
def test_explain_analyses_the_query_with_spark(spark, landed, capsys, old, new, words):
    from ebb.tools.cli import main

    d, text = landed
    assert old in text and "kind = \"window\"" in text
    (d / "job.toml").write_text(text.replace(old, new))
    rc = main(["explain", str(d / "job.toml")])
    lines = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("ebb: error: "), lines
    assert words in lines[0], lines[0]


def test_explain_error_is_one_line_from_the_cli(landed):
    """One of the cases above through a real `ebb explain` process: exit 2, one line, no JVM noise."""
    d, text = landed
    (d / "job.toml").write_text(text.replace('select = ["sensor", "value"]', 'select = ["sensor", "nosuch + 1"]'))
    r = ebb("explain", d / "job.toml")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("ebb: error: "), r.stderr
    assert "Spark cannot run it: [UNRESOLVED_COLUMN" in lines[0]


def test_a_landed_file_that_changed_is_one_error_line(spark, landed, tmp_path):
    from ebb.indexer.jobspec import load_job
    from ebb.indexer.scheduler import Scheduler

    d, text = landed
    (d / "job.toml").write_text(text)
    with Scheduler(load_job(str(d / "job.toml")), say=lambda m: None) as s:  # on the tests' Spark session
        assert s.run(ticks=1) == 1
    f = d / "landing" / "temperature" / "f1.parquet"
    os.utime(f, ns=(os.stat(f).st_atime_ns, os.stat(f).st_mtime_ns + 10**9))  # as `cp -r` would
    r = ebb("run", d / "job.toml", "--ticks", 1)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1, r.stderr
    assert "changed (modification time) after it was processed" in lines[0] and "cp -a" in lines[0]
