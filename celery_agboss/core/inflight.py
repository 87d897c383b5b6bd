"""Sends running in this process, and the bounded runner that starts them.

Two needs meet here. A second caller of the same idempotency key in this process
(another thread of a threads pool, two tasks for one order) must *join* the send in
flight (``JOINED``), not be told "in flight elsewhere" (design: PS7) — but only when it
asks for the same request (design: R16). And a send must be bounded by ``attempt_timeout``:
it runs in a worker thread, and the caller stops waiting when the bound passes
(design: R22), while the thread, which cannot be killed, is remembered as still running so
that its lease is never released under it (design: R18, R23).
"""

from __future__ import annotations

import contextvars
import enum
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from celery_agboss.core.store_protocol import LeaseRef


class RunState(str, enum.Enum):
    RETURNED = "RETURNED"
    RAISED = "RAISED"
    TIMED_OUT = "TIMED_OUT"


@dataclass
class BoundedRun:
    """One call running in its own thread; ``wait`` gives up at the deadline, the thread doesn't."""

    name: str
    deadline: float  # time.monotonic() after which the caller stops waiting
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None
    abandoned: bool = False
    on_late: Callable[[BoundedRun], None] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def state(self) -> RunState:
        if not self.done.is_set():
            return RunState.TIMED_OUT
        return RunState.RAISED if self.error is not None else RunState.RETURNED

    def wait(self) -> RunState:
        """Wait until the call ends or the deadline passes (then the run is abandoned)."""
        remaining = self.deadline - time.monotonic()
        if remaining > 0:
            self.done.wait(remaining)
        with self._lock:
            if not self.done.is_set():
                self.abandoned = True
        return self.state

    def _finish(self) -> None:
        with self._lock:
            self.done.set()
            late = self.abandoned
        if late and self.on_late is not None:
            self.on_late(self)


def run_bounded(
    name: str,
    fn: Callable[[Any], Any],
    arg: Any,
    timeout_s: float,
    *,
    on_late: Callable[[BoundedRun], None] | None = None,
    before_start: Callable[[BoundedRun], None] | None = None,
) -> BoundedRun:
    """Start ``fn(arg)`` in a daemon thread (with the caller's context variables).

    ``before_start`` runs before the thread exists, so whoever tracks running calls
    knows of this one before it can reach the gateway.
    """
    run = BoundedRun(name=name, deadline=time.monotonic() + max(timeout_s, 0.0), on_late=on_late)
    context = contextvars.copy_context()

    def target() -> None:
        try:
            run.result = context.run(fn, arg)
        except BaseException as exc:  # everything is reported to the caller
            run.error = exc
        finally:
            run._finish()

    if before_start is not None:
        before_start(run)
    threading.Thread(target=target, name=f"agboss-{name}", daemon=True).start()
    return run


@dataclass
class InFlightSend:
    """A send of this process: who sends which attempt of which key, and how it ended."""

    idempotency_key: str
    owner: LeaseRef
    attempt: int
    fingerprint: str
    deadline: float  # monotonic: joiners wait no longer than the sender's own bound
    finished: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    succeeded: bool = False  # settled COMPLETED with this result

    def finish(self, *, succeeded: bool, result: Any = None) -> None:
        self.succeeded = succeeded
        self.result = result
        self.finished.set()

    def wait(self) -> bool:
        """Wait (bounded by the sender's deadline); True when it settled with a result."""
        remaining = self.deadline - time.monotonic()
        if remaining > 0:
            self.finished.wait(remaining)
        return self.finished.is_set() and self.succeeded


class InFlightRegistry:
    """Process-local: the sends now running, by idempotency key."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sends: dict[str, InFlightSend] = {}

    def begin(self, send: InFlightSend) -> None:
        with self._lock:
            self._sends[send.idempotency_key] = send

    def end(self, send: InFlightSend) -> None:
        with self._lock:
            if self._sends.get(send.idempotency_key) is send:
                del self._sends[send.idempotency_key]

    def find(
        self, idempotency_key: str, owner: LeaseRef | None, attempt: int
    ) -> InFlightSend | None:
        """The running send of exactly this attempt under exactly this owner, if any."""
        with self._lock:
            send = self._sends.get(idempotency_key)
        if send is None or owner is None or send.owner != owner or send.attempt != attempt:
            return None
        return send


IN_FLIGHT = InFlightRegistry()
"""The one registry of this process (a forked child starts with an empty copy)."""


__all__ = ["IN_FLIGHT", "BoundedRun", "InFlightSend", "RunState", "run_bounded"]
