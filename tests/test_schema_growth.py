"""Schemas that grow (docs/spec.md, "Schema"): a load may add nullable columns; older rows read as
null in them; every read (scan, point probe native and planned, range probe, as of now or of a
kept earlier instant, through the archive or its data directory) returns the widened schema and
the oracle's rows. A load that drops or retypes a column is refused and changes nothing."""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import tempfile

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ebb.query.reader import ArchiveReader
from ebb.storage import point_probe
from ebb.storage.archive import Archive, open_readonly
from ebb.storage.errors import CorruptionError, SchemaError
from ebb.storage.read_plan import Probe
from ebb.storage.snapshot import ordered
from ebb.storage.verify import verify

from support import Oracle, config, rows_multiset
from test_partitioned_update import load_in_parts

# types a load may add, each with a generator of Python values (None: null) that round-trip
NEW_TYPES = {
    "i32": (pa.int32(), lambda rng: int(rng.integers(-1000, 1000))),
    "f64": (pa.float64(), lambda rng: float(rng.integers(0, 100)) / 4),
    "str": (pa.string(), lambda rng: "v" * int(rng.integers(0, 5)) + "é"),
    "bool": (pa.bool_(), lambda rng: bool(rng.integers(0, 2))),
    "bin": (pa.binary(), lambda rng: bytes(rng.integers(0, 256, int(rng.integers(0, 4))).tolist())),
    "date": (pa.date32(), lambda rng: datetime.date(2020, 1, 1) + datetime.timedelta(days=int(rng.integers(0, 900)))),
}


@st.composite
def scenarios(draw):
    delta = draw(st.integers(1, 3))
    s = draw(st.integers(3, 5)) * delta  # p >= 3: chronological needs G, E <= p
    g, e = draw(st.sampled_from([(1, 1), (2, 2), (3, 2)]))
    steps = draw(st.lists(st.tuples(
        st.integers(0, 1),  # missed slots before this update
        st.integers(0, 3),  # rate multiplier
        st.lists(st.sampled_from(sorted(NEW_TYPES)), max_size=2),  # columns this load adds
        st.booleans(),  # its columns in another order
    ), min_size=1, max_size=8))
    return dict(mode=draw(st.sampled_from(["rebuild", "norebuild"])), G=g, E=e,
                partitioning=draw(st.sampled_from(["round-robin", "chronological"])), delta=delta, s=s,
                string_keys=draw(st.booleans()), block_bytes=draw(st.sampled_from([300, 512 << 10])),
                retain=draw(st.sampled_from([0, 2 * s])), parts=draw(st.booleans()), base_rate=draw(st.integers(0, 10)),
                steps=steps, seed=draw(st.integers(0, 2**32 - 1)))


class Growing:
    """The archive's columns as loads add them, and rows of the current ones."""

    def __init__(self, string_keys: bool):
        self.string_keys = string_keys
        self.fields = [pa.field("key", pa.string() if string_keys else pa.int64()), pa.field("ts", pa.int64()),
                       pa.field("exp", pa.int64()), pa.field("payload", pa.string())]
        self.makers = {}
        self.rows: list[dict] = []  # every row ever loaded (older ones widened with nulls)
        self.stored: list[str] = []  # the archive's columns: new ones appended in the order a batch gives them

    def add(self, kind: str) -> None:
        name = f"c{len(self.fields)}_{kind}"
        self.fields.append(pa.field(name, NEW_TYPES[kind][0]))
        self.makers[name] = NEW_TYPES[kind][1]
        for r in self.rows:
            r[name] = None

    def key(self, k: int):
        return f"k{k}é" if self.string_keys else k

    def make(self, rng, n: int, lo: int, hi: int, s: int, tag: str) -> list[dict]:
        ts = rng.integers(lo, hi + 1, n)
        life = rng.integers(1, s + 1, n)
        keys = rng.integers(0, 6, n)
        rows = []
        for i in range(n):
            r = {"key": self.key(int(keys[i])), "ts": int(ts[i]), "exp": int(ts[i] + life[i]),
                 "payload": f"{tag}-{i}" if i % 3 else None}
            r.update({c: (make(rng) if rng.random() < 0.8 else None) for c, make in self.makers.items()})
            rows.append(r)
        self.rows += rows
        return rows

    def table(self, rows: list[dict], shuffle: bool, rng) -> pa.Table:
        fields = list(self.fields)
        if shuffle:
            fields = [fields[i] for i in rng.permutation(len(fields))]
        self.stored += [f.name for f in fields if f.name not in self.stored]
        return pa.Table.from_pylist(rows, schema=pa.schema(fields))


