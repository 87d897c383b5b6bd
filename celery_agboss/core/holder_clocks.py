"""The holder's own clocks, injectable so tests can skew or step them (design: PS13)."""

from __future__ import annotations

import time
from typing import Protocol


class HolderClock(Protocol):
    def monotonic(self) -> float: ...

    def wall(self) -> float: ...


class SystemClock:
    """The process's real clocks."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()


SYSTEM_CLOCK = SystemClock()
