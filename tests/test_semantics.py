"""Snapshot-reducibility of every query kind (Kraemer): at every instant, the results valid
then equal the relational operator applied to the window contents at that instant, computed
by a brute-force oracle in plain Python. Plus the golden examples of the papers."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
from hypothesis import HealthCheck, given, settings, strategies as st

from ebb.indexer.events import T
from ebb.indexer.jobspec import Window
from ebb.indexer.patterns import classify
from ebb.indexer.queries import BUILDERS

from jobs import in_window, job, snapshot

SETTINGS = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
HORIZON = 48


def frame(spark, rows: list[dict], extra: dict[str, pa.DataType] | None = None):
    schema = pa.schema([("key", pa.int64()), ("t", pa.int64()), ("v", pa.int64())] + list((extra or {}).items()))
    t = pa.Table.from_pylist(rows, schema=schema)
    return spark.createDataFrame(t).withColumn(T, __import__("pyspark.sql.functions", fromlist=["col"]).col("t"))


def results(spark, j, inputs) -> list[dict]:
    df = BUILDERS[j.query.kind](j, inputs, None, None)
    return df.toArrow().to_pylist() if df is not None else []


events = st.lists(st.fixed_dictionaries({"key": st.integers(0, 3), "t": st.integers(0, 30), "v": st.integers(0, 3)}), max_size=25)


def check_all_instants(res, oracle, cols):
    for now in range(-1, HORIZON):
        assert snapshot(res, now, cols) == oracle(now), f"at t={now}"
    for r in res:
        assert r["exp"] > r["ts"]


@SETTINGS
@given(events, st.integers(1, 8), st.integers(1, 4), st.booleans())
def test_window(spark, evs, w, a, filtered):
    j = job("window", [Window("a", range=w, slide=a)], select=["key", "v"], filter="v < 3" if filtered else None)
    res = results(spark, j, {"a": frame(spark, evs)})

    def oracle(now):
        return Counter((e["key"], e["v"]) for e in evs if in_window(e["t"], now, w, a) and (not filtered or e["v"] < 3))

    check_all_instants(res, oracle, ["key", "v"])
    assert max((r["exp"] - r["ts"] for r in res), default=0) <= classify(j).max_lifetime


@SETTINGS
@given(events, events, st.integers(1, 7), st.integers(1, 3), st.integers(1, 7), st.integers(1, 3), st.booleans())
def test_join(spark, left, right, w1, a1, w2, a2, cond):
    j = job("join", [Window("a", range=w1, slide=a1), Window("b", range=w2, slide=a2)],
            condition="l.v <= r.v" if cond else None,
            select=["l.key AS key", "l.t AS l_t", "l.v AS l_v", "r.t AS r_t", "r.v AS r_v"])
    res = results(spark, j, {"a": frame(spark, left), "b": frame(spark, right)})

    def oracle(now):
        L = [e for e in left if in_window(e["t"], now, w1, a1)]
        R = [e for e in right if in_window(e["t"], now, w2, a2)]
        return Counter((l["key"], l["t"], l["v"], r["t"], r["v"]) for l in L for r in R
                       if l["key"] == r["key"] and (not cond or l["v"] <= r["v"]))

    check_all_instants(res, oracle, ["key", "l_t", "l_v", "r_t", "r_v"])
    assert max((r["exp"] - r["ts"] for r in res), default=0) <= classify(j).max_lifetime


@SETTINGS
@given(events, events, st.integers(1, 9), st.integers(1, 9))
def test_lifetime_union(spark, a_ev, b_ev, la, lb):
    j = job("lifetime", [Window("a", lifetime=la), Window("b", lifetime=lb)], lifetimes={"a": la, "b": lb})
    res = results(spark, j, {"a": frame(spark, a_ev), "b": frame(spark, b_ev)})

    def oracle(now):
        return Counter([(e["key"], e["v"], "a") for e in a_ev if e["t"] <= now < e["t"] + la]
                       + [(e["key"], e["v"], "b") for e in b_ev if e["t"] <= now < e["t"] + lb])

    check_all_instants(res, oracle, ["key", "v", "source"])
    assert classify(j).pattern == ("weakest" if la == lb else "weak")


@SETTINGS
@given(events, st.integers(1, 9), st.integers(1, 4))
def test_aggregate_wid(spark, evs, r, a):
    j = job("aggregate", [Window("a", range=r, slide=a)], group_by=["key"],
            aggregates={"n": "count(*)", "s": "sum(v)", "lo": "min(v)", "hi": "max(v)", "mean": "avg(v)"})
    res = results(spark, j, {"a": frame(spark, evs)})
    for row in res:
        row["mean"] = round(row["mean"], 9)

    def oracle(now):
        k = (now + 1) // a - 1
        if k < 0:
            return Counter()
        inside = [e for e in evs if max(0, (k + 1) * a - r) <= e["t"] < (k + 1) * a]
        out = Counter()
        for key in {e["key"] for e in inside}:
            vs = [e["v"] for e in inside if e["key"] == key]
            out[(key, len(vs), sum(vs), min(vs), max(vs), round(sum(vs) / len(vs), 9))] += 1
        return out

    check_all_instants(res, oracle, ["key", "n", "s", "lo", "hi", "mean"])
    assert all(row["exp"] - row["ts"] == a for row in res)


@SETTINGS
@given(events, st.integers(1, 8), st.integers(1, 3))
def test_distinct(spark, evs, w, a):
    j = job("distinct", [Window("a", range=w, slide=a)], select=["key", "v"])
    res = results(spark, j, {"a": frame(spark, evs)})

    def oracle(now):
        return Counter({(e["key"], e["v"]) for e in evs if in_window(e["t"], now, w, a)})

    check_all_instants(res, oracle, ["key", "v"])


# -- golden examples ---------------------------------------------------------------------------
S3 = [("b", 1), ("a", 3), ("c", 4), ("a", 7), ("b", 10)]  # Kraemer Table 11.11(a): chronon stream S3


def tuples_frame(spark, rows, with_end=False):
    cols = {"key": pa.string(), "t": pa.int64(), "v": pa.int64()}
    data = [{"key": k, "t": ts, "v": 0, **({"life": te - ts} if with_end else {})} for k, ts, *rest in rows for te in (rest or [None])]
    schema = pa.schema(list(cols.items()) + ([("life", pa.int64())] if with_end else []))
    from pyspark.sql import functions as F

    return spark.createDataFrame(pa.Table.from_pylist(data, schema=schema)).withColumn(T, F.col("t"))


def intervals(res):
    return sorted((r["key"], r["ts"], r["exp"]) for r in res)


def test_kraemer_time_window_50(spark):
    """Table 11.11(b): omega_50(S3)."""
    j = job("window", [Window("a", range=50)], select=["key"])
    got = intervals(results(spark, j, {"a": tuples_frame(spark, S3)}))
    assert got == sorted([("b", 1, 51), ("a", 3, 53), ("c", 4, 54), ("a", 7, 57), ("b", 10, 60)])


def test_kraemer_time_window_50_advance_10(spark):
    """Table 17.1: omega_{50,10}(S3)."""
    j = job("window", [Window("a", range=50, slide=10)], select=["key"])
    got = intervals(results(spark, j, {"a": tuples_frame(spark, S3)}))
    assert got == sorted([("b", 9, 59), ("a", 9, 59), ("c", 9, 59), ("a", 9, 59), ("b", 19, 69)])


S1 = [("c", 1, 8), ("a", 5, 11), ("d", 6, 14), ("a", 9, 10), ("b", 12, 17)]  # Table 11.1
S2 = [("b", 1, 7), ("d", 3, 9), ("a", 4, 5), ("b", 7, 15), ("e", 10, 18)]


def test_kraemer_equi_join(spark):
    """Table 11.6: S1 join S2 = d[6,9), b[12,15)."""
    j = job("join", [Window("a", lifetime_column="life"), Window("b", lifetime_column="life")], select=["l.key AS key"],
            max_lifetime=20)
    got = intervals(results(spark, j, {"a": tuples_frame(spark, S1, True), "b": tuples_frame(spark, S2, True)}))
    assert got == [("b", 12, 15), ("d", 6, 9)]


def test_kraemer_duplicate_elimination(spark):
    """Table 11.7: delta(S1) drops a[9,10), covered by a[5,11)."""
    j = job("distinct", [Window("a", lifetime_column="life")], select=["key"], max_lifetime=20)
    got = intervals(results(spark, j, {"a": tuples_frame(spark, S1, True)}))
    assert got == sorted([("c", 1, 8), ("a", 5, 11), ("d", 6, 14), ("b", 12, 17)])


def test_wid_q1_extents(spark):
    """Li et al., Q1 (RANGE 5 min SLIDE 1 min): extent 10 = [12:06, 12:11), and a tuple at
    12:10:30 belongs to extents 10..14. Time in seconds since 12:00."""
    j = job("aggregate", [Window("a", range=300, slide=60)], group_by=["key"], aggregates={"n": "count(*)"})
    res = results(spark, j, {"a": frame(spark, [{"key": 1, "t": 630, "v": 0}])})
    extents = sorted((r["ts"] + 1) // 60 - 1 for r in res)
    assert extents == [10, 11, 12, 13, 14]
    # extent 10's row is valid from 12:10:59 (window [12:06, 12:11) closed) until 12:11:59
    row10 = next(r for r in res if (r["ts"] + 1) // 60 - 1 == 10)
    assert (row10["ts"], row10["exp"]) == (659, 719)
    edge = results(spark, j, {"a": frame(spark, [{"key": 1, "t": 359, "v": 0}, {"key": 1, "t": 360, "v": 0},
                                                 {"key": 1, "t": 659, "v": 0}, {"key": 1, "t": 660, "v": 0}])})
    n10 = next(r["n"] for r in edge if r["ts"] == 659)
    assert n10 == 2  # 12:06:00 and 12:10:59 are in extent 10; 12:05:59 and 12:11:00 are not
