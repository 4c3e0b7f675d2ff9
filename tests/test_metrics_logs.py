"""The metrics endpoint and the structured logs of ebb's service processes, run for real: a
`ebb serve` process is read through FlightArchiveClient and its /metrics scraped over HTTP; a
`ebb run --follow` process runs a small job with a 2-second Delta, and its /metrics and JSON logs
are checked against the archive's update log. Also: a read-only command never imports
prometheus_client, and --metrics-port without it is a one-line usage error."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from ebb.indexer.synthetic import land
from ebb.query.flight_client import FlightArchiveClient
from ebb.storage.archive import Archive
from ebb.storage.config import build_config

from support import ebb

pytest.importorskip("prometheus_client")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> dict[str, float]:
    """The samples of http://127.0.0.1:port/metrics: ``name{labels}`` -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def scrape_soon(port: int) -> dict[str, float]:
    """``scrape``, or nothing while the endpoint is not up yet."""
    try:
        return scrape(port)
    except (urllib.error.URLError, ConnectionError):
        return {}


def healthz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def start(args: list, tmp_path, name: str) -> subprocess.Popen:
    """``ebb *args`` in the background, its stdout and stderr in files under tmp_path."""
    out, err = open(tmp_path / f"{name}.out", "w"), open(tmp_path / f"{name}.err", "w")
    return subprocess.Popen([sys.executable, "-m", "ebb.tools.cli", *map(str, args)], stdout=out, stderr=err, text=True)


def json_lines(path) -> list[dict]:
    """Every line of ``path`` parsed as JSON (a line that is not fails the test)."""
    return [json.loads(line) for line in open(path).read().splitlines() if line.strip()]


