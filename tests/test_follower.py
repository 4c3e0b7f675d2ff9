"""A reader that follows new versions off the request path (storage/follower.py): its probes
answer from a committed version, the newest within milliseconds, never a mix; probes as of an
instant the served version cannot answer open a snapshot of their own; and the follower
thread stops with the reader."""

from __future__ import annotations

import threading
import time

import numpy as np
import pyarrow as pa
import pytest

from ebb.query.reader import ArchiveReader
from ebb.storage import point_probe
from ebb.storage.archive import Archive

from support import SCHEMA, Oracle, config, random_rows, rows_multiset, table_of

# the follower prepares versions for the native point probe; without it (EBB_NATIVE=0, or not
# built) it serves none, and every probe opens its own snapshot (the other tests' path)
pytestmark = pytest.mark.skipif(not point_probe.NATIVE, reason="the native point probe is off")


def _wait_served(reader: ArchiveReader, seq: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        served = reader.served_snapshot()
        if served is not None and served.state.update_seq == seq:
            return True
        time.sleep(0.002)
    return False


def _norebuild_archive_loaded_at_16(tmp_path, rng: np.random.Generator) -> tuple[str, Archive, Oracle]:
    """A NoRebuild archive with one load of 200 rows at time 16 (the writer left open), and its oracle."""
    path = str(tmp_path / "a")
    writer = Archive.create(path, config(mode="norebuild"))
    oracle = Oracle()
    rows = random_rows(rng, 200, 1, 16, 16, 12)
    writer.load(table_of(rows, SCHEMA), 16)
    oracle.load(rows, 16)
    return path, writer, oracle


def test_probes_follow_each_commit_and_never_mix_versions(tmp_path):
    rng = np.random.default_rng(4)
    path = str(tmp_path / "a")
    writer = Archive.create(path, config(mode="rebuild", block_bytes=512))
    oracle = Oracle()
    rows = random_rows(rng, 300, 1, 16, 16, 12)
    writer.load(table_of(rows, SCHEMA), 16)
    oracle.load(rows, 16)
    reader = ArchiveReader(path, follow=True)
    answers: dict[int, dict[int, object]] = {16: {k: oracle.probe(k, 16) for k in range(12)}}
    wrong, stop = [], threading.Event()

    def probing():  # any answer must be some committed version's, as of that version's time
        while not stop.is_set():
            k = int(np.random.default_rng().integers(12))
            try:
                got = rows_multiset(reader.probe(k))
            except Exception as e:  # a probe racing a switch must not fail
                wrong.append((k, repr(e)))
                continue
            if got not in [a[k] for a in list(answers.values())]:
                wrong.append((k, got))

    threads = [threading.Thread(target=probing) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for T in range(18, 50, 2):
            rows = random_rows(rng, 150, T - 1, T, 16, 12, tag=str(T))
            nxt = Oracle()
            nxt.records = list(oracle.records)
            nxt.load(rows, T)
            answers[T] = {k: nxt.probe(k, T) for k in range(12)}
            writer.load(table_of(rows, SCHEMA), T)
            oracle = nxt
            assert _wait_served(reader, writer.stats()["updates"])
            for k in range(12):  # once served, the new version answers
                assert rows_multiset(reader.probe(k)) == oracle.probe(k, T)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert wrong == []
    follower = reader._follower._thread
    reader.close()
    assert not follower.is_alive()
    writer.close()


def test_while_the_follower_prepares_a_commit_probes_read_the_version_it_serves(tmp_path, monkeypatch):
    """The follower's own snapshot of a new version, opened to prepare it, is not a read: until
    it is swapped in, the served version keeps answering (no probe opens a snapshot of its own)."""
    from ebb.storage.snapshot import Snapshot

    rng = np.random.default_rng(9)
    path, writer, oracle = _norebuild_archive_loaded_at_16(tmp_path, rng)
    before = {k: oracle.probe(k, 16) for k in range(12)}
    preparing, go_on = threading.Event(), threading.Event()
    prepare = Snapshot.prepare_point_probes

    def slow_prepare(self, read_metadata=False):
        # the follower's preparation of the commit below (the writer's commit prepares its own
        # snapshot of it too, on this thread: held up there, the follower's wait would run out)
        if self.state.update_seq == 2 and threading.current_thread().name == "ebb-follow":
            preparing.set()
            go_on.wait(10)
        prepare(self, read_metadata)

    monkeypatch.setattr(Snapshot, "prepare_point_probes", slow_prepare)
    with ArchiveReader(path, follow=True) as reader:
        opened, snapshot = [], reader.archive.snapshot
        reader.archive.snapshot = lambda **kw: opened.append(kw) or snapshot(**kw)
        rows = random_rows(rng, 200, 17, 18, 16, 12, tag="new")
        writer.load(table_of(rows, SCHEMA), 18)
        oracle.load(rows, 18)
        assert preparing.wait(10)
        try:
            assert reader.served_snapshot() is not None
            for k in range(12):
                assert rows_multiset(reader.probe(k)) == before[k]
            assert [kw for kw in opened if kw.get("marks_read", True)] == []  # every probe was served
        finally:
            go_on.set()
        assert _wait_served(reader, 2)
        for k in range(12):
            assert rows_multiset(reader.probe(k)) == oracle.probe(k, 18)
    writer.close()


def test_the_follower_serves_string_keys_from_an_archive_that_started_empty(tmp_path):
    """The follower's first version has no runs (nothing to prepare or warm); the next holds
    string keys, whose served probes must equal the oracle's."""
    rng = np.random.default_rng(5)
    path = str(tmp_path / "a")
    writer = Archive.create(path, config(mode="norebuild"))
    schema = SCHEMA.set(0, pa.field("key", pa.string()))
    with ArchiveReader(path, follow=True) as reader:
        assert reader.probe("nobody").num_rows == 0
        rows = [dict(r, key=["", "a", "ä-long-" * 20, "ab"][r["key"] % 4]) for r in random_rows(rng, 200, 1, 16, 16, 12)]
        writer.load(table_of(rows, schema), 16)
        oracle = Oracle()
        oracle.load(rows, 16)
        assert _wait_served(reader, 1)
        for k in ["", "a", "ab", "ä-long-" * 20, "b"]:
            assert rows_multiset(reader.probe(k)) == oracle.probe(k, 16)
    writer.close()


def test_a_snapshot_taken_before_a_switch_still_answers_until_the_next(tmp_path):
    """A request that took the served snapshot just before the follower swapped in a new one
    finishes on it: the replaced snapshot stays open (and its version pinned) for one more
    switch."""
    rng = np.random.default_rng(2)
    path, writer, oracle = _norebuild_archive_loaded_at_16(tmp_path, rng)
    with ArchiveReader(path, follow=True) as reader:
        assert _wait_served(reader, 1)
        taken = reader.served_snapshot()
        writer.load(table_of(random_rows(rng, 200, 17, 18, 16, 12), SCHEMA), 18)
        assert _wait_served(reader, 2)
        for k in range(12):  # replaced, not closed: answers as of its own version
            assert rows_multiset(taken.probe(k)[0]) == oracle.probe(k, 16)
        writer.load(table_of(random_rows(rng, 200, 19, 20, 16, 12), SCHEMA), 20)
        assert _wait_served(reader, 3)
        assert taken.txn is None  # closed one switch later
    writer.close()


def test_probes_the_served_version_cannot_answer_open_their_own_snapshot(tmp_path):
    rng = np.random.default_rng(6)
    path = str(tmp_path / "a")
    writer = Archive.create(path, config(mode="norebuild", retain=8))
    oracle = Oracle()
    history = {}
    for T in range(16, 30, 2):
        rows = random_rows(rng, 100, T - 1, T, 16, 12, tag=str(T))
        writer.load(table_of(rows, SCHEMA), T)
        oracle.load(rows, T)
        history[T] = {k: oracle.probe(k, T) for k in range(12)}
    with ArchiveReader(path, follow=True) as reader:
        assert _wait_served(reader, writer.stats()["updates"])
        served = reader.served_snapshot()
        assert reader.served_snapshot(28) is served and reader.served_snapshot(29) is served
        assert reader.served_snapshot(30) is None and reader.served_snapshot(27) is None
        for k in range(12):
            assert rows_multiset(reader.probe(k, as_of=24)) == history[24][k]  # a kept version
            assert rows_multiset(reader.probe(k, as_of=29)) == oracle.probe(k, 29)
            assert rows_multiset(reader.probe(k, as_of=40)) == oracle.probe(k, 40)
    writer.close()


@pytest.mark.parametrize("first_read", ["scan", "probe as of the new time"])
def test_after_a_read_has_seen_a_commit_probes_never_read_the_version_before(tmp_path, monkeypatch, first_read):
    """Between a commit and the follower's switch, probes read the served version (as reads
    begun just before the commit would), until a read of this process has seen the new one:
    from then on they read it (on snapshots of their own), so a client whose scan saw an update
    never gets the state before it from its next probe."""
    from ebb.storage import follower

    monkeypatch.setattr(follower.VersionFollower, "_run", lambda self: None)  # it never switches again
    rng = np.random.default_rng(8)
    path, writer, oracle = _norebuild_archive_loaded_at_16(tmp_path, rng)
    before = {k: oracle.probe(k, 16) for k in range(12)}
    with ArchiveReader(path, follow=True) as reader:
        assert reader.served_snapshot() is not None and rows_multiset(reader.probe(3)) == before[3]
        rows = random_rows(rng, 200, 17, 18, 16, 12, tag="new")
        writer.load(table_of(rows, SCHEMA), 18)
        oracle.load(rows, 18)
        assert any(oracle.probe(k, 18) != before[k] for k in range(12))  # the commit changes answers
        assert reader.served_snapshot() is not None  # nothing here has read the commit yet
        for k in range(12):
            assert rows_multiset(reader.probe(k)) == before[k]
        if first_read == "scan":
            assert sum(b.num_rows for b in reader.scan()) == sum(oracle.scan(18).values())
        else:
            assert rows_multiset(reader.probe(5, as_of=18)) == oracle.probe(5, 18)  # after the served version's Delta
        assert reader.served_snapshot() is None  # a read has seen update 2: the served update 1 answers no more
        assert reader.followed_update_seq() == 1  # what `ebb serve`'s health reports as trailing
        for k in range(12):
            assert rows_multiset(reader.probe(k)) == oracle.probe(k, 18)
    writer.close()
