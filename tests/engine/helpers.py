"""Helpers of the engine suite: calls against the fake gateway, deliveries, threads.

A "delivery" is one ``ExecutionContext`` (what one Celery delivery of a task gets).
A crash is a ``Crash`` raised at a fault point: the delivery stops where it is and
never releases its lease — exactly what a SIGKILL leaves behind.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest

from celery_agboss.core import execution_context
from celery_agboss.core.engine_settings import EngineSettings
from celery_agboss.core.execution_context import ExecutionContext
from celery_agboss.core.holder_clocks import SYSTEM_CLOCK, HolderClock
from celery_agboss.core.masking import MaskingPolicy
from celery_agboss.core.outbound import (
    CallContext,
    Completed,
    Lookup,
    NotSent,
    OutboundCall,
    Outcome,
    Unknown,
)
from celery_agboss.core.step_identity import Step, step_of
from celery_agboss.core.store_protocol import IntentRecord, Store
from celery_agboss.errors import OutboundCallOutcomeUnknownError
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore
from celery_agboss.testing.clock import VirtualClock
from celery_agboss.testing.fault_arming import OUTBOUND_AFTER_READ, ArmedPoint, arm_pause
from celery_agboss.testing.gateway import (
    FakeGateway,
    FakeGatewayError,
    FakeGatewayErrorKind,
    FakeGatewayFault,
    is_definite_failure,
)

PSEUDONYM_KEY = b"engine-suite-pseudonym-key-not-a-secret"
DAY = timedelta(days=1)


class Crash(BaseException):
    """The delivery died here (SIGKILL, OOM): nothing after this point runs."""


def reconcile_by_lookup(gateway: FakeGateway) -> Callable[[CallContext, Lookup], Any]:
    """Find the payment by the call's key; absent means not sent (design: G2)."""

    def reconcile(call: CallContext, lookup: Lookup) -> Completed[Any] | NotSent | Unknown:
        found = gateway.lookup(lookup.idempotency_key)
        return NotSent() if found is None else Completed(found)

    return reconcile


def reconcile_by_replay(call: CallContext, lookup: Lookup) -> NotSent:
    """No lookup (G1 + G3 only): answer NotSent and let the gateway replay the key."""
    return NotSent()


def reconcile_unknown(call: CallContext, lookup: Lookup) -> Unknown:
    """Neither G1 nor G2: nothing can tell what happened."""
    return Unknown("this gateway has no lookup")


def _charge(gateway: FakeGateway) -> Callable[[CallContext], Any]:
    def send(call: CallContext) -> Any:
        request = call.request
        return gateway.charge(
            request["amount"], call.idempotency_key, currency=request.get("currency", "usd")
        )

    return send


@dataclass
class Shop:
    """The application side of a test: its outbound calls and its deliveries."""

    store: SQLAlchemyStore
    store_factory: Callable[..., SQLAlchemyStore]
    settings: EngineSettings
    gateway: FakeGateway
    clock: VirtualClock
    _names: int = field(default=0)

    def charge_call(
        self,
        name: str = "fake.charge",
        *,
        reconcile: Callable[[CallContext, Lookup], Any] | str = "lookup",
        key_retention: timedelta | None = DAY,
        lookup_proves_absence: bool = False,
        mask: MaskingPolicy | None = None,
        send: Callable[[CallContext], Any] | None = None,
        definite: Callable[[BaseException], bool] = is_definite_failure,
    ) -> OutboundCall:
        if reconcile == "lookup":
            reconcile = reconcile_by_lookup(self.gateway)
        elif reconcile == "replay":
            reconcile = reconcile_by_replay
        elif reconcile == "unknown":
            reconcile = reconcile_unknown
        assert callable(reconcile)
        return OutboundCall(
            name=name,
            send=send or _charge(self.gateway),
            reconcile=reconcile,
            is_definite_failure=definite,
            key_retention=key_retention,
            lookup_proves_absence=lookup_proves_absence,
            mask=mask,
            transaction_id=lambda result: result.get("id") if isinstance(result, dict) else None,
        )

    def start(
        self,
        execution_id: str,
        *,
        clock: HolderClock = SYSTEM_CLOCK,
        store: Store | None = None,
        settings: EngineSettings | None = None,
    ) -> ExecutionContext:
        """A new delivery of ``execution_id`` (a new holder, never re-entrant)."""
        return ExecutionContext.start(
            store or self.store, execution_id, settings or self.settings, clock=clock
        )

    def expire_leases(self) -> None:
        """Move the database clock past every lease taken so far (no sleeping)."""
        self.clock.advance(self.settings.lease_ttl_ms / 1000 + 1)

    def unknown(self, execution_id: str, call: OutboundCall, request: Any, **options: Any) -> None:
        """A delivery of ``execution_id`` whose ``call`` ends on an unknown outcome (the
        intent stays pending for the next delivery to reconcile)."""
        with self.start(execution_id) as first, pytest.raises(OutboundCallOutcomeUnknownError):
            first.outbound(call, request, **options)

    def lose_the_answer(
        self,
        execution_id: str,
        call: OutboundCall,
        request: Any,
        *,
        gateway: FakeGateway | None = None,
        operation: str | None = None,
        **options: Any,
    ) -> None:
        """The gateway (``gateway``, or this shop's) processes the next request (of
        ``operation``) and drops its answer: ``unknown`` for that delivery."""
        (gateway or self.gateway).inject_fault(
            FakeGatewayFault.ANSWER_THEN_DROP, operation=operation
        )
        self.unknown(execution_id, call, request, **options)

    def reconciled(
        self, execution_id: str, call: OutboundCall, request: Any, **options: Any
    ) -> Any:
        """The next delivery of ``execution_id``: ``call`` answered by reconcile, not
        sent again. Returns what the body got."""
        with self.start(execution_id) as retry:
            result = retry.outbound(call, request, **options)
            assert retry.last_outcome is Outcome.RECONCILED
        return result

    def race_past_the_read(
        self,
        names: tuple[str, ...],
        call: OutboundCall,
        request: Any,
        business_key: str,
        then: Callable[[], None] | None = None,
    ) -> list[tuple[Any, BaseException | None]]:
        """Deliveries of ``names``, each on a store connection of its own, sending one
        business key: all are held right after reading its intent and let go together,
        so none has written when the others read. ``then`` runs once they are let go;
        returns each one's ``(result, error)``."""
        paused = arm_pause(OUTBOUND_AFTER_READ, times=len(names))
        racers = [self.start(name, store=self.store_factory()) for name in names]
        threads = [
            Background(functools.partial(ctx.outbound, call, request, business_key=business_key))
            for ctx in racers
        ]
        wait_for_hits(paused, len(names))  # all have read; none has written
        paused.release()
        if then is not None:
            then()
        return [thread.outcome() for thread in threads]

    def intent(self, ctx: ExecutionContext, key: str) -> IntentRecord:
        record = self.store.read_intent(key)
        assert record is not None, "no intent under that key"
        return record

    def payments(self) -> list[dict[str, Any]]:
        return self.gateway.payments