def wait_for(what, timeout: float = 60.0, every: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def stop(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise


@pytest.fixture
def archive(tmp_path):
    path = str(tmp_path / "arc")
    cfg = build_config(layout="doubly", mode="rebuild", interval=10, max_lifetime=60, start=0, G=2, E=2)
    with Archive.create(path, cfg) as a:
        for at, keys in ((0, range(0, 100)), (10, range(50, 150)), (20, range(120, 160))):
            a.load(pa.table({"key": pa.array(keys, pa.int64()), "ts": pa.array([at] * len(keys), pa.int64()),
                             "exp": pa.array([at + 40] * len(keys), pa.int64())}), at)
    return path


def test_serve_metrics_count_reads_by_kind_and_match_stats(archive, tmp_path):
    port = free_port()
    proc = start(["serve", archive, "--port", 0, "--metrics-port", port, "--log-format", "json", "--access-log",
                  "--log-interval", 1], tmp_path, "serve")
    try:
        url = wait_for(lambda: next((r["url"] for r in json_lines(tmp_path / "serve.err") if r["event"] == "start"), None))
        assert healthz(port) == 200
        with FlightArchiveClient(url) as c:
            for k in (1, 2, 60, 999):
                c.probe(k)
            assert c.probe_range(55, 65).num_rows > 0
            rows = sum(b.num_rows for b in c.scan())
            with pytest.raises(flight.FlightServerError, match="ebb: bad request: as_of -1000 is before"):
                c.probe(5, as_of=-1000)  # before the oldest kept version: a bad request
        m = wait_for(lambda: (lambda s: s if s.get('ebb_read_requests_total{archive="arc",kind="probe"}') == 5 else None)(
            scrape(port)))
        assert m['ebb_read_requests_total{archive="arc",kind="range"}'] == 1
        assert m['ebb_read_requests_total{archive="arc",kind="scan"}'] == 1
        assert m['ebb_read_errors_total{archive="arc",kind="probe"}'] == 1
        assert m['ebb_read_errors_total{archive="arc",kind="scan"}'] == 0
        assert m['ebb_read_rows_total{archive="arc",kind="scan"}'] == rows
        assert m['ebb_read_duration_seconds_count{archive="arc",kind="probe"}'] == 5
        stats = json.loads(ebb("stats", archive, "--format", "json", check=True).stdout)
        for s in stats["subindices"]:
            assert m[f'ebb_subindex_records{{archive="arc",subindex="{s["subindex"]}"}}'] == s["records"]
            assert m[f'ebb_subindex_bytes{{archive="arc",subindex="{s["subindex"]}"}}'] == s["bytes"]
        assert m['ebb_pinned_bytes{archive="arc"}'] == 0  # nothing replaced waits for a reader
        wait_for(lambda: any(r["event"] == "requests" for r in json_lines(tmp_path / "serve.err")))
    finally:
        assert stop(proc) == 0
    records = json_lines(tmp_path / "serve.err")  # every line is JSON
    access = [r for r in records if r["event"] == "access"]
    assert [r["kind"] for r in access] == ["probe"] * 4 + ["range", "scan", "probe"]
    assert [r.get("key") for r in access] == [1, 2, 60, 999, None, None, 5]
    assert [r["failed"] for r in access] == [False] * 6 + [True] and access[6]["as_of"] == -1000
    assert access[4]["lo"] == 55 and access[4]["hi"] == 65 and access[5]["rows"] == rows
    assert all(r["peer"].startswith("ipv") and r["archive"] == "arc" and r["duration_s"] >= 0 for r in access)
    errors = [r for r in records if r["event"] == "error"]
    assert len(errors) == 1 and errors[0]["kind"] == "probe" and errors[0]["level"] == "warning"
    batches = [r for r in records if r["event"] == "requests"]
    assert sum(r["requests"] for r in batches) == 7 and sum(r["errors"] for r in batches) == 1
    assert sum(r["kinds"].get("probe", {}).get("requests", 0) for r in batches) == 5
    assert records[-1]["event"] == "stop" and records[-1]["signal"] == "SIGTERM"
    assert open(tmp_path / "serve.out").read() == ""  # JSON mode: everything is a log record


def test_serve_text_mode_keeps_its_lines_and_logs_no_access_by_default(archive, tmp_path):
    proc = start(["serve", archive, "--port", 0, "--log-interval", 1], tmp_path, "serve")
    try:
        out = wait_for(lambda: re.search(r"at (grpc://\S+) ", open(tmp_path / "serve.out").read()))
        with FlightArchiveClient(out.group(1)) as c:
            c.probe(1)
        line = wait_for(lambda: re.search(r"^\S+Z INFO ebb\.serve: 1 requests in \d+ s: probe 1 \(0 failed, 1 rows",
                                          open(tmp_path / "serve.err").read(), re.M))
        assert line
    finally:
        assert stop(proc) == 0
    assert "ebb.access" not in open(tmp_path / "serve.err").read()


ORIGIN = "2026-01-01T00:00:00Z"
JOB = """
[job]
time_unit = "s"
origin = "{origin}"
grace = 1
[[source]]
name = "clicks"
path = "landing"
time_column = "t"
key = "user"
[query]
kind = "window"
source = "clicks"
range = 4
[archive]
path = "archive"
layout = "doubly"
G = 2
E = 2
mode = "norebuild"
interval = 2
start = 0
"""


def test_run_follow_metrics_and_json_logs_match_the_update_log(tmp_path):
    # the origin a few seconds ago: tick 0 (the bulk load at T=0) and the next are due at once
    origin = dt.datetime.now(dt.timezone.utc).replace(microsecond=0) - dt.timedelta(seconds=6)
    (tmp_path / "job.toml").write_text(JOB.format(origin=origin.strftime("%Y-%m-%dT%H:%M:%SZ")))
    land(pa.table({"user": pa.array([1, 2, 3, 1], pa.int64()), "t": pa.array([-3, -1, 0, 0], pa.int64()),
                   "amount": pa.array([1, 2, 3, 4], pa.int64())}), str(tmp_path / "landing"), "f0.parquet")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "ebb.tools.cli", "run", "job.toml", "--follow", "--metrics-port", str(port),
                             "--log-format", "json", "--format", "json"], cwd=tmp_path, stdout=open(tmp_path / "run.out", "w"),
                            stderr=open(tmp_path / "run.err", "w"))
    try:
        # a file for tick 4 (T=8), landed after the first ticks ran: its events are archived by it
        wait_for(lambda: proc.poll() is not None or scrape_soon(port).get(
            'ebb_ticks_total{archive="archive",job="job"}', 0) >= 2, timeout=300)
        assert proc.poll() is None, open(tmp_path / "run.err").read()
        land(pa.table({"user": pa.array([7, 8], pa.int64()), "t": pa.array([11, 12], pa.int64()),
                       "amount": pa.array([1, 1], pa.int64())}), str(tmp_path / "landing"), "f1.parquet")
        wait_for(lambda: scrape(port).get('ebb_events_archived_total{archive="archive",job="job"}', 0) >= 6, timeout=120)
        assert healthz(port) == 200
        before = time.time()
        m = scrape(port)
        after = time.time()
    finally:
        assert stop(proc) == 0
    with Archive(str(tmp_path / "archive"), readonly=True) as a:
        log = [u for u in a.updates() if u["seq"] <= m['ebb_ticks_total{archive="archive",job="job"}']]
        stats = a.stats()
    labels = '{archive="archive",job="job"}'
    assert m[f"ebb_ticks_total{labels}"] == len(log)
    assert m[f"ebb_tick_failures_total{labels}"] == 0
    assert m[f"ebb_events_archived_total{labels}"] == sum(u["inserted"] for u in log) == 6
    assert m[f"ebb_events_late_total{labels}"] == sum(u["late_rows"] for u in log) == 0
    assert m[f"ebb_update_written_bytes_sum{labels}"] == sum(u["bytes_written"] for u in log)
    assert m[f"ebb_update_duration_seconds_count{labels}"] == len(log)
    assert m[f"ebb_last_tick_timestamp_seconds{labels}"] == origin.timestamp() + log[-1]["time"]
    tick_at = m[f"ebb_last_tick_timestamp_seconds{labels}"]
    assert before - tick_at <= m[f"ebb_tick_lag_seconds{labels}"] <= after - tick_at  # computed at the scrape
    for s in stats["subindices"]:  # the last tick scraped may not be the last committed
        assert f'ebb_subindex_records{{archive="archive",subindex="{s["subindex"]}"}}' in m

    records = json_lines(tmp_path / "run.err")  # every log line is JSON ...
    json_lines(tmp_path / "run.out")  # ... and so is the output, with --format json
    ticks = [r for r in records if r["event"] == "tick"]
    updates = [r for r in records if r["event"] == "update"]
    by_seq = {u["seq"]: u for u in stats["update_log"]}
    assert len(ticks) == len(updates) >= len(log)
    for t, u in zip(ticks, updates):
        assert t["job"] == u["job"] == "job" and t["archive"] == u["archive"] == "archive"
        assert t["T"] == u["T"] == by_seq[u["seq"]]["time"] and t["tick"] == by_seq[u["seq"]]["slot"]
        assert t["tick_time"] == (origin + dt.timedelta(seconds=t["T"])).strftime("%Y-%m-%dT%H:%M:%SZ")
        assert t["inserted"] == u["inserted"] == by_seq[u["seq"]]["inserted"] and t["seconds"] >= 0
        assert u["bytes_written"] == by_seq[u["seq"]]["bytes_written"] and u["freed_bytes"] >= 0
    # a tick's line for a person is replaced by its record, not logged beside it
    assert not any(r["event"] == "message" and re.match(r"tick \d+ T=\d+: .*, load ", r["message"]) for r in records)
    assert records[-1]["event"] == "stop" and "SIGTERM" in records[-1]["message"]
    assert any(r["event"] == "metrics" for r in records)