def check_reads(arc, want: Oracle, t: int, keys: list, rng) -> None:
    """Scan, point probes (as the reader does them, and planned) and a range probe as of ``t``."""
    schema = arc.schema
    with ArchiveReader(arc) as r:
        scan = r.scan_table(as_of=t)
        assert scan.schema == schema and rows_multiset(scan) == want.scan(t)
        for k in {keys[int(rng.integers(0, len(keys)))] for _ in range(2)}:
            got = r.probe(k, as_of=t)
            assert got.schema == schema and rows_multiset(got) == want.probe(k, t)
            with arc.snapshot() as snap:
                cfg = snap.config
                planned = ordered(list(snap.read_all(snap.plan(Probe((k,)), t))), schema, cfg.key_column,
                                  cfg.exp_column, cfg.ts_column)
            assert planned.schema == schema and rows_multiset(planned) == want.probe(k, t)
        a, b = sorted([keys[int(rng.integers(0, len(keys)))] for _ in range(2)])
        got = r.probe_range(a, b, as_of=t)
        assert got.schema == schema and rows_multiset(got) == want.probe_range(a, b, t)


def version_oracle(history: list[tuple[int, list]], t: int) -> Oracle:
    o = Oracle()
    o.records = [rows for T, rows in history if T <= t][-1]
    return o


