"""I/O counters of this process as the kernel sees them (/proc/self/io)."""

from __future__ import annotations

FIELDS = ("rchar", "wchar", "read_bytes", "write_bytes")


def proc_io() -> dict[str, int]:
    """Current /proc/self/io counters; zeros where the kernel does not provide them."""
    out = {f: 0 for f in FIELDS}
    try:
        with open("/proc/self/io") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name in out:
                    out[name] = int(value)
    except OSError:
        pass
    return out


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {f"os_{k}": after[k] - before[k] for k in FIELDS}
