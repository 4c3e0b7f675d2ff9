"""Chronons as timestamps: an archive's time model for people.

An archive stores time as integer chronons. When its configuration names a time unit that is a
fixed duration (``us``, ``ms``, ``s``, ``min``, ``h``) and the instant of chronon 0 (``origin``,
set by ``ebb run`` from the job and by ``ebb init --origin``), its times can be shown as UTC
timestamps and ``--as-of`` can take one. ``Clock.of`` is None for any other archive, whose times
stay chronons; so does every command given ``--raw-time``. Machine formats (Parquet, the integer
columns of CSV and JSON lines, ``--format json``) always carry the chronons.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..storage.config import TIME_UNITS_US, ArchiveConfig, origin_us
from ..storage.errors import UsageError

if TYPE_CHECKING:
    import pyarrow as pa

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_MIN_US, _MAX_US = -62_135_596_800_000_000, 253_402_300_799_999_999  # years 1..9999, as datetime allows
# the Arrow timestamp unit whose seconds field prints each time unit without needless zeros
_ARROW_UNIT = {"us": "us", "ms": "ms", "s": "s", "min": "s", "h": "s"}


@dataclass(frozen=True)
class Clock:
    """How chronons map to instants: ``origin_us + t * unit_us`` microseconds since the epoch."""

    unit: str
    unit_us: int
    origin_us: int

    @staticmethod
    def of(cfg: ArchiveConfig | dict, raw: bool = False) -> "Clock | None":
        """The clock of an archive's configuration (an ArchiveConfig or ``stats()["config"]``),
        None if it has no fixed time unit and origin or ``raw`` asks for chronons."""
        unit = cfg.get("time_unit") if isinstance(cfg, dict) else cfg.time_unit
        origin = cfg.get("origin") if isinstance(cfg, dict) else getattr(cfg, "origin", None)
        if raw or origin is None or unit not in TIME_UNITS_US:
            return None
        return Clock(unit, TIME_UNITS_US[unit], origin_us(origin))

    def stamp(self, t: int) -> str:
        """Chronon ``t`` as an ISO 8601 UTC timestamp (the chronon itself if out of datetime's range)."""
        us = self.origin_us + t * self.unit_us
        if not _MIN_US <= us <= _MAX_US:
            return str(t)
        when = _EPOCH + dt.timedelta(microseconds=us)
        frac = {"ms": f".{when.microsecond // 1000:03d}", "us": f".{when.microsecond:06d}"}.get(self.unit, "")
        return when.strftime("%Y-%m-%dT%H:%M:%S") + frac + "Z"

    def label(self, t: int | None) -> str:
        """``T=3660 (2026-01-01T01:01:00Z)``: a time in a line of text, chronons first."""
        return "-" if t is None else f"T={t} ({self.stamp(t)})"

    def chronon(self, text: str) -> int:
        """The chronon holding the instant ``text`` (ISO 8601; UTC if it names no zone)."""
        return (origin_us(text) - self.origin_us) // self.unit_us

    def stamps(self, values: "pa.Array") -> "pa.Array":
        """An int64 array of chronons as an array of timestamp strings (null stays null; a value
        out of datetime's range stays its number)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        # Arrow compute only: Array.to_numpy with nulls imports pandas, a quarter second of start-up
        us = pc.add(pc.multiply(pc.cast(values, pa.float64(), safe=False), float(self.unit_us)), float(self.origin_us))
        inside = pc.fill_null(pc.and_(pc.greater_equal(us, float(_MIN_US)), pc.less_equal(us, float(_MAX_US))), False)
        arrow_unit = _ARROW_UNIT[self.unit]
        per = {"s": 1_000_000, "ms": 1_000, "us": 1}[arrow_unit]  # float above: an out-of-range value must not wrap
        exact = pc.add(pc.multiply(pc.if_else(inside, values, 0), self.unit_us // per), self.origin_us // per)
        ts = pc.cast(exact, pa.timestamp(arrow_unit))
        # %S prints the fraction of the Arrow unit: none for s, three digits for ms, six for us
        text = pc.binary_join_element_wise(pc.strftime(ts, format="%Y-%m-%dT%H:%M:%S"), "Z", "")
        return pc.if_else(inside, text, pc.cast(values, pa.string()))


def time_label(clock: Clock | None, t: int | None) -> str:
    """``T=t``, with its timestamp when the archive has a clock."""
    if t is None:
        return "-"
    return f"T={t}" if clock is None else clock.label(t)


def parse_as_of(text: str | None, clock: Clock | None) -> int | None:
    """``--as-of``: chronons, or (for an archive with a clock) an ISO 8601 timestamp."""
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        pass
    if clock is None:
        raise UsageError(f"--as-of {text!r}: give chronons (an integer); a timestamp needs an archive with a "
                         "time unit and origin (`ebb init --time-unit s --origin 2026-01-01T00:00:00Z`, or one `ebb run` created)")
    try:
        return clock.chronon(text)
    except Exception:
        raise UsageError(f"--as-of {text!r} is neither chronons nor an ISO 8601 timestamp") from None
