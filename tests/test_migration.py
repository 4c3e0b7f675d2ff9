"""Online layout changes (storage/migration.py): draining and copying.

1. ``test_migrations_match_oracle``: random schedules (every layout and mode, rates x0..x4,
   missed slots, tiny blocks, string keys, over-long lifetimes) with one to three migrations at
   random updates to random layouts, by draining or copying. Scans, probes and range probes equal
   the brute-force oracle's after every update across each switch, ``verify`` passes after each
   switch and at the end, draining writes no byte and copying writes exactly the live records,
   and a drained layout is gone once S has passed since its switch.
2. ``test_killed_migration``: ``ebb migrate`` killed (SIGKILL) at each point of the switch, for
   both methods: the archive answers as before the switch (points ahead of the commit) or after
   it, ``verify`` passes, and the next updates give the oracle's answers.
3. ``test_migration_waits_for_a_running_update``: a migration started while another process
   holds the writer lock waits for it, then switches; one that waits too long fails with exit 4.
``ebb run`` going on through a migration is in tests/test_pipeline_crash.py.
"""

from __future__ import annotations

import fcntl
import os
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ebb.storage.archive import Archive
from ebb.storage.config import ArchiveConfig
from ebb.storage.errors import ConfigError
from ebb.storage.files import LOCK
from ebb.storage.migration import LAYOUT_FIELDS, migrate, target_config
from ebb.storage.verify import verify

from support import SCHEMA, Oracle, archive_answers, config, ebb, random_rows, table_of
from test_oracle import LAYOUTS, bulk_loaded, check_reads, scenarios, update_and_check

NO_CRASH = {"EBB_CRASH_AT": ""}


@st.composite
def targets(draw):
    """Layout settings to migrate to (as target_config takes them)."""
    t = dict(draw(st.sampled_from(LAYOUTS)))
    t["mode"] = draw(st.sampled_from(["rebuild", "norebuild"]))
    if t["layout"] == "doubly":
        t.update(G=draw(st.integers(1, 3)), E=draw(st.integers(1, 3)))
    else:
        t["n_wave"] = draw(st.integers(1, 2))  # at most p, which is at least 2
    if t["mode"] == "norebuild" and (t.get("split") == "insertion" or t.get("E") == 1):
        t["section_slots"] = draw(st.integers(1, 2))
    return t, draw(st.booleans())  # (settings, copy)


def _target(cfg: ArchiveConfig, t: dict) -> ArchiveConfig | None:
    t = dict(t)
    if t.get("partitioning") == "chronological":
        t["G"], t["E"] = min(t["G"], cfg.time.p), min(t["E"], cfg.time.p)
    try:
        return target_config(cfg, **t)
    except ConfigError as e:
        assert "already has this layout" in str(e)
        return None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.lists(st.tuples(st.integers(0, 9), targets()), min_size=1, max_size=3))
def test_migrations_match_oracle(sc, migrations):
    at_step = {}
    for step, target in migrations:
        at_step.setdefault(step, []).append(target)
    with tempfile.TemporaryDirectory() as d:
        arc, oracle, rng, schema = bulk_loaded(sc, d + "/a")
        tau, s = sc["tau"], sc["s"]
        switched_at = []  # (time of the last update before a drain switch)
        j, T = 0, tau
        for n, (missed, mult, probes) in enumerate(sc["steps"]):
            for settings_, copy in at_step.get(n, []):
                target = _target(arc.config, settings_)
                if target is None:
                    continue
                live = len(oracle.records)
                rec = migrate(arc, target, copy=copy)
                assert arc.config == target
                if copy:
                    assert rec["records_copied"] == live and arc.state().draining == []
                else:
                    assert rec["bytes_written"] == rec["blocks_written"] == rec["bytes_read"] == 0
                    switched_at.append(T)
                check_reads(arc, oracle, T, rng, sc)
                assert verify(arc)[0] == []
            j += 1 + missed
            T = update_and_check(arc, oracle, rng, schema, sc, j, mult, probes)
            if not sc["overlong"] and switched_at and T >= max(switched_at) + s:
                assert arc.state().draining == []  # every record it held has expired: dropped
        assert verify(arc)[0] == []
        arc.close()


# -- kill -9 during the switch ----------------------------------------------------------------
PROBE_KEYS = (0, 7, 21, 39)
RANGES = ((0, 10), (15, 30))


