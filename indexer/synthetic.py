"""Synthetic sensor readings: the explicit-lifetime case of SPEC section 4.

Sensors are polled at different periods (e.g. temperature every 300 s, humidity every 600 s);
a reading taken at ``ts`` stays valid until the next poll, ``exp = ts + period``. A few polls
are lost, so some sensors go without a valid reading for a while. Everything is vectorised.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

KINDS = ("temperature", "humidity", "pressure")


@dataclass(frozen=True)
class SensorFleet:
    """``sensors`` sensors; sensor s has period ``periods[s % len(periods)]`` and a fixed phase."""

    sensors: int = 5000
    periods: tuple[int, ...] = (300, 600, 900)
    loss: float = 0.02  # fraction of polls that never arrive
    seed: int = 7

    def readings(self, lo: int, hi: int) -> pa.Table:
        """Every reading with lo < ts <= hi, as key/ts/exp/kind/value."""
        ids = np.arange(self.sensors, dtype=np.int64)
        period = np.asarray(self.periods, dtype=np.int64)[ids % len(self.periods)]
        phase = (ids * 7919) % period
        # polls of sensor s are at phase + k*period; list those in (lo, hi]
        k_first = np.floor_divide(lo - phase, period) + 1
        k_last = np.floor_divide(hi - phase, period)
        n = np.maximum(k_last - k_first + 1, 0)
        sensor = np.repeat(ids, n)
        k = np.repeat(k_first - (np.cumsum(n) - n), n) + np.arange(int(n.sum()))
        ts = phase[sensor] + k * period[sensor]
        rng = np.random.default_rng([self.seed, lo & 0xFFFFFFFF, hi & 0xFFFFFFFF])
        keep = rng.random(ts.size) >= self.loss
        sensor, ts = sensor[keep], ts[keep]
        kind_idx = sensor % len(KINDS)
        base = np.array([21.0, 45.0, 1013.0])[kind_idx]
        value = np.round(base + rng.normal(0, 1.5, ts.size), 2)
        return pa.table({
            "key": pa.array(sensor, pa.int64()),
            "ts": pa.array(ts, pa.int64()),
            "exp": pa.array(ts + period[sensor], pa.int64()),
            "kind": pa.array(np.asarray(KINDS, dtype=object)[kind_idx], pa.string()),
            "value": pa.array(value, pa.float64()),
        })
