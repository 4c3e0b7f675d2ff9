"""Package discovery for ebb's layout; everything else is in pyproject.toml.

The packages of ``ebb`` live at the top of the repository (storage/, query/, indexer/, tools/),
mapped by ``[tool.setuptools.package-dir]``, with no ebb/ directory, so pyproject.toml's
``packages.find`` (which names packages after their directories) cannot find them as ``ebb.*``.
Here every package (directory with an ``__init__.py``) under each mapped directory is found, so
a new subpackage cannot be left out of the wheel or the sdist (tests/test_packaging.py checks).
"""

import tomllib
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent


def ebb_packages() -> list[str]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        package_dir = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    found = []
    for name, directory in package_dir.items():
        found.append(name)
        found += [f"{name}.{sub}" for sub in find_packages(where=str(ROOT / directory))]
    return sorted(found)


setup(packages=ebb_packages())
