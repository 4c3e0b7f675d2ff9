"""Synthetic event streams for the demo and tests: sensors polled at a fixed period.

A fleet of sensors reports a reading every ``period`` chronons, each sensor at its own phase;
a few polls are lost. ``land`` writes a batch of events as an immutable Parquet file the way a
producer should: to a hidden temporary name, then renamed into place. Everything is vectorised.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


@dataclass(frozen=True)
class SensorFleet:
    """``sensors`` sensors with ids ``first_id ..``, each polled every ``period`` chronons."""

    sensors: int
    period: int
    first_id: int = 0
    base: float = 20.0  # typical reading
    loss: float = 0.02  # fraction of polls that never arrive
    seed: int = 7

    def polls(self, lo: int, hi: int) -> pa.Table:
        """Every reading with lo < t <= hi: columns sensor, t (chronons), value."""
        ids = np.arange(self.sensors, dtype=np.int64)
        phase = (ids * 7919 + self.seed) % self.period
        k_first = np.floor_divide(lo - phase, self.period) + 1
        k_last = np.floor_divide(hi - phase, self.period)
        n = np.maximum(k_last - k_first + 1, 0)
        sensor = np.repeat(ids, n)
        k = np.repeat(k_first - (np.cumsum(n) - n), n) + np.arange(int(n.sum()))
        t = phase[sensor] + k * self.period
        rng = np.random.default_rng([self.seed, self.first_id, lo & 0xFFFFFFFF, hi & 0xFFFFFFFF])
        keep = rng.random(t.size) >= self.loss
        sensor, t = sensor[keep], t[keep]
        value = np.round(self.base + rng.normal(0, 1.5, t.size), 2)
        return pa.table({"sensor": sensor + self.first_id, "t": t, "value": value})


def with_timestamps(events: pa.Table, origin_us: int, unit_us: int) -> pa.Table:
    """Replaces the chronon column ``t`` by a UTC timestamp column ``event_time``."""
    us = np.asarray(events.column("t")) * unit_us + origin_us
    out = events.drop_columns(["t"])
    return out.append_column("event_time", pa.array(us, pa.timestamp("us", tz="UTC")))


def land(table: pa.Table, directory: str, name: str) -> str:
    """Writes ``table`` to ``directory/name`` atomically (hidden temporary file, then rename)."""
    os.makedirs(directory, exist_ok=True)
    final = os.path.join(directory, name)
    tmp = os.path.join(directory, f".{name}.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, final)
    return final
