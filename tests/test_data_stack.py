"""The archive from the tools analysts use: a scan is a ``pyarrow.RecordBatchReader`` that DuckDB
(``duckdb.sql("select ... from reader")``), polars (``polars.from_arrow``) and pandas
(``reader.read_pandas()``) read as it is, and ``ebb sql`` queries it as the table ``records``.
On an archive built from a random schedule (keeping history, ``retain``), each returns what
``ebb scan`` and the brute-force oracle return, as of now and as of an earlier instant; a scan's
snapshot is let go of however its reader ends (exhausted, closed half-way, collected)."""

from __future__ import annotations

import csv
import io
import json
import os
import sys
from collections import Counter

import duckdb
import numpy as np
import polars
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ebb.tools.cli import main
from ebb.query.reader import ArchiveReader
from ebb.storage import leases
from ebb.storage.archive import Archive

from support import SCHEMA, Oracle, config, ebb, random_rows, rows_multiset, table_of
from test_time_travel import oldest_readable, version_oracle

RETAIN = 6  # chronons of history: three updates of Delta=2 back


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[str, list[tuple[int, list]], dict[str, int]]:
    """(archive path, history of (update time, valid records), instants to read): a random
    schedule of sizes, empty intervals and missed slots on tiny blocks, so a scan has many
    batches. Instants: ``now`` (the last update) and ``earlier`` (within the retained window,
    between two updates)."""
    rng = np.random.default_rng(26)
    path = str(tmp_path_factory.mktemp("stack") / "a")
    cfg = config(mode="norebuild", block_bytes=512, retain=RETAIN)
    oracle, history = Oracle(), []
    with Archive.create(path, cfg) as arc:
        T = cfg.tau
        rows = random_rows(rng, 300, T - cfg.max_lifetime + 1, T, cfg.max_lifetime, 40, tag="bulk")
        for step in range(12):
            arc.load(table_of(rows, SCHEMA), T)
            oracle.load(rows, T)
            history.append((T, list(oracle.records)))
            T += cfg.delta * (1 + int(rng.integers(0, 3) == 0))  # now and then a missed slot
            n = int(rng.choice([0, 40, 120]))  # empty intervals among them
            rows = random_rows(rng, n, T - cfg.delta + 1, T, cfg.max_lifetime, 40, tag=f"u{step}-")
    last = history[-1][0]
    earlier = last - RETAIN + 1
    assert oldest_readable(history, RETAIN) <= earlier < last and earlier not in {t for t, _ in history}
    return path, history, {"now": last, "earlier": earlier}


def _want(history, t: int) -> Counter:
    return version_oracle(history, t).scan(t)


