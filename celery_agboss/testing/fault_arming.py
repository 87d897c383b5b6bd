"""Arm the named fault points of ``core.fault_points``: pause, raise or sleep where a crash matters.

A race test needs two things at one instant: a zombie's write and a take-over, a
commit and a connection cut. Production code marks those boundaries with
``fault_point(NAME)``; these helpers make the next thread that reaches one block,
raise or sleep. Every block is bounded — a pause nobody releases gives up after
``timeout`` seconds and raises ``PausedPointTimeoutError`` in the paused thread — so a
buggy test fails instead of hanging CI. ``disarm_all()`` (run after every test by the
pytest plugin) disarms every point and wakes every thread still waiting in one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from datetime import timedelta

from celery_agboss.core import fault_points as _core
from celery_agboss.core.durations import to_seconds
from celery_agboss.core.fault_points import (
    FENCED_AFTER_CHECK,
    FENCED_AFTER_COMMIT,
    FENCED_BEFORE_BEGIN,
    FENCED_BEFORE_COMMIT,
    KNOWN_POINTS,
    LEASE_BEFORE_COMMIT,
    OUTBOUND_AFTER_READ,
    OUTBOUND_AFTER_SEND,
    OUTBOUND_BEFORE_RELY,
    OUTBOUND_BEFORE_SEND,
    OUTBOUND_BEFORE_SETTLE,
    RECONCILE_AFTER_LOOKUP,
    RECONCILE_BEFORE_RESEND,
    RENEWER_BEFORE_RENEW,
    SWEEP_BEFORE_EXPIRY,
    UNDO_BEFORE_CLAIM,
    ArmedFault,
)
from celery_agboss.errors import FaultInjected

Context = Mapping[str, object]
Only = Callable[[Context], bool] | Mapping[str, object] | None
"""Which hits count: a predicate on the point's context, or context values that must match."""

DEFAULT_PAUSE_TIMEOUT = 30.0


class PausedPointTimeoutError(FaultInjected):
    """A paused fault point was never released; it gave up so the test suite cannot hang."""

    point: str


class ArmedPoint:
    """A handle on one armed fault point: how often it was hit, and a bounded wait for it."""

    def __init__(self, point: str) -> None:
        self.point = point
        self._cancel = threading.Event()
        self._fault: ArmedFault | None = None

    @property
    def hits(self) -> int:
        return self._fault.hits if self._fault is not None else 0

    @property
    def remaining(self) -> int:
        """Hits still to come."""
        return self._fault.times if self._fault is not None else 0

    @property
    def reached(self) -> bool:
        return self._fault is not None and self._fault.reached.is_set()

    def wait_reached(self, timeout: float = 10.0) -> None:
        """Block until a thread reached the point; fails the test (AssertionError) on timeout."""
        assert self._fault is not None
        if not self._fault.reached.wait(timeout):
            raise AssertionError(f"fault point {self.point!r} was not reached within {timeout} s")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.point!r} hits={self.hits}>"


class PausedPoint(ArmedPoint):
    """Threads reaching the point block until ``release()`` (or until ``timeout`` passes)."""

    def __init__(self, point: str, timeout: float) -> None:
        super().__init__(point)
        self.timeout = timeout
        self.timed_out = False

    def release(self) -> None:
        """Let every thread paused here (and every later hit) go on."""
        self._cancel.set()

    @property
    def released(self) -> bool:
        return self._cancel.is_set()

    def _pause(self, context: dict[str, object]) -> None:
        if not self._cancel.wait(self.timeout):
            self.timed_out = True
            raise PausedPointTimeoutError(
                f"fault point {self.point!r} stayed paused {self.timeout} s without release()",
                point=self.point,
            )

    def __enter__(self) -> PausedPoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


_live: list[ArmedPoint] = []
_live_lock = threading.Lock()


