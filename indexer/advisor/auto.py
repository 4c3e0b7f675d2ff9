"""The layout advisor as the rest of ebb uses it: where the calibration lives, and the layout
``layout = "auto"`` picks when there is one.

The model is ``cost_model``; the statistics it needs come from ``workload_profile``;
``ebb advise --calibrate`` (``calibrate``) writes the calibration to
``default_calibration_path()``. docs/advisor.md describes all of it.
"""

from __future__ import annotations

import json
import os

from ...storage.errors import UsageError
from ..jobspec import Job
from ..landing import list_files
from .cost_model import Calibration, Candidate, Mix, WorkloadProfile

DEFAULT_MIX = Mix(probes=10.0, scans=1.0)  # reads per update assumed when none are given
MAX_SLOTS = 1000  # the model's work grows with p^2; beyond this S/Delta it declines


def default_calibration_path() -> str:
    """$XDG_CONFIG_HOME/ebb/calibration.json (XDG_CONFIG_HOME defaults to ~/.config)."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "ebb", "calibration.json")


def load_calibration(path: str | None = None) -> Calibration:
    """The calibration in ``path`` (default: ``default_calibration_path()``); UsageError saying
    how to make one if there is none."""
    path = path or default_calibration_path()
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        raise UsageError(f"no calibration at {path}: run `ebb advise --calibrate` (about a minute) first") from None
    except (OSError, ValueError) as e:
        raise UsageError(f"cannot read the calibration {path}: {e}; run `ebb advise --calibrate` again") from None
    return Calibration.from_dict(data, path)


def check_slots(prof: WorkloadProfile) -> None:
    if prof.p > MAX_SLOTS:
        raise UsageError(f"S/Delta = {prof.p} slots: the advisor models at most {MAX_SLOTS} "
                         "(its work grows with the square of p); choose the layout by hand")


def auto_layout(job: Job) -> Candidate | None:
    """What ``layout = "auto"`` uses: the advisor's recommendation for the job's landed data and
    ``DEFAULT_MIX`` in the steady state, when a calibration exists (``default_calibration_path``;
    a damaged one is an error), every source has landed files that give the advisor its
    statistics, and S/Delta is within ``MAX_SLOTS``; None otherwise (the update pattern's default
    then applies)."""
    from .cost_model import rank
    from .workload_profile import job_profile

    path = default_calibration_path()
    if not os.path.exists(path) or not all(list_files(job.sources[w.source].path) for w in job.query.windows):
        return None
    cal = load_calibration(path)
    try:
        prof = job_profile(job)
    except UsageError:  # the sample gives no statistics (no results yet, a column it cannot read)
        return None
    if prof.p > MAX_SLOTS:
        return None
    return rank(prof, cal, DEFAULT_MIX)[0].candidate
