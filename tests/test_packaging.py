"""ebb as users install it: the wheel carries every package of the source tree (pyproject.toml,
setup.py), and without the native point probe (no C compiler at install time) probes give the
same answers through the planned read (storage/point_probe.py, ``NATIVE``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from ebb.query.reader import ArchiveReader
from ebb.storage import point_probe
from ebb.storage.archive import Archive

from support import SCHEMA, Oracle, config, ebb, random_rows, rows_multiset

ROOT = Path(__file__).resolve().parents[1]
# directories of the source tree that are not packages of ebb
NOT_PACKAGES = {"tests", "docs", "build", "dist", "__pycache__"}


def _not_copied(directory: str, names: list[str]) -> set[str]:
    return {n for n in names if n.startswith(".") or n in NOT_PACKAGES or n.endswith(".egg-info")
            or n.endswith((".so", ".pyc")) or (Path(directory, n, "pyvenv.cfg").exists())}


def source_package_dirs() -> dict[str, list[str]]:
    """Each directory of the source tree (relative, "/"-separated) that holds .py files, with
    them; not the repository root (setup.py), tests, docs, hidden directories or build output."""
    found = {}
    for directory, subdirs, files in os.walk(ROOT):
        subdirs[:] = sorted(set(subdirs) - _not_copied(directory, subdirs))
        rel = Path(directory).relative_to(ROOT).as_posix()
        modules = sorted(f for f in files if f.endswith(".py"))
        if rel != "." and modules:
            found[rel] = modules
    return found


def test_the_wheel_holds_every_package_of_the_source_tree(tmp_path):
    """Builds a wheel from a copy of the working tree (the build writes build/ and *.egg-info
    where it runs) and checks that each source directory with .py files is in it as a package
    of ebb, with every module, and the licence of the vendored xxHash."""
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=_not_copied)
    out = tmp_path / "wheel"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--quiet", "-w", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    wheels = list(out.glob("ebb-*.whl"))
    assert len(wheels) == 1, os.listdir(out)
    names = set(zipfile.ZipFile(wheels[0]).namelist())
    packages = source_package_dirs()
    assert {"storage", "query", "indexer", "indexer/queries", "tools", "tools/peers"} <= set(packages)
    missing = [f"{d}/{m}" for d, modules in packages.items() for m in modules if f"ebb/{d}/{m}" not in names]
    assert not missing, f"source modules not in the wheel: {missing}"
    assert any(n.endswith("/licenses/storage/native/LICENSE-xxhash") for n in names)
    assert not [n for n in names if n.startswith("ebb/storage/native/")]  # C sources belong to the sdist only


def _fallback(monkeypatch) -> None:
    """As when ebb was installed without the native module: no layout for it, nothing to call."""
    monkeypatch.setattr(point_probe, "NATIVE", False)
    monkeypatch.setattr(point_probe, "_point_probe", None)


def _probe_answers(path: str, native: bool, monkeypatch) -> tuple[dict, Oracle]:
    """Builds the same archive at ``path`` (loads, each followed by prepared probes as a serving
    reader does) and probes it, with the native module in use or not; per (T, key, as_of) the
    reader's answer: its schema and rows in order (copied at once: a table of the planned read is
    a view of the run files, which later updates may punch out)."""
    rng = np.random.default_rng(26)
    cfg = config(G=2, E=3, mode="norebuild", block_bytes=512, max_lifetime=12)
    answers, oracle = {}, Oracle()
    with monkeypatch.context() as m:
        if not native:
            _fallback(m)
        with Archive.create(path, cfg) as arc:
            reader = ArchiveReader(arc)
            for T in range(16, 32, 2):
                rows = random_rows(rng, int(rng.integers(0, 200)), T - 12, T, 12, 40, tag=f"T{T}-")
                arc.load(pa.Table.from_pylist(rows, SCHEMA), T)
                oracle.load(rows, T)
                reader.prepare_probes()
                for k in [int(k) for k in rng.integers(-2, 42, 8)] + [-(2**63), 2**63 - 1]:
                    for as_of in (T, T + int(rng.integers(1, 14))):
                        with arc.snapshot() as snap:
                            assert (snap.native_probe(k, as_of) is None) == (not native)
                        table = reader.probe(k, as_of)
                        assert rows_multiset(table) == oracle.probe(k, as_of), (T, k, as_of)
                        answers[T, k, as_of] = (table.schema, table.to_pylist())
    return answers, oracle


def test_without_the_native_module_probes_answer_as_the_native_path(tmp_path, monkeypatch):
    """With ``NATIVE`` off (and the module gone), ``Snapshot.probe`` declines every probe, and
    loads, prepared probes and reader probes take the planned read: the same tables, in the same
    (exp, ts) order, as the native probe returns, and the oracle's rows."""
    fallback, _ = _probe_answers(str(tmp_path / "fallback"), False, monkeypatch)
    assert sum(len(rows) for _, rows in fallback.values()) > 0
    if not point_probe.NATIVE:
        pytest.skip("the native module is not built here: only the fallback was checked (against the oracle)")
    native, _ = _probe_answers(str(tmp_path / "native"), True, monkeypatch)
    assert native.keys() == fallback.keys()
    for k, answer in native.items():
        assert answer == fallback[k], k


def test_stats_say_when_the_native_probe_is_off(tmp_path):
    """``EBB_NATIVE=0`` turns the native module off as if it were not built, and ``ebb stats``
    says that probes take the planned read (with it on, it says nothing of it)."""
    path = tmp_path / "arc"
    with Archive.create(str(path), config(G=2, E=2)) as arc:
        arc.load(pa.Table.from_pylist(random_rows(np.random.default_rng(1), 20, 10, 16, 8, 10), SCHEMA), 16)
    off = ebb("stats", path, env={"EBB_NATIVE": "0"})
    assert off.returncode == 0, off.stderr
    assert "native point probe off (EBB_NATIVE=0): probes take the planned read" in off.stdout
    assert json.loads(ebb("stats", path, "--format", "json", env={"EBB_NATIVE": "0"}).stdout)["native_point_probe"] == "off (EBB_NATIVE=0)"
    if point_probe.NATIVE:
        on = ebb("stats", path)
        assert on.returncode == 0 and "native point probe" not in on.stdout
