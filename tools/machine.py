"""What machine a benchmark ran on: CPU, memory, kernel, file system, library versions, the
sequential disk bandwidth measured in the same run, and whether cold-cache runs were possible."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from importlib import metadata

from .measure import cold_cache_problem, disk_bandwidth

_LIBS = ("ebb", "numpy", "pyarrow", "lmdb", "duckdb", "rocksdict", "matplotlib", "tqdm")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _filesystem(path: str) -> str:
    try:
        out = subprocess.run(["df", "-T", path], capture_output=True, text=True, timeout=10).stdout.splitlines()
        parts = out[1].split()
        return f"{parts[1]} on {parts[0]}"
    except (OSError, IndexError, subprocess.SubprocessError):
        return "unknown"


DAMON_ADMIN = "/sys/kernel/mm/damon/admin/kdamonds"


def page_reclaim(admin: str = DAMON_ADMIN) -> str | None:
    """The kernel's proactive reclaim, if any: DAMON schemes that page out memory idle for a while.
    On such a machine a page-cache page no process has mapped, left idle past the scheme's age, is
    read from disk again, so a store read less often than that is partly cold when "warm"."""
    from pathlib import Path

    found = []
    for ctx in sorted(Path(admin).glob("*/contexts/[0-9]*")):
        try:
            if (ctx.parents[1] / "state").read_text().strip() != "on":
                continue
            aggr_s = int((ctx / "monitoring_attrs/intervals/aggr_us").read_text()) / 1e6
            for scheme in ctx.glob("schemes/[0-9]*"):
                action = (scheme / "action").read_text().strip()
                if action != "pageout":
                    continue
                age_s = int((scheme / "access_pattern/age/min").read_text()) * aggr_s
                quota = int((scheme / "quotas/bytes").read_text())
                per_ms = int((scheme / "quotas/reset_interval_ms").read_text())
                filters = [f"{'only' if (f / 'allow').read_text().strip() == 'Y' else 'not'} "
                           f"{(f / 'type').read_text().strip()} pages"
                           for f in sorted(scheme.glob("*filters/[0-9]*"))]
                found.append(f"DAMON pageout of memory idle for {age_s:.0f} s or more"
                             + (f" ({', '.join(filters)})" if filters else "")
                             + (f", at most {quota / 2**20:.0f} MiB per {per_ms / 1000:g} s" if quota else ""))
        except (OSError, ValueError):
            continue
    return "; ".join(found) or None


def _version(lib: str) -> str:
    try:
        return metadata.version(lib)
    except metadata.PackageNotFoundError:
        return "not installed"


def ebb_commit() -> str:
    """The commit of the ebb code being measured: a benchmark snapshot's COMMIT file, else
    ``git rev-parse HEAD`` of the source tree (with "+dirty" if storage/ or query/ has changes)."""
    from pathlib import Path

    from .. import storage

    src = Path(storage.__file__).resolve().parents[1]
    for marker in (src / "COMMIT", src.parent / "COMMIT"):
        if marker.exists():
            return marker.read_text().strip()[:12] + " (snapshot)"
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=src, capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "storage", "query"], cwd=src, capture_output=True,
                               text=True, timeout=10).stdout.strip()
        return (head[:12] + (" +dirty" if dirty else "")) if head else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def describe(store_root: str, bandwidth_bytes: int) -> dict:
    """The machine and its measured disk limits (writes and reads ``bandwidth_bytes`` once)."""
    import sqlite3

    bw = disk_bandwidth(store_root, bandwidth_bytes) if bandwidth_bytes else {}
    try:
        load = os.getloadavg()
    except OSError:
        load = (0.0, 0.0, 0.0)
    return {
        "when": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_bytes": _mem_bytes(),
        "kernel": platform.release(),
        "filesystem": _filesystem(store_root),
        "python": sys.version.split()[0],
        "sqlite": sqlite3.sqlite_version,
        "libraries": {lib: _version(lib) for lib in _LIBS},
        "load_average_at_start": [round(x, 2) for x in load],
        "disk": bw,
        "cold_cache_problem": cold_cache_problem(),
        "page_reclaim": page_reclaim(),
        "ebb_commit": ebb_commit(),
    }
