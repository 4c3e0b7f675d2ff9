"""A corrupted byte never becomes a wrong answer (LevelDB's corruption_test, for ebb).

1,000 random single-bit flips across the run files and the LMDB metadata file of a small
archive (Rebuild and NoRebuild, 500 each), each on a fresh copy. After each flip:

- every read (scan, probes, key ranges) returns exactly the oracle's rows or fails with an
  ebb error; none returns a wrong row;
- ``verify`` reports a problem for every flip in a byte the committed version uses (a live
  block, or a live metadata entry); a flip it does not report must leave every read correct;
- for every tenth flip an update runs next: it may fail on the damage, but it must never
  launder it: if it commits, verify still reports the damage unless the update legitimately
  dropped the damaged block.
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from ebb.storage.archive import Archive
from ebb.storage.errors import EbbError
from ebb.storage.files import DATA_DIR
from ebb.storage.verify import verify

from support import SCHEMA, Oracle, archive_answers, config, random_rows, table_of

TAU, DELTA, S = 16, 2, 16
PROBES, RANGES = (0, 5, 9), ((0, 4), (5, 40))
FLIPS_PER_MODE = 500


def _build(path, mode, rng):
    oracle = Oracle()
    with Archive.create(path, config(mode=mode, block_bytes=1024)) as arc:
        rows = random_rows(rng, 400, TAU - S + 1, TAU, S, 12, "bulk")
        arc.load(table_of(rows, SCHEMA), TAU)
        oracle.load(rows, TAU)
        for t in (18, 20, 22):
            rows = random_rows(rng, 120, t - DELTA + 1, t, S, 12, f"u{t}")
            arc.load(table_of(rows, SCHEMA), t)
            oracle.load(rows, t)
    return oracle


def _live_ranges(path) -> dict[str, list[tuple[int, int]]]:
    """Byte ranges of each run file that the committed version references (its live blocks)."""
    out: dict[str, list[tuple[int, int]]] = {}
    with Archive(path, readonly=True) as arc, arc.snapshot() as snap:
        for s in snap.state.subindices:
            for run in s.runs:
                d = snap.descriptor(run.name)
                out[run.name] = [(e.offset, e.offset + e.length) for e in d.entries(run.first_live)]
    return out


def _expected(oracle, t):
    return {"scan": oracle.scan(t), "probes": {k: oracle.probe(k, t) for k in PROBES},
            "ranges": {r: oracle.probe_range(*r, t) for r in RANGES}}


def _check(path, want) -> tuple[bool, bool]:
    """(verify reported a problem, some read failed with an ebb error); asserts that no read
    returned a wrong row."""
    try:
        arc = Archive(path)
    except EbbError:
        return True, True
    try:
        try:
            problems, _ = verify(arc)
        except EbbError:
            problems = ["verify failed"]
        try:
            got = archive_answers(arc, 22, PROBES, RANGES)
        except EbbError:
            return bool(problems), True
        assert got == want, "a read returned wrong rows"
        return bool(problems), False
    finally:
        arc.close()


@pytest.mark.parametrize("mode", ["rebuild", "norebuild"])
def test_bit_flips_never_become_wrong_answers(tmp_path, mode):
    rng = np.random.default_rng(2024 + (mode == "norebuild"))
    pristine = str(tmp_path / "pristine")
    oracle = _build(pristine, mode, rng)
    want = _expected(oracle, 22)
    live = _live_ranges(pristine)
    data = os.path.join(pristine, DATA_DIR)
    targets = [(os.path.join(DATA_DIR, n), os.path.getsize(os.path.join(data, n))) for n in sorted(os.listdir(data))]
    sizes = np.array([s for _, s in targets], dtype=float)
    # 80% of the flips in run files (by size), 20% in the LMDB file
    weights = np.append(0.8 * sizes / sizes.sum(), 0.2)
    targets.append((os.path.join("index", "data.mdb"), os.path.getsize(os.path.join(pristine, "index", "data.mdb"))))
    live_flips = detected_live = 0
    for i in range(FLIPS_PER_MODE):
        work = str(tmp_path / f"w{i}")
        shutil.copytree(pristine, work)
        f = int(rng.choice(len(targets), p=weights))
        rel, size = targets[f]
        pos, bit = int(rng.integers(0, size)), int(rng.integers(0, 8))
        with open(os.path.join(work, rel), "r+b") as fh:
            fh.seek(pos)
            b = fh.read(1)[0]
            fh.seek(pos)
            fh.write(bytes([b ^ (1 << bit)]))
        name = os.path.basename(rel)
        in_live_block = any(a <= pos < z for a, z in live.get(name, []))
        reported, failed = _check(work, want)
        if in_live_block:
            live_flips += 1
            detected_live += reported
            assert reported, f"flip {i}: bit {bit} of byte {pos} of live block in {name} not reported by verify"
        if failed:
            assert reported, f"flip {i} in {rel}: a read failed but verify found nothing"
        if i % 10 == 0:
            _update_does_not_launder(work, rng, oracle, reported, name, pos)
        shutil.rmtree(work)
    assert live_flips > FLIPS_PER_MODE // 3 and detected_live == live_flips


def _update_does_not_launder(path, rng, oracle, reported, name, pos) -> None:
    rows = random_rows(rng, 120, 23, 24, S, 12, "next")
    try:
        with Archive(path) as arc:
            arc.load(table_of(rows, SCHEMA), 24)
    except EbbError:
        return  # refused because of the damage: fine
    if not reported:
        return
    still_live = any(a <= pos < z for a, z in _live_ranges(path).get(name, [])) if name.endswith(".run") else True
    if still_live:
        with Archive(path) as arc:
            problems, _ = verify(arc)
        assert problems, f"an update committed over the damage in {name} and verify no longer sees it"