def _build(path, rng, oracle, updates=5):
    """A 2x2 Rebuild archive (support.config) after a bulk load and ``updates`` updates."""
    arc = Archive.create(str(path), config(block_bytes=2048))
    T = 16
    rows = random_rows(rng, 300, T - 15, T, 16, 40, "bulk")
    arc.load(table_of(rows, SCHEMA), T)
    oracle.load(rows, T)
    for j in range(1, updates + 1):
        T = 16 + 2 * j
        rows = random_rows(rng, 120, T - 1, T, 16, 40, f"u{j}")
        arc.load(table_of(rows, SCHEMA), T)
        oracle.load(rows, T)
    arc.close()
    return T


def _answers(path, t):
    return archive_answers(str(path), t, PROBE_KEYS, RANGES)


@pytest.mark.parametrize("point,copy", [
    ("migrate.before_commit", False), ("migrate.after_commit", False),
    ("run.block_written:3", True), ("migrate.runs_written", True), ("migrate.after_commit", True),
    ("gc.file_removed", True),
])
def test_killed_migration(tmp_path, point, copy):
    rng = np.random.default_rng(5)
    oracle = Oracle()
    path = tmp_path / "a"
    T = _build(path, rng, oracle)
    before = _answers(path, T)
    with Archive(str(path)) as arc:
        old = arc.config
    args = ["migrate", path, "--G", "3", "--mode", "norebuild"] + (["--copy"] if copy else [])
    r = ebb(*args, env={"EBB_CRASH_AT": point})
    assert r.returncode == -9, r.stderr
    after_commit = point.startswith(("migrate.after_commit", "gc."))
    with Archive(str(path)) as arc:
        assert (arc.config.G, arc.config.mode) == ((3, "norebuild") if after_commit else (old.G, old.mode))
        assert len(arc.migrations()) == int(after_commit)
    assert _answers(path, T) == before  # a switch changes where records are, never which
    v = ebb("verify", path)
    assert v.returncode == 0, v.stdout
    if not after_commit:  # the retried migration completes
        r = ebb(*args, env=NO_CRASH)
        assert r.returncode == 0, r.stderr
        assert _answers(path, T) == before
    with Archive(str(path)) as arc:  # and updates go on, with the oracle's answers
        for j in range(6, 16):
            T = 16 + 2 * j
            rows = random_rows(rng, 80, T - 1, T, 16, 40, f"v{j}")
            arc.load(table_of(rows, SCHEMA), T)
            oracle.load(rows, T)
        assert arc.config.G == 3 and arc.state().draining == []  # the drained layout is gone after S
    got = _answers(path, T)
    assert got["scan"] == oracle.scan(T)
    assert all(got["probes"][k] == oracle.probe(k, T) for k in PROBE_KEYS)
    assert all(got["ranges"][rg] == oracle.probe_range(*rg, T) for rg in RANGES)
    assert ebb("verify", path).returncode == 0
    assert not [f for f in os.listdir(path / "data") if f.endswith(".tmp")]


def test_migration_waits_for_a_running_update(tmp_path):
    rng = np.random.default_rng(9)
    path = tmp_path / "a"
    _build(path, rng, Oracle(), updates=1)
    fd = os.open(path / LOCK, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as an update in another process holds it
    try:
        r = ebb("migrate", path, "--layout", "wave", "--wait", "0.3")
        assert r.returncode == 4 and "waited 0.3 s" in r.stderr, r.stderr
        with Archive(str(path)) as arc:
            assert arc.config.layout == "doubly"
            import threading

            threading.Timer(0.5, os.close, (fd,)).start()  # the "update" finishes in 0.5 s
            rec = migrate(arc, target_config(arc.config, layout="wave"), wait_s=30)
            fd = None
            assert rec["to_layout"].startswith("wave index, n=4") and arc.config.layout == "wave"
    finally:
        if fd is not None:
            os.close(fd)


def test_migrate_refuses_what_it_cannot_do(tmp_path):
    path = tmp_path / "a"
    _build(path, np.random.default_rng(1), Oracle(), updates=1)
    for args, msg in ((["--G", "2"], "already has this layout"), (["--layout", "wave", "--n", "99"], "n <= p"),
                      (["--layout", "wave", "--G", "3"], "--G/--E/--partitioning are for doubly")):
        r = ebb("migrate", path, *args)
        assert r.returncode == 2 and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    with pytest.raises(ConfigError, match="cannot change"):
        target_config(config(), delta=4)
    wide = target_config(config(), layout="wave", mode="norebuild", section_slots=2)
    assert wide.section_slots == 2
    assert target_config(wide, n_wave=8).section_slots == 2  # kept where the new layout allows it
    assert target_config(wide, mode="rebuild").section_slots == 1  # else back to 1
    with pytest.raises(ConfigError, match="section-slots above 1 needs"):
        target_config(wide, layout="doubly", section_slots=2)
    assert set(LAYOUT_FIELDS) < set(ArchiveConfig.__dataclass_fields__)
