"""The ebb command: help texts, output formats, stats/plan/verify, the demo, and corruption
detection (LevelDB's corruption_test, for ebb)."""

from __future__ import annotations

import csv
import io
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ebb.tools.cli import build_parser

from support import SCHEMA, ebb

SUBCOMMANDS = ["init", "load", "probe", "scan", "stats", "plan", "verify", "demo"]


def test_help_explains_every_subcommand():
    r = ebb("--help")
    assert r.returncode == 0
    for c in SUBCOMMANDS:
        assert c in r.stdout
    assert "exit codes" in r.stdout
    for c in SUBCOMMANDS:
        r = ebb(c, "--help")
        assert r.returncode == 0, c
        assert len(r.stdout.splitlines()) > 4
    # every option of every subcommand has a help text
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    for name, p in sub.choices.items():
        for a in p._actions:
            if a.dest != "help":
                assert a.help, f"{name} {a.dest} has no help"


@pytest.fixture
def archive(tmp_path):
    path = tmp_path / "arc"
    assert ebb("init", path, "--layout", "doubly", "--G", 2, "--E", 2, "--mode", "norebuild", "--max-lifetime", 20,
               "--interval", 5, "--start", 0, "--time-unit", "s").returncode == 0
    rng = np.random.default_rng(3)
    ts = rng.integers(-19, 1, 300)
    t = pa.table({"key": rng.integers(0, 10, 300), "ts": ts, "exp": ts + rng.integers(1, 21, 300),
                  "payload": pa.array([f"p{i}" for i in range(300)])}, schema=SCHEMA)
    pq.write_table(t, tmp_path / "b0.parquet")
    r = ebb("load", path, tmp_path / "b0.parquet", "--at", 0)
    assert r.returncode == 0, r.stderr
    assert "update 1 at T=0 (slot 0, bulk)" in r.stdout
    ts = rng.integers(1, 6, 50)
    t = pa.table({"key": rng.integers(0, 10, 50), "ts": ts, "exp": ts + rng.integers(1, 21, 50),
                  "payload": pa.array([f"q{i}" for i in range(50)])}, schema=SCHEMA)
    pq.write_table(t, tmp_path / "b1.parquet")
    r = ebb("load", path, tmp_path / "b1.parquet", "--at", 5, "--format", "json")
    assert r.returncode == 0
    rec = json.loads(r.stdout)
    assert rec["slot"] == 1 and rec["inserted"] + rec["dropped_expired"] == 50
    return path


def test_output_formats_agree(tmp_path, archive):
    js = [json.loads(line) for line in ebb("probe", archive, 3, "--format", "jsonl").stdout.splitlines()]
    assert js and all(r["key"] == 3 and r["ts"] <= 5 < r["exp"] for r in js)
    rows = list(csv.DictReader(io.StringIO(ebb("probe", archive, 3, "--format", "csv").stdout)))
    assert sorted(r["payload"] for r in rows) == sorted(r["payload"] for r in js)
    assert ebb("probe", archive, 3, "--format", "parquet", "--out", tmp_path / "p.parquet").returncode == 0
    assert sorted(pq.read_table(tmp_path / "p.parquet").column("payload").to_pylist()) == sorted(r["payload"] for r in js)
    table = ebb("probe", archive, 3)
    assert table.stdout.splitlines()[0].split() == ["key", "ts", "exp", "payload"]
    assert f"{len(js)} records" in table.stderr
    rng_rows = [json.loads(x) for x in ebb("probe", archive, 2, "--to", 4, "--format", "jsonl").stdout.splitlines()]
    assert {r["key"] for r in rng_rows} <= {2, 3, 4} and len(rng_rows) >= len(js)
    later = [json.loads(x) for x in ebb("scan", archive, "--as-of", 12, "--format", "jsonl").stdout.splitlines()]
    now = [json.loads(x) for x in ebb("scan", archive, "--format", "jsonl").stdout.splitlines()]
    assert all(r["exp"] > 12 for r in later) and len(later) < len(now)
    r = ebb("scan", archive, "--as-of", 4)
    assert r.returncode == 2 and "the oldest instant this archive can still read" in r.stderr  # a usage error: asked for lost history
    r = ebb("probe", archive, "abc")
    assert r.returncode == 2 and "not one" in r.stderr
    r = ebb("scan", archive, "--format", "parquet")
    assert r.returncode in (1, 2) and "--out" in r.stderr


def test_stats_plan_verify(archive):
    st = json.loads(ebb("stats", archive, "--format", "json").stdout)
    assert st["updates"] == 2 and st["last_update_time"] == 5 and st["config"]["time_unit"] == "s"
    assert sum(s["records"] for s in st["subindices"]) == st["records"]
    for rec in st["update_log"]:
        for k in ("subindices_read", "subindices_written", "blocks_read", "bytes_read", "blocks_written", "bytes_written",
                  "os_read_bytes", "os_write_bytes", "inserted", "deleted", "dropped_expired", "wall_seconds"):
            assert k in rec
    assert st["subindices"][0]["insertion_slots"] and st["subindices"][0]["expiration_slots"]
    text = ebb("stats", archive).stdout
    assert "I4" in text and "last 2 updates" in text
    plan = ebb("plan", archive, "--updates", 3).stdout
    assert "{I1,I2}" in plan or "{I3,I4}" in plan
    r = ebb("verify", archive)
    assert r.returncode == 0 and "verify: ok" in r.stdout


def test_corruption_is_detected(archive):
    """A flipped bit in a live block, a truncated run file and a missing one: verify exits 5 and
    names the problem; a probe touching the damage fails with exit 6, never a wrong answer."""
    from ebb.storage.archive import Archive

    with Archive(str(archive)) as arc, arc.snapshot() as snap:
        run = next(r for s in snap.state.subindices for r in s.runs)
        entry = snap.descriptor(run.name).entry(run.first_live)
    path = os.path.join(archive, "data", run.name)
    with open(path, "r+b") as f:
        f.seek(entry.offset + entry.length // 2)
        b = f.read(1)
        f.seek(entry.offset + entry.length // 2)
        f.write(bytes([b[0] ^ 0x40]))
    r = ebb("verify", archive)
    assert r.returncode == 5 and "fails its checksum" in r.stdout, r.stdout
    r = ebb("scan", archive)
    assert r.returncode == 6 and "fails its checksum" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    os.truncate(path, 10)
    r = ebb("verify", archive)
    assert r.returncode == 5 and "its blocks need" in r.stdout, r.stdout
    os.remove(path)
    r = ebb("verify", archive)
    assert r.returncode == 5 and "missing" in r.stdout


def test_busy_and_uninitialised(tmp_path):
    r = ebb("stats", tmp_path)
    assert r.returncode == 1 and "not an ebb archive" in r.stderr
