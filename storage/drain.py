"""Draining a replaced layout: what each update does to the layouts ``migrate`` switched away from.

A draining layout receives no records. Its records expire in place, and reads already skip
expired blocks and filter expired rows, so draining never reads or rewrites a record: an
update only drops the runs whose every record has expired by its time (their files become
garbage), and a layout goes with its last run. Records live at most S, so a layout is gone
within S of the switch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .manifest import ArchiveState


@dataclass
class Drained:
    """What one update dropped from the draining layouts."""

    runs: list[str] = field(default_factory=list)
    records: int = 0  # records in the dropped runs' live blocks (all expired)
    layouts: int = 0  # draining layouts that became empty and were dropped


def drain(state: ArchiveState, at: int) -> Drained:
    """Drops, in ``state``, the draining layouts' runs with no record valid after ``at``, and
    the layouts left with no run. Returns what went (the caller makes the runs garbage)."""
    out = Drained()
    for layout in state.draining:
        for sub in layout.subindices:
            keep = []
            for run in sub.runs:
                if run.max_exp <= at:
                    out.runs.append(run.name)
                    out.records += run.records
                else:
                    keep.append(run)
            sub.runs = keep
    before = len(state.draining)
    state.draining = [d for d in state.draining if any(s.runs for s in d.subindices)]
    out.layouts = before - len(state.draining)
    return out
