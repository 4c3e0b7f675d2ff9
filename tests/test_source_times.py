"""Event times as users write them: pandas' Parquet (nanosecond timestamps, with and without a
zone), CSV text with nanoseconds, and JSON epoch milliseconds (``epoch_unit``) load through a
job with no change to the file, into the chronons the job's origin and time unit give; a column
of a type Spark cannot read stops the run with one line naming the source, the file and the
column (indexer/events.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ebb.indexer.jobspec import JobError, load_job
from ebb.indexer.scheduler import Scheduler
from ebb.query.reader import ArchiveReader

from support import ebb

ORIGIN = pd.Timestamp("2026-01-01T00:00:00Z")
END = 4000  # every event lies in the first 3 s and lives 10 s: all are valid at the last tick
JOB = """
[job]
time_unit = "ms"
origin = "2026-01-01T00:00:00Z"
[[source]]
name = "readings"
path = "landing"
format = "{fmt}"
time_column = "t"
key = "sensor"
lifetime = 10000
{extra}
[query]
kind = "lifetime"
sources = ["readings"]
select = ["sensor", "v"]
[archive]
path = "archive"
interval = 1000
start = 0
"""


def _events(n: int) -> pd.DataFrame:
    """``n`` readings within 3 s after the origin, at nanosecond resolution, as naive (UTC) times."""
    rng = np.random.default_rng(n)
    ns = np.sort(rng.integers(0, 3_000_000_000, n))
    return pd.DataFrame({"sensor": rng.integers(0, 7, n), "v": np.round(rng.normal(size=n), 3),
                         "t": ORIGIN.tz_localize(None) + pd.to_timedelta(ns, unit="ns")})


def _expected(df: pd.DataFrame) -> list[tuple]:
    """(sensor, v, ts) of each event: ts in whole milliseconds since the origin, rounded down."""
    ts = (df["t"] - ORIGIN.tz_localize(None)) // pd.Timedelta(milliseconds=1)
    return sorted(zip(df["sensor"].tolist(), df["v"].tolist(), ts.tolist()))


def _archived(tmp_path, fmt: str, extra: str = "") -> list[tuple]:
    (tmp_path / "job.toml").write_text(JOB.format(fmt=fmt, extra=extra))
    with Scheduler(load_job(str(tmp_path / "job.toml")), say=lambda m: None) as sch:
        sch.run(until=END)
        assert sch.archive.state().late_rows == 0
        t = ArchiveReader(sch.archive).scan_table(as_of=END)
    return sorted(zip(t.column("sensor").to_pylist(), t.column("v").to_pylist(), t.column("ts").to_pylist()))


@pytest.mark.parametrize("zone", [None, "Asia/Kolkata"], ids=["naive", "zoned"])
def test_pandas_parquet_with_nanosecond_timestamps_loads_unchanged(spark, tmp_path, zone):
    df = _events(80)
    written = df.copy()
    if zone:  # the same instants, written with a zone
        written["t"] = written["t"].dt.tz_localize("UTC").dt.tz_convert(zone)
    (tmp_path / "landing").mkdir()
    written.to_parquet(tmp_path / "landing" / "part-0.parquet")  # pandas' defaults: timestamp[ns]
    assert pq.read_schema(tmp_path / "landing" / "part-0.parquet").field("t").type.unit == "ns"
    assert _archived(tmp_path, "parquet") == _expected(df)
    if zone:  # a process of its own (a JVM start): once, on the harder file
        r = ebb("explain", tmp_path / "job.toml")
        assert r.returncode == 0, r.stderr


def test_csv_text_with_nanoseconds_and_json_epoch_milliseconds(spark, tmp_path):
    df = _events(50)
    (tmp_path / "landing").mkdir()
    df.to_csv(tmp_path / "landing" / "part-0.csv", index=False)  # "2026-01-01 00:00:00.123456789"
    assert _archived(tmp_path, "csv") == _expected(df)

    json_dir = tmp_path / "json"
    (json_dir / "landing").mkdir(parents=True)
    df.to_json(json_dir / "landing" / "part-0.json", orient="records", lines=True)  # epoch milliseconds
    ms = df.assign(t=df["t"].dt.floor("ms"))
    assert _archived(json_dir, "json", 'epoch_unit = "ms"') == _expected(ms)


def test_a_type_spark_cannot_read_is_named_with_its_file_and_column(spark, tmp_path):
    (tmp_path / "landing").mkdir()
    table = pa.table({"sensor": [1, 2], "t": pa.array([0, 10**9], pa.timestamp("ns")),
                      "at": pa.array([1, 2], pa.time64("ns"))})
    bad = tmp_path / "landing" / "part-0.parquet"
    pq.write_table(table, bad)
    (tmp_path / "job.toml").write_text(JOB.format(fmt="parquet", extra="").replace('select = ["sensor", "v"]', ""))
    r = ebb("run", tmp_path / "job.toml", "--until", END)
    assert r.returncode == 2, r.stderr
    line = r.stderr.strip()
    assert "\n" not in line and "readings" in line and str(bad) in line and "at (time64[ns])" in line, line


def test_epoch_unit_needs_a_time_unit(tmp_path):
    text = JOB.format(fmt="json", extra='epoch_unit = "ms"').replace('time_unit = "ms"', 'time_unit = "chronon"')
    (tmp_path / "job.toml").write_text(text.replace('origin = "2026-01-01T00:00:00Z"\n', ""))
    with pytest.raises(JobError, match="epoch_unit needs job.time_unit"):
        load_job(str(tmp_path / "job.toml"))
