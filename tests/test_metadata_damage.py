"""Damaged metadata is an error, never a wrong answer, a laundered update or an abort (issue 29).

- Every page of ``data.mdb`` of a small archive, zeroed and then random: ``verify``, ``stats``,
  a scan, probes and range probes each answer correctly or fail with CorruptionError; none
  aborts (each case runs in a forked child, whose death by a signal fails the test).
- Single-bit flips in the keys and the values of the live LMDB entries (found by walking the
  current version's B+-tree), of the archive's ``data.mdb`` and of the newest published copy,
  in both modes, with int64 and string keys: no read returns a wrong row, ``verify`` reports
  every flip (each changes committed state: every live entry is sealed with its key, and the
  root names every entry a version needs), and a load after the flip is refused or leaves an
  archive that answers correctly.

``EBB_METADATA_FLIPS`` (flips per case, default 64: 512 in all, about a minute) runs longer.
"""

from __future__ import annotations

import json
import zlib
import os
import shutil

import lmdb
import numpy as np
import pyarrow as pa
import pytest

from ebb.storage import page_walk
from ebb.storage.archive import Archive, open_readonly
from ebb.storage.errors import CorruptionError, EbbError
from ebb.storage.point_probe import NATIVE, _point_probe
from ebb.storage.verify import verify

from support import Oracle, archive_answers, config, random_rows, table_of

TAU, DELTA, S = 16, 2, 16
FLIPS = int(os.environ.get("EBB_METADATA_FLIPS", 64))


def _schema(key_type):
    return pa.schema([("key", key_type), ("ts", pa.int64()), ("exp", pa.int64()), ("payload", pa.string())])


def _rows(rng, n, lo, hi, tag, string_keys):
    rows = random_rows(rng, n, lo, hi, S, 12, tag)
    if string_keys:
        for r in rows:
            r["key"] = f"k{r['key']:02d}"
    return rows


def _build(path, mode, string_keys, data_dir=None):
    """A small archive (4 updates, kept versions, a checkpoint) and its oracle."""
    rng = np.random.default_rng(7)
    schema, oracle = _schema(pa.string() if string_keys else pa.int64()), Oracle()
    with Archive.create(path, config(mode=mode, block_bytes=1024, retain=8), data_dir=data_dir) as arc:
        for k, t in enumerate((16, 18, 20, 22)):
            rows = _rows(rng, 400 if t == TAU else 120, t - (S if t == TAU else DELTA) + 1, t, f"u{t}", string_keys)
            arc.load(table_of(rows, schema), t, checkpoint={"producer": json.dumps({"tick": k}).encode()})
            oracle.load(rows, t)
    nxt = _rows(rng, 60, 23, 24, "next", string_keys)
    return oracle, schema, nxt


def _queries(string_keys):
    if string_keys:
        return ("k00", "k05", "k09"), (("k00", "k04"), ("k05", "k40"))
    return (0, 5, 9), ((0, 4), (5, 40))


def _want(oracle, t, probes, ranges):
    return {"scan": oracle.scan(t), "probes": {k: oracle.probe(k, t) for k in probes},
            "ranges": {r: oracle.probe_range(*r, t) for r in ranges}}


