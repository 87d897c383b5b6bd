"""Clocks a test can move: the database's (through the store's offset) and a holder's.

Tests never sleep to let a lease expire. ``VirtualClock`` is real time plus an offset
that only grows; attached to a store, the same offset is added to the database clock
in SQL, so "the lease expired" is one ``advance()`` away. ``SkewedHolderClock`` is a
holder's own monotonic and wall clocks, skewed or stepped (design: PS13).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Protocol

from celery_agboss.core.durations import to_seconds
from celery_agboss.core.holder_clocks import SYSTEM_CLOCK, HolderClock


class ClockOffsetTarget(Protocol):
    """Anything with the store's test-only offset hook (``core.store_protocol.Store`` has it)."""

    clock_offset_source: Callable[[], int] | None


class VirtualClock:
    """Real time plus an offset that tests advance; never goes backwards.

    Being real time underneath (not frozen) keeps it usable by code that also
    measures real durations; only the offset is under the test's control.
    """

    def __init__(self, start: float | None = None) -> None:
        self._lock = threading.Lock()
        self._offset = 0.0 if start is None else float(start) - time.time()

    def now(self) -> float:
        """Epoch seconds on this clock."""
        with self._lock:
            return time.time() + self._offset

    def advance(self, seconds: float | timedelta) -> float:
        """Move time forward; returns the new ``now()``. Time never moves backwards."""
        amount = to_seconds(seconds, what="advance")
        if amount < 0:
            raise ValueError(f"a VirtualClock only moves forward, not by {amount} s")
        with self._lock:
            self._offset += amount
            return time.time() + self._offset

    @property
    def offset_seconds(self) -> float:
        """How far this clock is ahead of real time."""
        with self._lock:
            return self._offset

    def offset_ms(self) -> int:
        """The offset in whole milliseconds: what the store adds to the database clock."""
        with self._lock:
            return round(self._offset * 1000)

    def attach(self, store: ClockOffsetTarget) -> None:
        """Make ``store``'s database clock move with this clock (read on every statement)."""
        store.clock_offset_source = self.offset_ms

    def __repr__(self) -> str:
        return f"VirtualClock(offset_seconds={self.offset_seconds:.3f})"


class SkewedHolderClock:
    """A holder's clocks, off by a fixed amount and steppable: a pod whose clock is wrong.

    ``wall_skew`` and ``mono_skew`` are seconds added to ``base``. ``step_wall`` jumps the
    wall clock (NTP stepping it, either way); ``advance`` moves both, as when a frozen
    process wakes up and both of its clocks show the time it missed.
    """

    def __init__(
        self,
        base: HolderClock = SYSTEM_CLOCK,
        wall_skew: float = 0.0,
        mono_skew: float = 0.0,
    ) -> None:
        self._lock = threading.Lock()
        self._base = base
        self._wall_skew = float(wall_skew)
        self._mono_skew = float(mono_skew)

    def monotonic(self) -> float:
        with self._lock:
            return self._base.monotonic() + self._mono_skew

    def wall(self) -> float:
        with self._lock:
            return self._base.wall() + self._wall_skew

    @property
    def wall_skew(self) -> float:
        with self._lock:
            return self._wall_skew

    @property
    def mono_skew(self) -> float:
        with self._lock:
            return self._mono_skew

    def step_wall(self, seconds: float | timedelta) -> None:
        """Step the wall clock by ``seconds`` (negative steps it back); monotonic is untouched."""
        amount = to_seconds(seconds, what="step_wall")
        with self._lock:
            self._wall_skew += amount

    def advance(self, seconds: float | timedelta) -> None:
        """Move both clocks forward (a pause that both clocks saw)."""
        amount = to_seconds(seconds, what="advance")
        if amount < 0:
            raise ValueError(f"a monotonic clock only moves forward, not by {amount} s")
        with self._lock:
            self._wall_skew += amount
            self._mono_skew += amount

    def __repr__(self) -> str:
        return f"SkewedHolderClock(wall_skew={self.wall_skew}, mono_skew={self.mono_skew})"
