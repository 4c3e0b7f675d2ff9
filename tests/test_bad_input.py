"""docs/spec.md section 5: every kind of bad batch is rejected whole, with a message naming the problem
and the number of offending rows, exit code 3, and the archive exactly as it was."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ebb.storage.archive import Archive
from ebb.query.reader import ArchiveReader

from support import SCHEMA, config, ebb, rows_multiset

TAU, DELTA, S = 100, 10, 50


def good_rows(T, n=20, tag="g"):
    return [{"key": i % 4, "ts": T - (i % DELTA), "exp": T - (i % DELTA) + 1 + (i * 7) % S, "payload": f"{tag}{i}"} for i in range(n)]


@pytest.fixture
def archive(tmp_path):
    path = str(tmp_path / "arc")
    with Archive.create(path, config(tau=TAU, delta=DELTA, max_lifetime=S, mode="norebuild")) as arc:
        arc.load(pa.Table.from_pylist(good_rows(TAU, 60), schema=SCHEMA), TAU)
        arc.load(pa.Table.from_pylist(good_rows(TAU + DELTA, tag="h"), schema=SCHEMA), TAU + DELTA)
    return path


def fingerprint(path):
    """Everything observable: stats (incl. update log), files and their sizes, and reads."""
    st = ebb("stats", path, "--format", "json")
    assert st.returncode == 0, st.stderr
    files = sorted((f, os.path.getsize(os.path.join(path, "data", f))) for f in os.listdir(os.path.join(path, "data")))
    with ArchiveReader(path) as r:
        reads = (rows_multiset(r.scan_table()), rows_multiset(r.scan_table(as_of=TAU + DELTA + 7)),
                 rows_multiset(r.probe(1)), rows_multiset(r.probe_range(1, 2)))
    return json.loads(st.stdout), files, reads


def write(tmp_path, rows_or_table, schema=SCHEMA, name="in.parquet"):
    t = rows_or_table if isinstance(rows_or_table, pa.Table) else pa.Table.from_pylist(rows_or_table, schema=schema)
    p = tmp_path / name
    pq.write_table(t, p)
    return p


T_NEXT = TAU + 2 * DELTA


def with_bad(n_bad, change):
    rows = good_rows(T_NEXT)
    for r in rows[3 : 3 + n_bad]:
        change(r)
    return rows


CASES = {
    "exp <= ts": (with_bad(3, lambda r: r.update(exp=r["ts"])), T_NEXT, ["3 rows", "exp <= ts"]),
    "exp < ts": (with_bad(2, lambda r: r.update(exp=r["ts"] - 5)), T_NEXT, ["2 rows", "exp <= ts"]),
    "ts after T": (with_bad(4, lambda r: r.update(ts=T_NEXT + 1, exp=T_NEXT + 5)), T_NEXT, ["4 rows", "after the update time"]),
    "null key": (with_bad(1, lambda r: r.update(key=None)), T_NEXT, ["1 rows", "null key"]),
    "null ts": (with_bad(2, lambda r: r.update(ts=None)), T_NEXT, ["2 rows", "null ts"]),
    "null exp": (with_bad(5, lambda r: r.update(exp=None)), T_NEXT, ["5 rows", "null exp"]),
    "lifetime over S": (with_bad(3, lambda r: r.update(exp=r["ts"] + S + 1)), T_NEXT, ["3 rows", "over S=50"]),
    "time off the grid": (good_rows(T_NEXT), T_NEXT + 3, ["not tau + j*Delta"]),
    "time equal to last": (good_rows(TAU + DELTA), TAU + DELTA, ["not after the last update"]),
    "time before last": (good_rows(TAU), TAU, ["not after the last update"]),
    "time before tau": (good_rows(TAU - DELTA), TAU - DELTA, ["not after the last update"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_rejected_and_unchanged(tmp_path, archive, case):
    rows, at, words = CASES[case]
    before = fingerprint(archive)
    r = ebb("load", archive, write(tmp_path, rows), "--at", at)
    assert r.returncode == 3, (r.stdout, r.stderr)
    for w in words:
        assert w in r.stderr, r.stderr
    assert fingerprint(archive) == before
    # the archive still takes the next good update
    assert ebb("load", archive, write(tmp_path, good_rows(T_NEXT, tag="ok"), name="ok.parquet"), "--at", T_NEXT).returncode == 0


def test_all_problems_reported_together(tmp_path, archive):
    rows = good_rows(T_NEXT)
    rows[0]["exp"] = rows[0]["ts"]
    rows[1]["key"] = None
    rows[2]["exp"] = rows[2]["ts"] + S + 9
    r = ebb("load", archive, write(tmp_path, rows), "--at", T_NEXT)
    assert r.returncode == 3
    assert "1 rows have a null key" in r.stderr and "exp <= ts" in r.stderr and "over S" in r.stderr


# an extra (new) column is not a mismatch: it is added (tests/test_schema_growth.py)
SCHEMA_CASES = {
    "missing payload": (pa.schema([("key", pa.int64()), ("ts", pa.int64()), ("exp", pa.int64())]),
                        "column 'payload' (string) is missing"),
    "payload type": (pa.schema([("key", pa.int64()), ("ts", pa.int64()), ("exp", pa.int64()), ("payload", pa.float64())]),
                     "column 'payload' is string in the archive but double in the batch"),
    "key type": (pa.schema([("key", pa.string()), ("ts", pa.int64()), ("exp", pa.int64()), ("payload", pa.string())]),
                 "column 'key' is int64 in the archive but string in the batch"),
    "ts type": (pa.schema([("key", pa.int64()), ("ts", pa.float64()), ("exp", pa.int64()), ("payload", pa.string())]),
                "column 'ts' is int64 in the archive but double in the batch"),
}


@pytest.mark.parametrize("case", sorted(SCHEMA_CASES))
def test_schema_mismatch(tmp_path, archive, case):
    schema, words = SCHEMA_CASES[case]
    cols = {f.name: pa.array([1, 2], f.type) if not pa.types.is_string(f.type) else pa.array(["1", "2"]) for f in schema}
    cols["ts"] = pa.array([T_NEXT, T_NEXT], schema.field("ts").type)
    cols["exp"] = pa.array([T_NEXT + 5, T_NEXT + 6], schema.field("exp").type)
    before = fingerprint(archive)
    r = ebb("load", archive, write(tmp_path, pa.table(cols, schema=schema)), "--at", T_NEXT)
    assert r.returncode == 3, r.stderr
    assert "schema does not match" in r.stderr and words in r.stderr, r.stderr
    assert fingerprint(archive) == before


def test_unreadable_and_missing_input(tmp_path, archive):
    before = fingerprint(archive)
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"not parquet at all")
    r = ebb("load", archive, junk, "--at", T_NEXT)
    assert r.returncode == 3 and "cannot read" in r.stderr
    r = ebb("load", archive, tmp_path / "nope.parquet", "--at", T_NEXT)
    assert r.returncode == 3 and "does not exist" in r.stderr
    assert fingerprint(archive) == before


def test_first_load_schema_problems(tmp_path):
    path = tmp_path / "fresh"
    assert ebb("init", path, "--layout", "doubly", "--G", 2, "--E", 2, "--mode", "rebuild", "--max-lifetime", S,
               "--interval", DELTA, "--start", TAU).returncode == 0
    t = pa.table({"key": [1], "ts": [TAU], "payload": ["x"]})
    r = ebb("load", path, write(tmp_path, t), "--at", TAU)
    assert r.returncode == 3 and "exp column 'exp' is missing" in r.stderr
    t = pa.table({"key": pa.array([[1]], pa.list_(pa.int64())), "ts": [TAU], "exp": [TAU + 1]})
    r = ebb("load", path, write(tmp_path, t, name="b.parquet"), "--at", TAU)
    assert r.returncode == 3 and "key" in r.stderr
    t = pa.table({"key": ["x" * 600], "ts": [TAU], "exp": [TAU + 1]})
    r = ebb("load", path, write(tmp_path, t, name="c.parquet"), "--at", TAU)
    assert r.returncode == 3 and "longer than 510 bytes" in r.stderr
    assert json.loads(ebb("stats", path, "--format", "json").stdout)["schema"] is None


def test_overlong_accepted_when_configured(tmp_path):
    """With --accept-overlong, lifetimes over S are stored and stay correct until they expire."""
    path = str(tmp_path / "long")
    with Archive.create(path, config(tau=TAU, delta=DELTA, max_lifetime=S, accept_overlong=True)) as arc:
        rows = [{"key": 1, "ts": TAU, "exp": TAU + 3 * S, "payload": "long"}, {"key": 1, "ts": TAU, "exp": TAU + 5, "payload": "short"}]
        arc.load(pa.Table.from_pylist(rows, schema=SCHEMA), TAU)
        for j in range(1, 3 * S // DELTA + 2):
            T = TAU + j * DELTA
            arc.load(pa.Table.from_pylist([], schema=SCHEMA), T)
            with ArchiveReader(arc) as r:
                got = [x["payload"] for x in r.probe(1).to_pylist()]
            assert got == (["long"] if T < TAU + 3 * S else []), (T, got)
        from ebb.storage.verify import verify

        assert verify(arc)[0] == []


def test_bad_init_arguments(tmp_path):
    r = ebb("init", tmp_path / "x", "--layout", "doubly", "--partitioning", "chronological", "--G", 9, "--E", 2,
            "--mode", "rebuild", "--max-lifetime", 16, "--interval", 2, "--start", 0)
    assert r.returncode == 2 and "at most p" in r.stderr
    r = ebb("init", tmp_path / "y", "--layout", "wave", "--n", 4, "--mode", "rebuild", "--max-lifetime", 0, "--interval", 2, "--start", 0)
    assert r.returncode == 2 and "max-lifetime" in r.stderr
    r = ebb("init", tmp_path / "z", "--layout", "wave", "--G", 2, "--mode", "rebuild", "--max-lifetime", 8, "--interval", 2, "--start", 0)
    assert r.returncode == 2
    r = ebb("init", tmp_path / "w", "--layout", "wave", "--mode", "rebuild", "--section-slots", 2, "--max-lifetime", 8,
            "--interval", 2, "--start", 0)
    assert r.returncode == 2 and "--section-slots above 1 needs --mode norebuild" in r.stderr and not (tmp_path / "w").exists()
    r = ebb("probe", tmp_path / "nothing", "1")
    assert r.returncode == 1 and "not an ebb archive" in r.stderr


# -- found by fuzzing the first engine: each rejected whole, or refused at init -----------------------
def test_times_whose_difference_overflows_are_rejected(tmp_path, archive):
    """ts = -2**62, exp = 2**62 + 10: exp - ts overflows int64; it must not pass as a short lifetime."""
    rows = with_bad(2, lambda r: r.update(ts=-(2**62), exp=2**62 + 10))
    before = fingerprint(archive)
    r = ebb("load", archive, write(tmp_path, rows), "--at", T_NEXT)
    assert r.returncode == 3 and "2 rows" in r.stderr and "outside" in r.stderr, r.stderr
    assert fingerprint(archive) == before


def test_invalid_utf8_is_rejected(tmp_path, archive):
    from ebb.storage.errors import RejectedBatch

    bad = pa.array([b"ok", b"\xff\xfe", b"also ok", b"\xc3"], pa.binary()).view(pa.string())
    t = pa.table({"key": [1, 2, 3, 1], "ts": [T_NEXT] * 4, "exp": [T_NEXT + 5] * 4, "payload": bad})
    before = fingerprint(archive)
    with Archive(archive) as arc, pytest.raises(RejectedBatch, match="2 rows have a payload that is not valid UTF-8"):
        arc.load(t, T_NEXT)
    assert fingerprint(archive) == before
    keys = pa.array([b"a", b"\x80"], pa.binary()).view(pa.string())
    path = str(tmp_path / "strkeys")
    with Archive.create(path, config(tau=TAU, delta=DELTA, max_lifetime=S)) as arc, \
            pytest.raises(RejectedBatch, match="1 rows have a key that is not valid UTF-8"):
        arc.load(pa.table({"key": keys, "ts": [TAU, TAU], "exp": [TAU + 1, TAU + 2]}), TAU)


def test_reserved_column_names_are_explained(tmp_path):
    path = str(tmp_path / "arc")
    with Archive.create(path, config(tau=TAU, delta=DELTA, max_lifetime=S)) as arc:
        from ebb.storage.errors import RejectedBatch

        with pytest.raises(RejectedBatch, match="'__ebb_sub' is reserved"):
            arc.load(pa.table({"key": [1], "ts": [TAU], "exp": [TAU + 1], "__ebb_sub": [0]}), TAU)
        assert arc.stats()["updates"] == 0


def test_configuration_is_checked_and_completed_in_the_library():
    from ebb.storage.config import MAX_SLOTS, ArchiveConfig, build_config
    from ebb.storage.errors import ConfigError

    cfg = build_config(layout="doubly", mode="rebuild", interval=10, max_lifetime=37)
    assert cfg.max_lifetime == 40 and cfg.time.p == 4 and (cfg.G, cfg.E) == (2, 2)
    for bad in (dict(interval=0), dict(interval=-3), dict(max_lifetime=0)):
        with pytest.raises(ConfigError):
            build_config(**{**dict(layout="doubly", mode="rebuild", interval=10, max_lifetime=40), **bad})
    with pytest.raises(ConfigError, match=f"at most {MAX_SLOTS}"):
        build_config(layout="doubly", mode="rebuild", interval=1, max_lifetime=10**9)
    with pytest.raises(ConfigError, match="start"):
        build_config(layout="doubly", mode="rebuild", interval=1, max_lifetime=10, start=-(2**62))
    with pytest.raises(ConfigError, match="reserved"):
        build_config(layout="doubly", mode="rebuild", interval=1, max_lifetime=10, key_column="__ebb_key")
    with pytest.raises(ConfigError):
        Archive.create("/nonexistent-never-created", cfg.__class__(**{**cfg.__dict__, "delta": 0}))
    # sections wider than a slot: NoRebuild, where no sub-index is chosen by expiration slot
    wide = dict(mode="norebuild", interval=1, max_lifetime=8, section_slots=2)
    assert build_config(layout="wave", **wide).section_slot(np.arange(1, 6)).tolist() == [1, 3, 3, 5, 5]
    assert build_config(layout="doubly", G=4, E=1, **wide).section_slots == 2
    for bad, msg in ((dict(layout="wave", split="expiration"), "needs --mode norebuild"),
                     (dict(layout="doubly"), "needs --mode norebuild"), (dict(layout="wave", mode="rebuild"), "needs"),
                     (dict(layout="wave", section_slots=9), "from 1 to p"), (dict(layout="wave", section_slots=0), "from 1")):
        with pytest.raises(ConfigError, match=msg):
            build_config(**{**wide, **bad})
    # the stored configuration names section_slots only when it is not 1, as archives made before it
    assert b"section_slots" not in cfg.to_json()
    assert ArchiveConfig.from_json(build_config(layout="wave", **wide).to_json()).section_slots == 2


def test_huge_p_refused_at_init(tmp_path):
    r = ebb("init", tmp_path / "x", "--layout", "doubly", "--mode", "rebuild", "--max-lifetime", 10**9,
            "--interval", 1, "--start", 0)
    assert r.returncode == 2 and "at most 1000000" in r.stderr, r.stderr
    assert not (tmp_path / "x").exists()


def test_metadata_on_a_network_file_system_is_refused(tmp_path, monkeypatch):
    from ebb.storage import files
    from ebb.storage.errors import ArchiveError

    (tmp_path / "nfs").mkdir()  # the mount point
    mounts = tmp_path / "mounts"
    mounts.write_text(f"/dev/vda / ext4 rw 0 0\nserver:/export {tmp_path / 'nfs'} nfs4 rw 0 0\n")
    real_open = open
    monkeypatch.setattr("builtins.open", lambda p, *a, **k: real_open(mounts if p == "/proc/mounts" else p, *a, **k))
    assert files.filesystem_type(str(tmp_path / "nfs" / "not" / "yet")) == "nfs4"
    assert files.filesystem_type(str(tmp_path / "local")) == "ext4"
    with pytest.raises(ArchiveError, match="nfs4 file system; the archive's metadata"):
        Archive.create(str(tmp_path / "nfs" / "arc"), config())
    assert not os.path.exists(tmp_path / "nfs" / "arc")
    # the data files may go there: only the metadata must stay local
    Archive.create(str(tmp_path / "arc"), config(), data_dir=str(tmp_path / "nfs" / "data")).close()
    with Archive(str(tmp_path / "arc")) as arc:
        assert arc.data_dir == str(tmp_path / "nfs" / "data")