def _in_child(fn) -> dict:
    """``fn()`` (a JSON-able result) in a forked child; {"died": signal} if the child died."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(r)
        try:
            out = fn()
        except BaseException as e:  # noqa: BLE001 - reported to the parent, which asserts
            out = {"unexpected": f"{type(e).__name__}: {e}"}
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return {"died": os.WTERMSIG(status)}
    return json.loads(data)


def _reads(path, t, probes, ranges, want) -> dict:
    """In the child: verify and every read of ``path``; whether each was right or an ebb error."""
    out = {"verify": None, "reads": None}
    try:
        arc = open_readonly(path) if not os.path.isfile(os.path.join(path, "EBB")) else Archive(path)
    except EbbError as e:
        return {"verify": "error", "reads": "error", "open": str(e)}
    with arc:
        try:
            problems, _ = verify(arc)
            out["verify"] = "problems" if problems else "ok"
        except EbbError:
            out["verify"] = "error"
        try:
            arc.stats()
        except EbbError:
            pass
        try:
            out["reads"] = "right" if archive_answers(arc, t, probes, ranges) == want else "WRONG"
        except EbbError:
            out["reads"] = "error"
    return out


def _live_nodes(index_dir):
    """(key offset, key size, value offset, value size) of each live entry of the current
    version of ``index_dir``/data.mdb, from its B+-tree (values in overflow pages included)."""
    env = lmdb.open(index_dir, readonly=True, lock=False)
    with env.begin() as txn:
        tid = txn.id()
    env.close()
    buf = np.fromfile(os.path.join(index_dir, "data.mdb"), np.uint8)
    pages = buf[:buf.size // 4096 * 4096].reshape(-1, 4096)
    root = None
    for at in (0, 4096):
        m = buf[at + 16:at + 168]
        if int(m[128:136].view(np.uint64)[0]) == tid:
            root = int(m[112:120].view(np.uint64)[0])
    out, todo = [], [root]
    while todo:
        pg = todo.pop()
        p = pages[pg]
        h = p[:16].view(np.uint16)
        for i in range((int(h[6]) - 16) // 2):
            ptr = int(p[16 + 2 * i:18 + 2 * i].view(np.uint16)[0])
            lo, hi, nf, ks = (int(x) for x in p[ptr:ptr + 8].view(np.uint16))
            if int(h[5]) == 1:
                todo.append(lo | hi << 16 | nf << 32)
                continue
            size = lo | hi << 16
            at = pg * 4096 + ptr + 8 + ks
            if nf & 1:  # the value is in overflow pages
                at = int(p[ptr + 8 + ks:ptr + 16 + ks].view(np.uint64)[0]) * 4096 + 16
            out.append((pg * 4096 + ptr + 8, ks, at, size))
    return out


def _flip(path, at, rng):
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)[0]
        f.seek(at)
        f.write(bytes([b ^ (1 << int(rng.integers(8)))]))


@pytest.mark.parametrize("string_keys", [False, True], ids=["int", "string"])
@pytest.mark.parametrize("mode", ["rebuild", "norebuild"])
@pytest.mark.parametrize("where", ["archive", "published"])
def test_bit_flips_in_metadata_keys_and_values(tmp_path, mode, string_keys, where):
    base, data = str(tmp_path / "base"), str(tmp_path / "base-data")
    oracle, schema, nxt = _build(base, mode, string_keys, data if where == "published" else None)
    probes, ranges = _queries(string_keys)
    want = _want(oracle, 22, probes, ranges)
    after = Oracle()
    after.records = list(oracle.records)
    after.load(nxt, 24)
    want_after = _want(after, 24, probes, ranges)
    if where == "published":
        with open(os.path.join(data, "meta", "CURRENT")) as f:
            index = os.path.join("meta", json.load(f)["copy"])
    else:
        index = "index"
    nodes = _live_nodes(os.path.join(data if where == "published" else base, index))
    rng = np.random.default_rng(zlib.crc32(f"{mode}-{string_keys}-{where}".encode()))  # hash() varies by process
    seen = {"right": 0, "error": 0}
    for n in range(FLIPS):
        arc, dd = str(tmp_path / "a"), str(tmp_path / "a-data")
        for src, dst in ((base, arc), (data, dd)):
            shutil.rmtree(dst, ignore_errors=True)
            if os.path.isdir(src):
                shutil.copytree(src, dst)
        if where == "published":  # the copy names its data directory in the marker: repoint it
            with open(os.path.join(arc, "EBB"), "w") as f:
                json.dump({"format": 2, "data": dd}, f)
        key_at, ks, val_at, size = nodes[int(rng.integers(len(nodes)))]
        at = key_at + int(rng.integers(ks)) if n % 2 == 0 else val_at + int(rng.integers(size))
        root = dd if where == "published" else arc
        _flip(os.path.join(root, index, "data.mdb"), at, rng)
        got = _in_child(lambda: _reads(root, 22, probes, ranges, want))
        assert "died" not in got and "unexpected" not in got, (n, got)
        assert got["reads"] != "WRONG", f"flip {n} at byte {at}: a read returned wrong rows"
        assert got["verify"] != "ok", f"flip {n} at byte {at}: verify did not report it"
        seen[got["reads"]] += 1
        if where == "archive" and n % 4 == 0:
            def load():
                try:
                    with Archive(arc) as a:
                        a.load(table_of(nxt, schema), 24)
                except EbbError:
                    return {"load": "refused"}
                return {"load": "committed", **_reads(arc, 24, probes, ranges, want_after)}
            got = _in_child(load)
            assert "died" not in got and "unexpected" not in got, (n, got)
            if got["load"] == "committed":  # it must not launder the damage into a wrong archive
                assert got["reads"] != "WRONG", f"flip {n}: a load after it left wrong answers"
                assert got["verify"] != "ok" or got["reads"] == "right", f"flip {n}: laundered"
    assert seen["right"] + seen["error"] == FLIPS


def _pages_case(path, probes, ranges, want) -> dict:
    out = _reads(path, 22, probes, ranges, want)
    for name in ("verify", "reads"):
        if out[name] not in ("ok", "right", "error", "problems"):
            out["bad"] = name
    return out


@pytest.mark.parametrize("mode", ["rebuild", "norebuild"])
def test_every_damaged_page_is_an_error_or_a_right_answer(tmp_path, mode):
    base = str(tmp_path / "base")
    oracle, _, _ = _build(base, mode, False)
    probes, ranges = _queries(False)
    want = _want(oracle, 22, probes, ranges)
    size = os.path.getsize(os.path.join(base, "index", "data.mdb"))
    rng = np.random.default_rng(3)
    arc = str(tmp_path / "a")
    for page in range(size // 4096):
        for fill in (bytes(4096), rng.bytes(4096)):
            shutil.rmtree(arc, ignore_errors=True)
            shutil.copytree(base, arc)
            with open(os.path.join(arc, "index", "data.mdb"), "r+b") as f:
                f.seek(page * 4096)
                f.write(fill)
            got = _in_child(lambda: _pages_case(arc, probes, ranges, want))
            assert "died" not in got, f"page {page}: the process died on signal {got.get('died')}"
            assert "unexpected" not in got and "bad" not in got, (page, got)
            assert got["reads"] != "WRONG", f"page {page}: a read returned wrong rows"


def test_a_lost_schema_key_is_corruption_not_an_empty_archive(tmp_path):
    """Issue 29's example: the key ``schema`` flipped to ``schemc``."""
    base = str(tmp_path / "a")
    _build(base, "rebuild", False)
    key_at = next(k for k, ks, _, _ in _live_nodes(os.path.join(base, "index")) if ks == 6 and
                  open(os.path.join(base, "index", "data.mdb"), "rb").read()[k:k + 6] == b"schema")
    with open(os.path.join(base, "index", "data.mdb"), "r+b") as f:
        f.seek(key_at + 5)
        f.write(b"c")
    with pytest.raises(CorruptionError, match="schema"):
        archive_answers(base, 22, (5,))
    with pytest.raises(CorruptionError):
        with Archive(base) as a:
            a.load(table_of([{"key": 1, "ts": 23, "exp": 30, "payload": 1.5}], _schema(pa.int64()).set(
                3, pa.field("payload", pa.float64()))), 24)