def _cli(capsys, *args) -> tuple[int, str, str]:
    """``ebb ARGS`` run in this process (as ``main``): (exit code, stdout, stderr)."""
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def _jsonl(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def _duckdb_rows(rel: duckdb.DuckDBPyRelation) -> list[dict]:
    return [dict(zip(rel.columns, row)) for row in rel.fetchall()]


@pytest.mark.parametrize("instant", ["now", "earlier"])
def test_duckdb_polars_pandas_and_ebb_sql_return_what_ebb_scan_and_the_oracle_do(built, capsys, instant):
    path, history, instants = built
    t = instants[instant]
    as_of = [] if instant == "now" else ["--as-of", t]  # now: the default instant
    want = _want(history, t)
    assert want  # the schedule left records valid at both instants

    code, out, _ = _cli(capsys, "scan", path, "--format", "jsonl", *as_of)
    assert code == 0 and rows_multiset(_jsonl(out)) == want

    with ArchiveReader(path) as r:
        reader = r.scan(t)
        assert isinstance(reader, pa.RecordBatchReader) and reader.schema == r.result_schema()
        assert rows_multiset(_duckdb_rows(duckdb.sql("select * from reader"))) == want  # a replacement scan of the variable
        assert rows_multiset(polars.from_arrow(r.scan(t)).to_dicts()) == want
        assert rows_multiset(pa.Table.from_pandas(r.scan(t).read_pandas(), preserve_index=False)) == want
        # a filter and an aggregate pushed into DuckDB
        reader = r.scan(t)
        counts = dict(duckdb.sql("select key, count(*) from reader where payload is not null group by key").fetchall())
        assert counts == dict(Counter(dict(row)["key"] for row in want.elements()))
        # many keys at once: a range probe is a table, which DuckDB and polars read as well
        lo, hi = 5, 17
        probed = r.probe_range(lo, hi, t)
        in_range = version_oracle(history, t).probe_range(lo, hi, t)
        assert rows_multiset(_duckdb_rows(duckdb.sql("select * from probed"))) == in_range
        assert rows_multiset(polars.from_arrow(probed).to_dicts()) == in_range

    code, out, err = _cli(capsys, "sql", path, "select * from records", "--format", "jsonl", *as_of)
    assert code == 0 and rows_multiset(_jsonl(out)) == want, err


def test_ebb_sql_aggregates_in_every_output_format(built, capsys, tmp_path):
    path, history, instants = built
    t = instants["earlier"]
    valid = version_oracle(history, t).valid(t)
    want = sorted((k, sum(1 for r in valid if r["key"] == k), max(r["exp"] for r in valid if r["key"] == k))
                  for k in {r["key"] for r in valid})
    query = "select key, count(*) as n, max(exp) as last_exp from records group by key order by key"

    code, out, err = _cli(capsys, "sql", path, query, "--as-of", t, "--format", "jsonl")
    assert code == 0 and [(r["key"], r["n"], r["last_exp"]) for r in _jsonl(out)] == want
    assert err == ""  # jsonl to stdout: nothing else said
    code, out, err = _cli(capsys, "sql", path, query, "--as-of", t)
    assert code == 0 and out.splitlines()[0].split() == ["key", "n", "last_exp"] and f"{len(want)} rows" in err
    code, _, _ = _cli(capsys, "sql", path, query, "--as-of", t, "--format", "parquet", "--out", tmp_path / "agg.parquet")
    got = pq.read_table(tmp_path / "agg.parquet")
    assert code == 0 and list(zip(*(got.column(c).to_pylist() for c in ("key", "n", "last_exp")))) == want
    # the installed command, in its own process
    r = ebb("sql", path, "select count(*) as n from records", "--as-of", t, "--format", "csv")
    assert r.returncode == 0 and list(csv.DictReader(io.StringIO(r.stdout))) == [{"n": str(len(valid))}], r.stderr


def test_ebb_sql_reads_a_published_data_directory(tmp_path, capsys):
    rng = np.random.default_rng(3)
    arc = Archive.create(str(tmp_path / "arc"), config(block_bytes=512), data_dir=str(tmp_path / "shared"))
    oracle = Oracle()
    for T in range(16, 26, 2):
        rows = random_rows(rng, 80, T - 1, T, 16, 12)
        arc.load(table_of(rows, SCHEMA), T)
        oracle.load(rows, T)
    arc.close()
    code, out, err = _cli(capsys, "sql", tmp_path / "shared", "select * from records", "--format", "jsonl")
    assert code == 0 and rows_multiset(_jsonl(out)) == oracle.scan(24), err


def test_ebb_sql_errors_are_one_line_with_their_exit_code(built, capsys, monkeypatch):
    path, history, instants = built
    for args, code, says in [
        (["selec * from records"], 2, "the query: Parser Error"),
        (["select nothing from records"], 2, "the query: Binder Error"),
        (["select * from records", "--as-of", instants["now"] - RETAIN - 4], 2, "the oldest instant this archive can still read"),
        (["select count(*) from records r1, records r2"], 2, "the query:"),  # `records` streams once
    ]:
        got, out, err = _cli(capsys, "sql", path, *args)
        assert got == code and says in err and err.count("\n") == 1 and err.startswith("ebb: error: "), (args, err)
    monkeypatch.setitem(sys.modules, "duckdb", None)  # as if the sql extra were not installed
    got, out, err = _cli(capsys, "sql", path, "select 1")
    assert got == 2 and err == "ebb: error: ebb sql needs DuckDB, an optional extra: pip install 'ebb[sql]' (or pip install duckdb)\n"


def test_ebb_sql_reports_a_corrupt_block_as_corruption(tmp_path, capsys):
    """A read failure reaches DuckDB as a message; the command still exits 6 with ebb's line."""
    rng = np.random.default_rng(4)
    path = str(tmp_path / "a")
    with Archive.create(path, config(block_bytes=512)) as arc:
        arc.load(table_of(random_rows(rng, 200, 1, 16, 16, 12), SCHEMA), 16)
        with arc.snapshot() as snap:
            run = next(r for s in snap.state.subindices for r in s.runs)
            entry = snap.descriptor(run.name).entry(run.first_live)
    with open(os.path.join(arc.data_dir, run.name), "r+b") as f:
        f.seek(entry.offset + entry.length // 2)
        b = f.read(1)
        f.seek(entry.offset + entry.length // 2)
        f.write(bytes([b[0] ^ 0x40]))
    code, _, err = _cli(capsys, "sql", path, "select count(*) from records")
    assert code == 6 and "fails its checksum" in err and err.count("\n") == 1, err


def _read_txns(r: ArchiveReader) -> int:
    """LMDB read transactions open in this process's slots of the archive's reader table."""
    lines = r.archive.env.readers().splitlines()[1:]
    return sum(1 for line in lines if line.split()[-1].isdigit())


def test_a_scans_snapshot_is_let_go_of_however_its_reader_ends(built):
    path, history, instants = built
    lease_dir = leases.lease_dir(os.path.join(path, "data"))
    with ArchiveReader(path) as r:
        assert _read_txns(r) == 0
        reader = r.scan()
        assert _read_txns(r) == 1
        first = reader.read_next_batch()
        assert first.num_rows and _read_txns(r) == 1
        reader.close()  # half-way
        assert _read_txns(r) == 0
        with pytest.raises(pa.ArrowInvalid):
            reader.read_next_batch()

        r.scan().close()  # before its first batch
        assert _read_txns(r) == 0
        assert sum(b.num_rows for b in r.scan()) == sum(_want(history, instants["now"]).values())  # exhausted
        assert _read_txns(r) == 0
        reader = r.scan()
        next(iter(reader))
        del reader  # collected
        assert _read_txns(r) == 0
        with r.scan() as reader:
            assert duckdb.sql("select key from reader limit 1").fetchall()  # DuckDB stops early
        assert _read_txns(r) == 0

        # a kept version is pinned by a lease while its scan lasts, and only then
        reader = r.scan(instants["earlier"])
        reader.read_next_batch()
        assert _read_txns(r) == 1 and os.listdir(lease_dir)
        reader.close()
        assert _read_txns(r) == 0 and os.listdir(lease_dir) == []