def _matcher(only: Only) -> Callable[[dict[str, object]], bool] | None:
    if only is None:
        return None
    if isinstance(only, Mapping):
        wanted = dict(only)
        return lambda context: all(context.get(k) == v for k, v in wanted.items())
    predicate = only
    return lambda context: bool(predicate(context))


def _arm(
    handle: ArmedPoint, action: Callable[[dict[str, object]], None], times: int, only: Only
) -> None:
    if times < 1:
        raise ValueError("times must be >= 1")
    handle._fault = ArmedFault(action=action, times=times, only=_matcher(only))
    _core._arm(handle.point, handle._fault)  # refuses an unknown point name
    with _live_lock:
        _live.append(handle)


def arm_pause(
    point: str, *, times: int = 1, only: Only = None, timeout: float = DEFAULT_PAUSE_TIMEOUT
) -> PausedPoint:
    """Block the next ``times`` threads reaching ``point`` until ``.release()``."""
    paused = PausedPoint(point, timeout)
    _arm(paused, paused._pause, times, only)
    return paused


def arm_raise(
    point: str,
    exc: BaseException | type[BaseException] | None = None,
    *,
    times: int = 1,
    only: Only = None,
) -> ArmedPoint:
    """Raise ``exc`` (default ``FaultInjected``) in the next ``times`` threads reaching ``point``.

    A ``BaseException`` such as ``SystemExit`` models Celery's cold shutdown (design: trap 6).
    """
    handle = ArmedPoint(point)

    def action(context: dict[str, object]) -> None:
        if exc is None:
            raise FaultInjected(f"fault injected at {point!r}", point=point)
        raise exc() if isinstance(exc, type) else exc

    _arm(handle, action, times, only)
    return handle


def arm_sleep(
    point: str, seconds: float | timedelta, *, times: int = 1, only: Only = None
) -> ArmedPoint:
    """Delay the next ``times`` threads at ``point`` by ``seconds`` (``disarm_all`` wakes them)."""
    delay = to_seconds(seconds, what="seconds")
    if delay < 0:
        raise ValueError("seconds must be >= 0")
    handle = ArmedPoint(point)

    def action(context: dict[str, object]) -> None:
        handle._cancel.wait(delay)

    _arm(handle, action, times, only)
    return handle


def arm_fault(
    point: str,
    action: Callable[[Mapping[str, object]], None],
    *,
    times: int = 1,
    only: Only = None,
) -> ArmedPoint:
    """Run ``action(context)`` in the thread reaching ``point``: anything the helpers above lack."""
    handle = ArmedPoint(point)
    _arm(handle, action, times, only)
    return handle


def disarm_all() -> None:
    """Disarm every point and wake every thread paused or sleeping in one."""
    _core._disarm_all()
    with _live_lock:
        handles = list(_live)
        _live.clear()
    for handle in handles:
        handle._cancel.set()


__all__ = [
    "DEFAULT_PAUSE_TIMEOUT",
    "FENCED_AFTER_CHECK",
    "FENCED_AFTER_COMMIT",
    "FENCED_BEFORE_BEGIN",
    "FENCED_BEFORE_COMMIT",
    "KNOWN_POINTS",
    "LEASE_BEFORE_COMMIT",
    "OUTBOUND_AFTER_READ",
    "OUTBOUND_AFTER_SEND",
    "OUTBOUND_BEFORE_RELY",
    "OUTBOUND_BEFORE_SEND",
    "OUTBOUND_BEFORE_SETTLE",
    "RECONCILE_AFTER_LOOKUP",
    "RECONCILE_BEFORE_RESEND",
    "RENEWER_BEFORE_RENEW",
    "SWEEP_BEFORE_EXPIRY",
    "UNDO_BEFORE_CLAIM",
    "ArmedPoint",
    "PausedPoint",
    "PausedPointTimeoutError",
    "arm_fault",
    "arm_pause",
    "arm_raise",
    "arm_sleep",
    "disarm_all",
]
