"""The archive's time model (docs/spec.md section 1): chronons, slots and update times.

Slot ``j`` covers ``(tau + (j-1)*Delta, tau + j*Delta]``; the update of slot ``j`` runs at
``T_j = tau + j*Delta``. ``S`` is rounded up to a multiple of ``Delta`` and ``p = S / Delta``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .errors import ConfigError, ReadError

# Every time (tau, ts, exp) and S lies within +-MAX_TIME chronons, so that differences such as
# exp - ts and t - tau never overflow int64.
MAX_TIME = (1 << 62) - 1


def read_instant(as_of) -> int:
    """A read's ``as_of`` as whole chronons: an integer (Python or numpy) as it is, a float rounded
    down (times are whole chronons: the records valid at 20.5 are those valid at 20). ReadError
    for anything else (a string, a bool, NaN) or an instant outside +-MAX_TIME."""
    if isinstance(as_of, (int, np.integer)) and not isinstance(as_of, bool):
        t = int(as_of)
    elif isinstance(as_of, (float, np.floating)) and not math.isnan(as_of):
        t = as_of if math.isinf(as_of) else math.floor(as_of)
    else:
        raise ReadError(f"as_of must be a time in chronons (an integer), got {as_of!r}")
    if not -MAX_TIME <= t <= MAX_TIME:
        raise ReadError(f"as_of {as_of} is outside ebb's time range (+-{MAX_TIME} chronons)")
    return t


@dataclass(frozen=True)
class TimeModel:
    """Integer time model of one archive. All arguments are chronons."""

    tau: int
    delta: int
    max_lifetime: int  # S, already rounded up to a multiple of delta

    @staticmethod
    def create(tau: int, delta: int, max_lifetime: int) -> "TimeModel":
        """Validates the parameters and rounds S up to a multiple of Delta."""
        if delta <= 0 or max_lifetime <= 0:
            raise ConfigError(f"Delta and S must be positive integers, got Delta={delta} S={max_lifetime}")
        s = -(-max_lifetime // delta) * delta
        return TimeModel(tau=int(tau), delta=int(delta), max_lifetime=int(s))

    @property
    def p(self) -> int:
        """Number of slots in one lifetime bound: S / Delta."""
        return self.max_lifetime // self.delta

    def slot(self, t: int) -> int:
        """slot(t) = ceil((t - tau) / Delta)."""
        return -((self.tau - t) // self.delta)

    def slots(self, t: np.ndarray) -> np.ndarray:
        """Vectorised ``slot`` over an int64 array."""
        return -((self.tau - t.astype(np.int64)) // self.delta)

    def time_of(self, j: int) -> int:
        """T_j = tau + j * Delta: the time at which the update of slot j runs."""
        return self.tau + j * self.delta

    def update_slot(self, t: int) -> int | None:
        """The slot j with T_j == t, or None if t is not on the update grid."""
        off = t - self.tau
        if off % self.delta:
            return None
        return off // self.delta
