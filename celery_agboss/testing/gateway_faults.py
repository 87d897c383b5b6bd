"""The failures and holds a test arms on ``FakeGateway``: which request they hit, and the
waits they cause (a virtual clock advanced, or a real sleep that ``close()`` cuts short).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import timedelta

from celery_agboss.core.durations import to_seconds
from celery_agboss.testing.clock import VirtualClock
from celery_agboss.testing.gateway_types import FakeGatewayFault, GatewayHold


@dataclass
class ArmedFault:
    fault: FakeGatewayFault
    remaining: int
    delay: float
    operation: str | None


class FaultsAndHolds:
    """``FakeGateway``'s armed faults and holds, each taken by the one request it hits.
    It makes the gateway's one lock, which the faults and holds are read under too."""

    clock: VirtualClock | None
    hold_timeout: float

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._closing = threading.Event()
        self._faults: list[ArmedFault] = []
        self._holds: list[GatewayHold] = []

    def inject_fault(
        self,
        fault: FakeGatewayFault,
        *,
        times: int = 1,
        delay: float | timedelta | None = None,
        operation: str | None = None,
    ) -> None:
        """Make the next ``times`` requests (of ``operation``, or any) fail this way.

        ``delay`` is how long the caller waits first (required for ``SLOW``); on a virtual
        clock it advances the clock, else it is a real sleep of at most ``delay`` (cut
        short by ``close()``). Faults are used first armed, first used, one per request.
        """
        if times < 1:
            raise ValueError("times must be >= 1")
        if fault is FakeGatewayFault.SLOW and delay is None:
            raise ValueError("FakeGatewayFault.SLOW needs a delay")
        seconds = 0.0 if delay is None else to_seconds(delay, what="delay")
        if seconds < 0:
            raise ValueError("delay must be >= 0")
        with self._lock:
            self._faults.append(ArmedFault(FakeGatewayFault(fault), times, seconds, operation))

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def hold(
        self,
        *,
        times: int = 1,
        before_processing: bool = False,
        operation: str | None = None,
        timeout: float | None = None,
    ) -> GatewayHold:
        """Keep the next ``times`` requests on the wire until the returned hold is released."""
        if times < 1:
            raise ValueError("times must be >= 1")
        wait = self.hold_timeout if timeout is None else timeout
        hold = GatewayHold(times=times, before=before_processing, operation=operation, timeout=wait)
        with self._lock:
            self._holds.append(hold)
        return hold

    def release(self) -> None:
        """Release every hold (requests on the wire get their answers)."""
        with self._lock:
            holds = list(self._holds)
        for hold in holds:
            hold.release()

    def _take_fault(self, operation: str) -> ArmedFault | None:
        for armed in self._faults:
            if armed.operation in (None, operation):
                armed.remaining -= 1
                if armed.remaining == 0:
                    self._faults.remove(armed)
                return armed
        return None

    def _take_hold(self, operation: str) -> GatewayHold | None:
        for hold in self._holds:
            if hold.remaining > 0 and hold.operation in (None, operation):
                hold.remaining -= 1
                hold.hits += 1
                return hold
        return None

    def _delay(self, seconds: float) -> None:
        if seconds <= 0:
            return
        if self.clock is not None:
            self.clock.advance(seconds)
        else:
            self._closing.wait(seconds)


__all__ = ["FaultsAndHolds"]
