"""Named crash points for fault-injection tests (LevelDB's fault_injection_test, for ebb).

``crash_point(name)`` does nothing unless the environment variable ``EBB_CRASH_AT`` is
``name`` or ``name:k``; then the k-th time (default 1st) the process reaches that point it
kills itself with SIGKILL, as a power cut or ``kill -9`` would. The points are listed in
``POINTS`` and in docs/format.md.
"""

from __future__ import annotations

import os
import signal

POINTS = (
    "update.validated",  # batch checked, nothing written yet
    "rebuild.chunk_written",  # a chunk of a new Rebuild file written, not yet fsync'd
    "rebuild.file_synced",  # new Rebuild file durable, directory not yet rewritten
    "norebuild.slots_written",  # new NoRebuild buckets durable in free slots
    "update.subindex_done",  # one sub-index's directory rewritten inside the transaction
    "update.before_commit",  # everything written, transaction not committed
    "update.after_commit",  # committed, replaced files not yet deleted
    "gc.file_removed",  # one replaced file deleted, garbage list not yet updated
)

_spec = os.environ.get("EBB_CRASH_AT", "")
_name, _, _nth = _spec.partition(":")
_remaining = int(_nth) if _nth else 1
_armed = bool(_name)


def crash_point(name: str) -> None:
    """Kills the process here if EBB_CRASH_AT selects this point (see module docstring)."""
    global _remaining
    if not _armed or name != _name:
        return
    _remaining -= 1
    if _remaining == 0:
        os.kill(os.getpid(), signal.SIGKILL)
