"""Durations accept seconds or a ``timedelta`` everywhere; this is the one conversion."""

from __future__ import annotations

import math
from datetime import timedelta


def to_seconds(value: float | int | timedelta, *, what: str) -> float:
    """Seconds as a float; refuses what is neither a number nor a ``timedelta``."""
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be seconds (a number) or a timedelta, not {value!r}")
    if not math.isfinite(value):  # NaN passes every comparison: refused here, once
        raise ValueError(f"{what} must be a finite number of seconds, not {value!r}")
    return float(value)


def to_ms(value: float | int | timedelta, *, what: str) -> int:
    """Whole milliseconds, the store's unit."""
    return round(to_seconds(value, what=what) * 1000)
