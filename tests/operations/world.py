"""A Celery app on a real store, and the verbs that put executions where the sweep finds them.

Deliveries here are the real ones, cut short: ``start_delivery`` (lease + RUNNING, as a
worker does), an ``ExecutionContext`` whose outbound call meets a gateway fault, and
then the holder "dies" (nothing released; the virtual database clock moves past the
lease). The sweep and the operator commands then act on exactly what a killed worker
leaves behind. The app is ``make_test_app``'s (what the ``agboss_app`` fixture gives
users), with the sweep's settings below.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from celery import Celery

from celery_agboss import AGBoss, Completed, NotSent, OutboundCall, Unknown
from celery_agboss.core import compensation
from celery_agboss.core.compensation import UndoContext, UndoStep
from celery_agboss.core.execution_context import ExecutionContext
from celery_agboss.core.executions import ExecutionRecord, ExecutionState, StartKind
from celery_agboss.core.holder_clocks import SYSTEM_CLOCK
from celery_agboss.core.lease import SentAt, handle_for_grant, new_holder
from celery_agboss.core.outbound import CallContext, Lookup
from celery_agboss.core.store_protocol import IntentRecord, LeaseRef
from celery_agboss.errors import (
    AGBossSignal,
    OutboundCallOutcomeUnknownError,
    OutboundCallUnreconciledError,
)
from celery_agboss.metrics.exporter import exposition
from celery_agboss.sweep import SweepReport, run_sweep
from celery_agboss.task import PaymentTask
from celery_agboss.testing.celery_app import close_test_app, make_test_app
from celery_agboss.testing.clock import VirtualClock
from celery_agboss.testing.gateway import FakeGateway
from celery_agboss.testing.gateway_types import FakeGatewayFault

TTL_SECONDS = 30
"""The lease TTL of this world's app. Leases here end on the virtual database clock
(``die`` moves it past them), so the TTL costs no waiting; it is the product's
default rather than the short one real-worker tests use because on SQLite a fenced
transaction is rolled back once it has held the write lock for a quarter of the TTL of
wall time, and a test process starved of CPU on a loaded CI machine once passed 1.25 s
(a quarter of 5 s) inside a two-statement transaction."""
GRACE_SECONDS = 60
INTERVAL_SECONDS = 30
CAP = 3


@dataclass
class World:
    app: Celery
    agboss: AGBoss
    clock: VirtualClock
    gateway: FakeGateway
    call: OutboundCall
    task: Any
    published: list[str]
    lookups_answer: list[str] = field(default_factory=lambda: ["gateway"])

    # --- publishing and reading -----------------------------------------------------

    def publish(self, order: str | None = None, **options: Any) -> str:
        order = order or uuid.uuid4().hex[:8]
        return str(self.task.apply_async((order,), **options).id)

    def execution(self, execution_id: str) -> ExecutionRecord:
        record = self.agboss.executions.read_execution(execution_id)
        assert record is not None, f"no execution {execution_id}"
        return record

    def intents(self, execution_id: str) -> list[IntentRecord]:
        return self.agboss.executions.list_intents_of(execution_id)

    def failed_after_payment_gauge(self) -> float:
        """``agboss_executions_failed_after_payment`` as the app's metrics expose it."""
        for line in exposition(self.app).decode().splitlines():
            if line.startswith("agboss_executions_failed_after_payment "):
                return float(line.split()[1])
        raise AssertionError("the gauge is not exposed")

    def publishes_of(self, execution_id: str) -> int:
        return self.published.count(execution_id)

    # --- deliveries ------------------------------------------------------------------------

    def start(self, execution_id: str) -> ExecutionContext:
        """A delivery starts, as a worker's would: the lease and RUNNING in one transaction."""
        record = self.execution(execution_id)
        settings = self.agboss.settings
        sent = SentAt.now(SYSTEM_CLOCK)
        start = self.agboss.executions.start_delivery(
            record.message, new_holder(), settings.lease_ttl_ms, settings.max_recovery_attempts
        )
        assert start.kind is StartKind.STARTED, start.kind
        assert start.grant is not None
        lease = handle_for_grant(start.grant, settings.lease_ttl_ms, sent)
        return ExecutionContext(self.agboss.store, lease, execution_id, self.agboss.engine_settings)

    def die(self) -> None:
        """Every live holder stops (nothing released); its lease passes on the database clock."""
        self.clock.advance(TTL_SECONDS + 1)

    def strand(
        self,
        execution_id: str,
        fault: FakeGatewayFault = FakeGatewayFault.ANSWER_THEN_DROP,
        *,
        die: bool = True,
    ) -> tuple[str, LeaseRef]:
        """A delivery sends a charge, meets ``fault``, and dies: a PENDING intent stays
        (``die=False``: the holder is gone but its lease has not passed yet)."""
        ctx = self.start(execution_id)
        self.gateway.inject_fault(fault)
        try:
            ctx.outbound(
                self.call,
                {"amount": 1000, "order": execution_id},
                business_key=f"order:{execution_id}",
            )
        except OutboundCallOutcomeUnknownError:
            pass  # what the fault makes of it; any other signal says what went wrong
        else:  # pragma: no cover - the fault makes the outcome unknown
            raise AssertionError("the charge was expected to end unknown")
        (intent,) = self.intents(execution_id)
        if die:
            self.die()
        return intent.idempotency_key, ctx.lease_ref

    def charge(self, ctx: ExecutionContext, order: str) -> Any:
        """``ctx``'s delivery sends the world's charge of ``order`` under ``order:<order>``."""
        return ctx.outbound(
            self.call, {"amount": 1000, "order": order}, business_key=f"order:{order}"
        )

    def charged_then_failed(self, order: str) -> str:
        """A delivery charges ``order``, then its body fails: the customer is charged."""
        execution = self.publish(order)
        ctx = self.start(execution)
        self.charge(ctx, order)
        with ctx.fenced() as tx:
            self.agboss.executions.fail_in(tx, '{"type": "LookupError"}', "LookupError")
        ctx.settle_all_and_release()
        return execution

    def failed_after_its_undo(
        self, order: str, run_step: Callable[[UndoContext, UndoStep], None]
    ) -> str:
        """A delivery charges ``order`` and declares its ``refund`` undo; its body fails,
        ``run_step`` runs that undo (once), and the execution ends ``FAILED``."""
        execution = self.publish(order)
        ctx = self.start(execution)
        receipt = self.charge(ctx, order)
        compensation.declare_undo(ctx, "refund", {"payment": receipt["id"]})
        undo = UndoContext.over(ctx)
        with undo.fenced() as tx:
            steps = compensation.read_declarations(tx, self.agboss.engine_settings, execution)
        ran = compensation.run_undos(
            undo, steps, lambda step: run_step(undo, step), cause=compensation.FAILURE
        )
        assert ran == 1
        with undo.fenced() as tx:
            self.agboss.executions.fail_in(tx, '{"type": "LookupError"}', "LookupError")
        undo.settle_all_and_release()
        return execution

    def deliver_again(self, execution_id: str) -> AGBossSignal | None:
        """One more delivery of ``execution_id`` sends its charge (as ``strand`` did):
        the signal that stopped it, if any."""
        ctx = self.start(execution_id)
        stopped = None
        try:
            self.charge(ctx, execution_id)
        except AGBossSignal as exc:
            stopped = exc
        ctx.settle_all_and_release()
        return stopped

    def two_executions_on_one_key(self, order: str = "o-9") -> tuple[str, str, str]:
        """A's answer is lost and A dies; B, a second execution of ``order``, takes A's
        intent over for reconcile, the lookup cannot tell (a world with ``lookup="none"``),
        and B waits for an operator; so does A once the sweep's lookup cannot tell either.
        The intent is A's (its creator): A, B and its key."""
        first = self.publish(order)
        dying = self.start(first)
        self.gateway.inject_fault(FakeGatewayFault.ANSWER_THEN_DROP)
        with contextlib.suppress(AGBossSignal):
            self.charge(dying, order)
        (intent,) = self.intents(first)
        self.die()
        second = self.publish(order)
        ctx = self.start(second)
        with contextlib.suppress(OutboundCallUnreconciledError):
            self.charge(ctx, order)
        with ctx.fenced() as tx:
            self.agboss.executions.waiting_operator_in(tx, "OutboundCallUnreconciledError")
        ctx.settle_all_and_release()
        self.sweep()
        assert self.intents(second) == [], "B created nothing: the intent is A's"
        for execution in (first, second):
            assert self.execution(execution).state is ExecutionState.WAITING_OPERATOR
        return first, second, intent.idempotency_key

    def stranded(
        self,
        fault: FakeGatewayFault = FakeGatewayFault.ANSWER_THEN_DROP,
        *,
        order: str | None = None,
        die: bool = True,
    ) -> tuple[str, str]:
        """A published execution ``strand`` left with a PENDING intent: its id, the key."""
        execution_id = self.publish(order)
        key, _ = self.strand(execution_id, fault, die=die)
        return execution_id, key

    def sweep(self, **kwargs: Any) -> SweepReport:
        return run_sweep(self.agboss, **kwargs)

    def sweep_sending_nothing(self, **kwargs: Any) -> SweepReport:
        """A sweep, asserted to send no request to the gateway: it looks up and records,
        it never sends money (design: P3)."""
        before = len(self.gateway.requests)
        report = self.sweep(**kwargs)
        assert len(self.gateway.requests) == before, "the sweep sent a request"
        return report

    def close(self) -> None:
        close_test_app(self.app)