@pytest.mark.skipif(not NATIVE, reason="the native module is not built")
@pytest.mark.parametrize("mode", ["rebuild", "norebuild"])
def test_native_page_walk_agrees_with_numpys(tmp_path, mode):
    """storage/native/lmdb_pages.c makes page_walk's checks: on the intact file and on each of
    hundreds of damaged copies (bytes of page headers and node pointers changed, whole pages
    zeroed or random, the file cut short), it fails exactly where the numpy walk does."""
    base = str(tmp_path / "base")
    _build(base, mode, False)
    path = os.path.join(base, "index", "data.mdb")
    env = lmdb.open(os.path.dirname(path), readonly=True, lock=False)
    with env.begin() as txn:
        tid = txn.id()
    env.close()
    intact = np.fromfile(path, np.uint8)
    pages = intact.size // 4096
    rng = np.random.default_rng(11)
    outcomes = {"ok": 0, "damaged": 0}
    for case in range(600):
        buf = intact.copy()
        page = int(rng.integers(pages))
        kind = case % 4
        if kind == 0:  # a header or node-pointer byte of a page
            buf[page * 4096 + int(rng.integers(64))] ^= np.uint8(1 << int(rng.integers(8)))
        elif kind == 1:  # any byte of a page
            buf[page * 4096 + int(rng.integers(4096))] = rng.integers(256)
        elif kind == 2:  # a whole page zeroed or random
            buf[page * 4096:(page + 1) * 4096] = 0 if rng.integers(2) else rng.integers(0, 256, 4096)
        else:  # cut short
            buf = buf[:int(rng.integers(2 * 4096, buf.size))]
        try:
            page_walk._check(buf, path, tid)
            numpy_ok = True
        except CorruptionError:
            numpy_ok = False
        failure = _point_probe.check_lmdb_pages(buf, tid)
        assert (failure is None) == numpy_ok, (case, kind, page, failure)
        outcomes["ok" if numpy_ok else "damaged"] += 1
    assert _point_probe.check_lmdb_pages(intact, tid) is None
    assert outcomes["ok"] > 50 and outcomes["damaged"] > 50, outcomes


