"""A Celery app on a real store, and the verbs that put executions where the sweep finds them.

Deliveries here are the real ones, cut short: ``start_delivery`` (lease + RUNNING, as a
worker does), an ``ExecutionContext`` whose outbound call meets a gateway fault, and
then the holder "dies" (nothing released; the virtual database clock moves past the
lease). The sweep and the operator commands then act on exactly what a killed worker
leaves behind. The app is ``make_test_app``'s (what the ``agboss_app`` fixture gives
users), with the sweep's settings below.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from celery import Celery

from celery_agboss import AGBoss, Completed, NotSent, OutboundCall, Unknown
from celery_agboss.core.execution_context import ExecutionContext
from celery_agboss.core.executions import ExecutionRecord, StartKind
from celery_agboss.core.holder_clocks import SYSTEM_CLOCK
from celery_agboss.core.lease import SentAt, handle_for_grant, new_holder
from celery_agboss.core.outbound import CallContext, Lookup
from celery_agboss.core.store_protocol import IntentRecord, LeaseRef
from celery_agboss.errors import OutboundCallOutcomeUnknownError
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
    "make_world",
]
