"""Layering: code outside the storage layer uses an archive only through its public interface.

Writers go through ``storage.write_sequence``, which takes the lock, translates metadata errors
and reclaims for them; nothing in indexer/, query/ or tools/ reaches into an Archive's private
attributes (``archive._reclaim()``, ``arc._version()``, ``self.archive._x``, ``snap._archive._x``).
"""

from __future__ import annotations

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("indexer", "query", "tools")
# the names an Archive is bound to outside storage/: ``archive`` / ``arc`` (also as attributes,
# ``self.archive``, ``scheduler.archive``) and ``_archive``; a private name starts with one "_"
PRIVATE_USE = re.compile(r"\b_?(?:archive|arc)\._[a-z]\w*")


def _offenders() -> list[str]:
    found = []
    for package in PACKAGES:
        for folder, _, names in os.walk(os.path.join(ROOT, package)):
            for name in sorted(n for n in names if n.endswith(".py")):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    for line_no, line in enumerate(f, 1):
                        for m in PRIVATE_USE.finditer(line):
                            found.append(f"{os.path.relpath(path, ROOT)}:{line_no}: {m.group(0)}")
    return found


def test_the_pattern_catches_what_it_should():
    hits = [s for s in ("archive._reclaim()", "self.archive._version()", "with arc._metadata_errors():",
                        "snap._archive._path", "archive.__class__", "archive.load(t)", "marc._x", "arc.state()")
            if PRIVATE_USE.search(s)]
    assert hits == ["archive._reclaim()", "self.archive._version()", "with arc._metadata_errors():",
                    "snap._archive._path"]


def test_no_private_archive_attributes_outside_storage():
    offenders = _offenders()
    assert not offenders, "private Archive attributes used outside storage/ (offer them publicly there):\n" + \
        "\n".join(offenders)