@settings(max_examples=int(os.environ.get("EBB_SCHEMA_EXAMPLES", 60)), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_loads_that_add_columns_match_the_oracle(sc):
    rng = np.random.default_rng(sc["seed"])
    tau, delta, s = 16, sc["delta"], sc["s"]
    cfg = config(mode=sc["mode"], G=sc["G"], E=sc["E"], partitioning=sc["partitioning"], tau=tau, delta=delta,
                 max_lifetime=s, block_bytes=sc["block_bytes"], retain=sc["retain"])
    cols = Growing(sc["string_keys"])
    oracle = Oracle()
    history: list[tuple[int, list]] = []
    with tempfile.TemporaryDirectory() as d:
        arc = Archive.create(d + "/a", cfg)
        j = 0
        for step, (missed, mult, adds, shuffle) in enumerate([(0, 3, [], False)] + sc["steps"]):
            T = tau + j * delta
            for kind in adds:
                cols.add(kind)
            lo = T - s + 1 if step == 0 else T - 2 * delta + 1
            rows = cols.make(rng, sc["base_rate"] * mult, lo, T, s, f"u{j}")
            table = cols.table(rows, shuffle, rng)
            if sc["parts"]:
                load_in_parts(arc, table, T, 700)
            else:
                arc.load(table, T)
            oracle.load(rows, T)
            history.append((T, list(oracle.records)))
            assert arc.schema.names == cols.stored
            keys = [x["key"] for x in oracle.records] or [cols.key(0)]
            check_reads(arc, oracle, T, keys, rng)
            check_reads(arc, oracle, T + int(rng.integers(1, s + 2)), keys, rng)
            if sc["retain"] and len(history) > 1:  # an earlier instant: its rows, in the widened schema
                t = max(history[0][0], T - sc["retain"]) + int(rng.integers(0, sc["retain"] // 2 + 1))
                if t < T:
                    want = version_oracle(history, t)
                    check_reads(arc, want, t, [x["key"] for x in want.records] or keys, rng)
            j += 1 + missed
        grown = arc.stats()["schema_history"]
        assert [c for v in grown for c in v["added"]] == arc.schema.names
        assert [v["columns"] for v in grown] == sorted({v["columns"] for v in grown})
        problems, _ = verify(arc)
        assert problems == []
        arc.close()


def _start(path: str, **kw) -> tuple[Archive, Oracle, Growing]:
    arc = Archive.create(path, config(**kw))
    cols, oracle = Growing(False), Oracle()
    rows = cols.make(np.random.default_rng(1), 40, 1, 16, 16, "bulk")
    arc.load(cols.table(rows, False, None), 16)
    oracle.load(rows, 16)
    return arc, oracle, cols


def _grow(arc: Archive, oracle: Oracle, cols: Growing, at: int, kind: str | None = "f64", n: int = 30) -> None:
    if kind:
        cols.add(kind)
    rows = cols.make(np.random.default_rng(at), n, at - 1, at, 16, f"u{at}")
    arc.load(cols.table(rows, False, None), at)
    oracle.load(rows, at)


def test_stats_show_the_schema_history(tmp_path):
    arc, oracle, cols = _start(str(tmp_path / "a"))
    _grow(arc, oracle, cols, 18, None)
    _grow(arc, oracle, cols, 20, "str")
    _grow(arc, oracle, cols, 22, "i32")
    history = arc.stats()["schema_history"]
    assert history == [
        {"version": 0, "added": ["key", "ts", "exp", "payload"], "update": 1, "time": 16, "columns": 4},
        {"version": 1, "added": ["c4_str"], "update": 3, "time": 20, "columns": 5},
        {"version": 2, "added": ["c5_i32"], "update": 4, "time": 22, "columns": 6},
    ]
    arc.close()
    from support import ebb

    out = ebb("stats", tmp_path / "a").stdout
    assert "v1      +c4_str (update 3 at T=20)" in out and "v2      +c5_i32 (update 4 at T=22)" in out
    assert json.loads(ebb("stats", tmp_path / "a", "--format", "json").stdout)["schema_history"] == history


@pytest.mark.parametrize("mode", ["rebuild", "norebuild"])
def test_native_probes_decline_runs_of_an_older_schema_until_they_are_gone(tmp_path, mode):
    """The native probe reads one column layout: while a run of an older schema is live, point
    probes take the planned read (same answers); once every run is of the newest, native again."""
    if not point_probe.NATIVE:
        pytest.skip("the native point probe is not built")
    arc, oracle, cols = _start(str(tmp_path / "a"), mode=mode, G=1, E=1)
    with arc.snapshot() as snap:
        assert snap.native_probe(3) is not None
    _grow(arc, oracle, cols, 18)
    with arc.snapshot() as snap:
        # Rebuild rewrote its one sub-index under the new schema; NoRebuild keeps the old run
        assert (snap.native_probe(3) is None) == (mode == "norebuild")
    for at in range(20, 40, 2):
        _grow(arc, oracle, cols, at, None, 5)
        check_reads(arc, oracle, at, list(range(6)), np.random.default_rng(at))
    with arc.snapshot() as snap:  # every record of the first schema has expired (S = 16)
        assert snap.native_probe(3) is not None
    arc.close()


def test_a_data_directory_reads_the_grown_schema(tmp_path):
    arc = Archive.create(str(tmp_path / "arc"), config(mode="norebuild"), data_dir=str(tmp_path / "shared"))
    cols, oracle = Growing(False), Oracle()
    remote = open_readonly(str(tmp_path / "shared"))
    for at, kind in ((16, None), (18, "str"), (20, None), (22, "date")):
        if kind:
            cols.add(kind)
        rows = cols.make(np.random.default_rng(at), 30, at - 15 if at == 16 else at - 1, at, 16, f"u{at}")
        arc.load(cols.table(rows, False, None), at)
        oracle.load(rows, at)
        check_reads(remote, oracle, at, list(range(6)), np.random.default_rng(at))
        assert remote.stats()["schema_history"] == arc.stats()["schema_history"]
    remote.close()
    arc.close()


def _snapshot_of(path: str) -> dict:
    """Everything observable of a closed archive: stats, a scan, and every file's bytes."""
    with open_readonly(path) as arc:
        stats = arc.stats()
        with ArchiveReader(arc) as r:
            scan = rows_multiset(r.scan_table())
    data = {}
    for root, _, names in os.walk(path):
        for n in names:
            if n != "lock.mdb":  # LMDB's reader table changes with every reader
                with open(os.path.join(root, n), "rb") as f:
                    data[os.path.relpath(os.path.join(root, n), path)] = hashlib.sha256(f.read()).hexdigest()
    return {"stats": stats, "scan": scan, "files": data}


REFUSED = {
    "dropped payload": (lambda fs: [f for f in fs if f.name != "payload"],
                        "column 'payload' (string) is missing from the batch"),
    "dropped added column": (lambda fs: [f for f in fs if f.name != "c4_f64"],
                             "column 'c4_f64' (double) is missing from the batch"),
    "retyped payload": (lambda fs: [pa.field(f.name, pa.int64()) if f.name == "payload" else f for f in fs],
                        "column 'payload' is string in the archive but int64 in the batch"),
    "retyped added column": (lambda fs: [pa.field(f.name, pa.string()) if f.name == "c4_f64" else f for f in fs],
                             "column 'c4_f64' is double in the archive but string in the batch"),
    "retyped key": (lambda fs: [pa.field("key", pa.string()) if f.name == "key" else f for f in fs],
                    "column 'key' is int64 in the archive but string in the batch"),
    "retyped exp": (lambda fs: [pa.field("exp", pa.float64()) if f.name == "exp" else f for f in fs],
                    "column 'exp' is int64 in the archive but double in the batch"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
@pytest.mark.parametrize("mode", ["rebuild", "norebuild"])
def test_a_dropped_or_retyped_column_is_refused_and_changes_nothing(tmp_path, case, mode):
    path = str(tmp_path / "a")
    arc, oracle, cols = _start(path, mode=mode)
    _grow(arc, oracle, cols, 18)
    arc.close()
    before = _snapshot_of(path)
    change, words = REFUSED[case]
    fields = change(cols.fields) + [pa.field("extra", pa.int64())]  # a new column too: added only if all else fits
    rows = [{f.name: (1 if pa.types.is_integer(f.type) else "1" if pa.types.is_string(f.type) else 1.0)
             for f in fields} | {"ts": 19, "exp": 25}]
    with Archive(path) as arc:
        with pytest.raises(SchemaError) as e:
            arc.load(pa.Table.from_pylist(rows, schema=pa.schema(fields)), 20)
    msg = str(e.value)
    assert words in msg and "\n" not in msg and msg.startswith("schema does not match the archive's: "), msg
    assert _snapshot_of(path) == before


def test_a_batch_with_the_same_columns_in_another_order_is_accepted(tmp_path):
    arc, oracle, cols = _start(str(tmp_path / "a"))
    rows = cols.make(np.random.default_rng(5), 20, 17, 18, 16, "later")
    arc.load(cols.table(rows, True, np.random.default_rng(3)), 18)
    oracle.load(rows, 18)
    assert arc.stats()["schema_history"][-1]["version"] == 0
    check_reads(arc, oracle, 18, list(range(6)), np.random.default_rng(0))
    arc.close()


def test_a_damaged_schema_history_is_a_corruption_error(tmp_path):
    from ebb.storage.checksum import seal

    path = str(tmp_path / "a")
    arc, oracle, cols = _start(path)
    _grow(arc, oracle, cols, 18)
    with arc.env.begin(write=True) as txn:  # a history that does not fit the schema (sealed as ebb would)
        txn.put(b"schemas", seal(b"SCHH", b"schemas", b"[[4,1,16]]"))
    arc.close()
    with open_readonly(path) as arc, pytest.raises(CorruptionError, match="schema history"):
        ArchiveReader(arc).scan_table()
    with Archive(path) as arc:
        with arc.env.begin(write=True) as txn:  # a flipped bit
            raw = bytearray(txn.get(b"schemas"))
            raw[-2] ^= 1
            txn.put(b"schemas", bytes(raw))
    with open_readonly(path) as arc, pytest.raises(CorruptionError):
        ArchiveReader(arc).probe(3)
    with Archive(path, readonly=True) as arc, pytest.raises(CorruptionError, match="schema history"):
        verify(arc)  # a version whose metadata cannot be read is corruption (exit 6), not a list of problems


@pytest.mark.parametrize("copy", [False, True])
@pytest.mark.parametrize("mode", ["rebuild", "norebuild"])
def test_a_layout_change_keeps_the_grown_schema(tmp_path, mode, copy):
    """A migration after a load added columns: a copy rewrites older runs' rows with nulls in the
    new columns; a drain leaves them as written; either way the answers stay the oracle's."""
    from ebb.storage.migration import migrate, target_config

    arc, oracle, cols = _start(str(tmp_path / "a"), mode=mode)
    _grow(arc, oracle, cols, 18, "str")
    migrate(arc, target_config(arc.config, layout="wave", mode="norebuild" if mode == "rebuild" else "rebuild"),
            copy=copy)
    check_reads(arc, oracle, 18, list(range(6)), np.random.default_rng(0))
    for at, kind in ((20, "i32"), (22, None), (24, None)):
        _grow(arc, oracle, cols, at, kind)
        check_reads(arc, oracle, at, list(range(6)), np.random.default_rng(at))
    assert verify(arc)[0] == []
    arc.close()


def test_spark_executors_load_a_batch_that_adds_a_column(spark, tmp_path):
    """``ebb run --load-on executors`` (indexer/executor_load.py): a tick's DataFrame with a new
    column adds it; one that lacks it is refused with the archive unchanged."""
    from ebb.indexer.executor_load import load

    path = str(tmp_path / "a")
    base = "key long, ts long, exp long, payload string"
    oracle = Oracle()
    with Archive.create(path, config(mode="norebuild", block_bytes=300)) as arc:
        for at, cols, rows in (
            (16, base, [(k, 10 + k, 20 + k, f"p{k}") for k in range(6)]),
            (18, base + ", x double", [(k, 17, 30, None, k / 2 if k % 2 else None) for k in range(6)]),
            (20, base + ", x double", [(1, 19, 23, "q", 0.25)]),
        ):
            load(spark, arc, spark.createDataFrame(rows, cols), at, part_bytes=700)
            names = [c.split()[0] for c in cols.split(", ")]
            oracle.load([dict(zip(names, r)) for r in rows], at)
            for r in oracle.records:  # rows loaded before x existed read null in it
                r.update({c: r.get(c) for c in names})
            check_reads(arc, oracle, at, list(range(6)), np.random.default_rng(at))
        assert [v["added"] for v in arc.stats()["schema_history"]] == [["key", "ts", "exp", "payload"], ["x"]]
    before = _snapshot_of(path)
    with Archive(path) as arc, pytest.raises(SchemaError, match="column 'x' \\(double\\) is missing"):
        load(spark, arc, spark.createDataFrame([(1, 21, 25, "r")], base), 22)
    assert _snapshot_of(path) == before


def test_an_archive_from_before_schema_histories_reads_and_grows(tmp_path):
    """Archives written before schema growth have no ``schemas`` entry and runs without a schema
    version: their schema is version 0, and a later load grows it as any other."""
    path = str(tmp_path / "a")
    arc, oracle, cols = _start(path)
    from ebb.storage.checksum import seal, unseal
    from ebb.storage.manifest import read_state_bytes

    with arc.env.begin(write=True) as txn:  # as such an archive is: no ``schemas``, and no root naming it
        txn.delete(b"schemas")
        body = bytes(unseal(b"STAT", b"state", read_state_bytes(txn), "archive state")).partition(b"\n")[0]
        txn.put(b"state", seal(b"STAT", b"state", body))
    arc.close()
    with Archive(path) as arc:
        assert arc.stats()["schema_history"] == [
            {"version": 0, "added": ["key", "ts", "exp", "payload"], "update": None, "time": None, "columns": 4}]
        check_reads(arc, oracle, 16, list(range(6)), np.random.default_rng(0))
        _grow(arc, oracle, cols, 18, "bool")
        assert [(v["version"], v["update"]) for v in arc.stats()["schema_history"]] == [(0, None), (1, 2)]
        check_reads(arc, oracle, 18, list(range(6)), np.random.default_rng(1))
        assert verify(arc)[0] == []
