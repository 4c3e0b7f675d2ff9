"""Landed files and the manifest of what has been seen, for exactly-once processing.

Producers land immutable files in each source's directory (write to a hidden or temporary name,
then rename; names starting with '.' or '_' are ignored). The manifest records, per file, its size
and modification time, the range of event times it holds and its *late threshold*: the time of the
last tick completed before the file was first seen. Events at or before that threshold arrived
after their tick was processed: they are late, counted once when the file is first seen, and
dropped (``late_policy = "drop"``) by every later read. The manifest is committed atomically with
each tick's archive update (``ext/scheduler`` in the archive), so a crash never loses or repeats a
file.

The manifest stays bounded (``forget``): a file no later tick can read (its events all before
the next tick's read window) is dropped from it once it is older, by modification time, than the
newest file by a margin; the newest modification time dropped becomes the source's *forgotten
watermark*, and a file not older than it is new while an older one counts as seen. A file whose
events are that old would be entirely late anyway.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..storage.errors import EbbError


@dataclass(frozen=True)
class LandedFile:
    size: int
    mtime_ns: int
    min_t: int | None  # event-time range in chronons (None: no events)
    max_t: int | None
    late_threshold: int | None  # events with t <= this are late; None: nothing is late

    def to_list(self) -> list:
        return [self.size, self.mtime_ns, self.min_t, self.max_t, self.late_threshold]

    @staticmethod
    def from_list(v: list) -> "LandedFile":
        return LandedFile(*v)


class LandingError(EbbError):
    """A landed file changed after it was processed (exit code 1)."""


def list_files(directory: str) -> dict[str, tuple[int, int]]:
    """Visible regular files under ``directory`` (recursively), as relpath -> (size, mtime_ns)."""
    out: dict[str, tuple[int, int]] = {}
    if not os.path.isdir(directory):
        return out
    for root, dirs, files in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
        for f in sorted(files):
            if f.startswith((".", "_")):
                continue
            st = os.stat(os.path.join(root, f))
            out[os.path.relpath(os.path.join(root, f), directory)] = (st.st_size, st.st_mtime_ns)
    return out


def new_files(directory: str, known: dict[str, LandedFile], forgotten_ns: int = 0) -> dict[str, tuple[int, int]]:
    """Files not in ``known`` and modified after ``forgotten_ns`` (files forgotten from the
    manifest, ``forget``, are older); raises LandingError if a known file changed or disappeared
    while its events may still be needed."""
    now = list_files(directory)
    for rel, lf in known.items():
        if rel in now and now[rel] != (lf.size, lf.mtime_ns):
            what = "size" if now[rel][0] != lf.size else "modification time"
            raise LandingError(f"landed file {os.path.join(directory, rel)} changed ({what}) after it was processed, "
                               "and landed files must never change. If the directory was copied, copy it keeping "
                               "modification times (cp -a, rsync -a); if the file was rewritten, restore it, or start a "
                               "new archive (archive.path) to process the new contents")
    return {rel: v for rel, v in now.items() if rel not in known and v[1] > forgotten_ns}


def forget(known: dict[str, LandedFile], read_from: int, margin_ns: int) -> int:
    """Drops from ``known`` the files no tick reading events from ``read_from`` on can need and
    modified ``margin_ns`` or more before the newest file; returns the newest modification time
    dropped (0 if none), the source's new forgotten watermark."""
    if not known:
        return 0
    before = max(lf.mtime_ns for lf in known.values()) - margin_ns
    gone = [rel for rel, lf in known.items()
            if lf.mtime_ns <= before and (lf.max_t is None or lf.max_t < read_from)]
    watermark = max((known[rel].mtime_ns for rel in gone), default=0)
    for rel in gone:
        del known[rel]
    return watermark


def files_for_range(known: dict[str, LandedFile], lo: int, hi: int) -> dict[int | None, list[str]]:
    """Files that may hold events with lo <= t <= hi, grouped by late threshold."""
    groups: dict[int | None, list[str]] = {}
    for rel, lf in sorted(known.items()):
        if lf.min_t is None or lf.max_t < lo or lf.min_t > hi:
            continue
        if lf.late_threshold is not None and lf.max_t <= lf.late_threshold:
            continue  # every event in it is late
        groups.setdefault(lf.late_threshold, []).append(rel)
    return groups