def mark_every_step_key(monkeypatch: pytest.MonkeyPatch, mark: str) -> list[Step]:
    """Make the one function that names a delivery's steps (``core.step_identity``) end
    every key with ``mark``: a record kept under a key made anywhere else lacks it. The
    steps it made, in order (filled in as the test runs)."""
    made: list[Step] = []

    def marked_step_of(*args: Any, **kwargs: Any) -> Step:
        step = step_of(*args, **kwargs)
        step = dataclasses.replace(step, key=step.key + mark)
        made.append(step)
        return step

    monkeypatch.setattr(execution_context, "step_of", marked_step_of)
    return made


def business_intent_key(settings: EngineSettings, business_key: str, name: str) -> str:
    from celery_agboss.core.keys import business_key as make

    return make(settings.tenant, business_key, name)


def step_intent_key(settings: EngineSettings, execution_id: str, name: str, n: int = 1) -> str:
    from celery_agboss.core.keys import step_key

    return step_key(settings.tenant, execution_id, name, n)


class Background:
    """A callable run in a thread; ``join()`` returns its value or re-raises its exception."""

    def __init__(self, fn: Callable[[], Any], name: str = "background") -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn,), name=name, daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.result = fn()
        except BaseException as exc:
            self.error = exc

    def join(self, timeout: float = 20.0) -> Any:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"{self._thread.name} still running after {timeout} s"
        if self.error is not None:
            raise self.error
        return self.result

    def outcome(self, timeout: float = 20.0) -> tuple[Any, BaseException | None]:
        """``(result, error)`` without raising."""
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"{self._thread.name} still running after {timeout} s"
        return self.result, self.error

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()


def wait_for_hits(point: ArmedPoint, hits: int, timeout: float = 10.0) -> None:
    """Wait until ``hits`` threads reached an armed point (bounded)."""
    deadline = time.monotonic() + timeout
    while point.hits < hits:
        assert time.monotonic() < deadline, f"{point.point}: {point.hits} of {hits} hits"
        time.sleep(0.005)


def wait_until(condition: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what or condition}"
        time.sleep(0.005)


def retry_asked(ctx: ExecutionContext) -> None:
    """End ``ctx``'s delivery as a retry its body asked for (``self.retry()``,
    ``autoretry_for``) ends it in a worker: the definite failures that ended it may be
    sent again by the execution's next delivery (its retry authorisation)."""
    with ctx.fenced() as tx:
        ctx.authorise_retries(tx)


def lookup_unsupported(exc: BaseException) -> bool:
    return isinstance(exc, FakeGatewayError) and exc.kind is FakeGatewayErrorKind.LOOKUP_UNSUPPORTED


__all__ = [
    "DAY",
    "PSEUDONYM_KEY",
    "Background",
    "Crash",
    "Shop",
    "business_intent_key",
    "mark_every_step_key",
    "reconcile_by_lookup",
    "reconcile_by_replay",
    "reconcile_unknown",
    "retry_asked",
    "step_intent_key",
    "wait_for_hits",
    "wait_until",
]