def test_read_commands_do_not_import_prometheus_client(archive):
    code = ("import sys; from ebb.tools import cli; rc = cli.main(sys.argv[1:]); "
            "assert not [m for m in sys.modules if m.startswith(('prometheus_client', 'ebb.query.metrics'))], rc")
    for args in (["stats", archive], ["probe", archive, "5"], ["scan", archive, "--format", "csv"]):
        r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr


def test_metrics_port_without_prometheus_client_is_a_usage_error(archive, tmp_path):
    # a prometheus_client that cannot be imported, ahead of the installed one on the path
    (tmp_path / "prometheus_client.py").write_text("raise ImportError('not installed')\n")
    r = ebb("serve", archive, "--port", 0, "--metrics-port", 0, env={"PYTHONPATH": str(tmp_path)})
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "ebb: error: --metrics-port needs prometheus_client, which is not installed: "
        "pip install 'ebb[metrics]' (or pip install prometheus_client)"]


def test_docs_list_every_metric_and_alert_only_on_metrics_that_exist():
    from ebb.query import metrics

    reg = metrics.registry()
    metrics.ArchiveMetrics(reg, "a"), metrics.RunMetrics(reg, "a", "j"), metrics.ReadMetrics(reg, "a")
    defined = {f.name + "_total" if f.type == "counter" else f.name: f.type for f in reg.collect()}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    text = open(os.path.join(root, "docs", "operations.md")).read()
    section = text.split("\n### Metrics and alerts\n", 1)[1].split("\n### ", 1)[0]
    table = dict(re.findall(r"^\| `(ebb_\w+)` \| (\w+) \|", section, re.M))
    assert table == defined  # every metric, with its type
    rules = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    used = set(re.findall(r"\bebb_\w+", rules))
    assert used and all(re.sub(r"_(sum|count|bucket)$", "", name) in defined for name in used), used - set(defined)


def test_docs_log_examples_are_json_records_of_the_documented_events():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    text = open(os.path.join(root, "docs", "operations.md")).read()
    section = text.split("\n### Logs\n", 1)[1].split("\n## ", 1)[0]
    examples = [json.loads(line) for line in re.search(r"```json\n(.*?)```", section, re.S).group(1).splitlines()]
    assert {r["event"] for r in examples} == {"tick", "update", "tick_failed", "requests", "error", "access"}
    for r in examples:
        assert {"time", "level", "logger", "event", "message", "archive"} <= set(r)