@pytest.mark.skipif(not NATIVE, reason="the native module is not built")
def test_a_kept_map_reads_the_pages_the_file_grows_by(tmp_path):
    """The native page walk keeps its map of an archive's file with room to grow: after the file
    grows in place, the next check reads the new pages through the same map, and a damaged page
    among them is found, as the numpy walk finds it."""
    base = str(tmp_path / "base")
    _build(base, "norebuild", False)
    src = os.path.join(base, "index", "data.mdb")

    def version():
        env = lmdb.open(os.path.dirname(src), readonly=True, lock=False)
        with env.begin() as txn:
            tid = txn.id()
        env.close()
        return np.fromfile(src, np.uint8), tid

    small, small_tid = version()
    rng = np.random.default_rng(3)
    with Archive(base) as arc:
        for t in range(24, 24 + 2 * 12, 2):
            arc.load(table_of(_rows(rng, 400, t - DELTA + 1, t, f"g{t}", False), _schema(pa.int64())), t)
    big, big_tid = version()
    assert big.size > small.size
    path = str(tmp_path / "copy.mdb")
    small.tofile(path)
    try:
        page_walk.check(path, small_tid, keep_map=True)
        kept = page_walk._maps[path][1]
        with open(path, "r+b") as f:  # the same file, grown in place as LMDB grows it
            f.write(big.tobytes())
        page_walk.check(path, big_tid, keep_map=True)
        assert page_walk._maps[path][1] is kept
        damaged = big.copy()
        damaged[small.size:] = 0  # every page the file grew by
        with pytest.raises(CorruptionError):
            page_walk._check(damaged, path, big_tid)
        with open(path, "r+b") as f:
            f.seek(small.size)
            f.write(damaged[small.size:].tobytes())
        with pytest.raises(CorruptionError, match="copy.mdb"):
            page_walk.check(path, big_tid, keep_map=True)
        assert page_walk._maps[path][1] is kept
    finally:
        page_walk.forget(path)
