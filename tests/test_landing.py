"""The landing manifest stays bounded: files no later tick can read, and older than the newest
file by a margin, are forgotten; a forgotten file still in its directory is not new again, and
a file landed after them is."""

from __future__ import annotations

import os

from ebb.indexer.landing import LandedFile, forget, new_files
from ebb.indexer.scheduler import Progress

S = 10**9  # one second in ns


def _land(d, name: str, mtime_s: int) -> None:
    path = d / name
    path.write_bytes(b"x")
    os.utime(path, ns=(mtime_s * S, mtime_s * S))


def test_forget_drops_only_old_files_no_tick_reads(tmp_path):
    known = {f"f{i}": LandedFile(1, i * S, i, i + 1, None) for i in range(100)}  # file i: events [i, i+1]
    known["empty"] = LandedFile(1, 5 * S, None, None, None)  # no events: never read
    watermark = forget(known, read_from=50, margin_ns=30 * S)  # newest mtime 99 s: files up to 69 s may go
    assert sorted(known) == sorted([f"f{i}" for i in range(49, 100)])  # f49 holds an event at 50: kept
    assert watermark == 48 * S


def test_a_forgotten_file_is_not_new_again_and_a_later_one_is(tmp_path):
    for i in range(10):
        _land(tmp_path, f"f{i}", 1000 + i)
    known = {f"f{i}": LandedFile(1, (1000 + i) * S, i, i, None) for i in range(10)}
    watermark = forget(known, read_from=8, margin_ns=2 * S)
    assert sorted(known) == ["f8", "f9"] and watermark == 1007 * S
    assert new_files(str(tmp_path), known, watermark) == {}  # f0..f7 are still there, and seen
    _land(tmp_path, "g", 1008)
    assert new_files(str(tmp_path), known, watermark) == {"g": (1, 1008 * S)}


def test_progress_keeps_its_watermarks_across_a_restart():
    p = Progress("fp", 3, 0, {"src": {f"f{i}": LandedFile(1, i * S, i, i, None) for i in range(20)}})
    p.forget(read_from=15, margin_ns=5 * S)
    again = Progress.from_bytes(p.to_bytes())
    assert again.forgotten == {"src": 14 * S} and sorted(again.manifests["src"]) == sorted(f"f{i}" for i in range(15, 20))
    assert Progress.from_bytes(Progress("fp").to_bytes()).forgotten == {}