@contextlib.contextmanager
def connected(signal: Any, receiver: Callable[..., None]) -> Iterator[None]:
    """``receiver`` connected (strongly) to the Celery ``signal`` while the block runs."""
    signal.connect(receiver, weak=False)
    try:
        yield
    finally:
        signal.disconnect(receiver)


OPS_SETTINGS: dict[str, Any] = {
    "task_default_queue": "ops",
    "agboss_pseudonym_key": "operations-tests-pseudonym-key",
    "agboss_lease_ttl": TTL_SECONDS,
    "agboss_requested_grace": GRACE_SECONDS,
    "agboss_sweep_interval": INTERVAL_SECONDS,
    "agboss_max_recovery_attempts": CAP,
    "agboss_attempt_timeout": 10,
}
"""The operations app's settings, in the test process (``make_world``) and in the CLI
and worker subprocesses (``tests.operations.apps.ops_app``)."""

_CALL_OPTIONS = ("lookup", "proves_absence", "validate_result", "unchecked")
"""``make_world`` options that shape its outbound call, not the app's settings."""


def make_world(
    database_url: str,
    *,
    clock: VirtualClock,
    gateway: FakeGateway,
    published: list[str],
    **settings: Any,
) -> World:
    config = dict(OPS_SETTINGS)
    config.update(
        {
            f"agboss_{k}" if not k.startswith("agboss_") else k: v
            for k, v in settings.items()
            if k not in _CALL_OPTIONS
        }
    )
    app = make_test_app(database_url, clock_offset_source=clock.offset_ms, config=config)
    agboss = AGBoss.of(app)
    mode: str = settings.get("lookup", "gateway")

    def send(call: CallContext) -> Any:
        return gateway.charge(
            call.request["amount"], call.idempotency_key, reference=call.request["order"]
        )

    def reconcile(call: CallContext, lookup: Lookup) -> Any:
        if mode == "none":
            return Unknown("this gateway has no lookup")
        found = gateway.lookup(call.idempotency_key)
        return NotSent() if found is None else Completed(found)

    call = OutboundCall(
        name="ops.charge",
        send=send,
        reconcile=reconcile,
        key_retention=timedelta(hours=24),
        lookup_proves_absence=bool(settings.get("proves_absence", False)),
        transaction_id=None if settings.get("unchecked") else lambda result: result.get("id"),
        validate_result=settings.get("validate_result"),
    )
    agboss.register(call)

    @app.task(base=PaymentTask, bind=True, shared=False, name="ops.charge_order")
    def charge_order(self: Any, order: str) -> Any:  # pragma: no cover - no worker here
        return self.outbound(call, {"amount": 1000, "order": order}, business_key=f"order:{order}")

    return World(
        app=app,
        agboss=agboss,
        clock=clock,
        gateway=gateway,
        call=call,
        task=charge_order,
        published=published,
    )


__all__ = [
    "CAP",
    "GRACE_SECONDS",
    "INTERVAL_SECONDS",
    "OPS_SETTINGS",
    "TTL_SECONDS",
    "World",
    "connected",
    "make_world",
]
