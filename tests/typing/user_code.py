"""User code written against celery_agboss's public API, checked by ``mypy --strict``.

Never run: tests/unit/test_typing_user_code.py type-checks it in a subprocess. Lines
marked ``# type: ignore[...]`` are misuses the API must keep rejecting — with
``warn_unused_ignores`` (part of ``--strict``), an ignore that is no longer needed
fails the check, so the types cannot quietly loosen.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from celery_agboss import (
    AGBossError,
    AGBossSignal,
    CallContext,
    Completed,
    ExecutionFencedError,
    IdempotencyKeyConflictError,
    Lookup,
    NotSent,
    OutboundCall,
    OutboundCallInFlightError,
    OutboundCallOutcomeUnknownError,
    OutboundCallUnreconciledError,
    Outcome,
    PaymentTask,
    Unknown,
    validate_business_key,
)
from celery_agboss.core.engine_settings import EngineSettings
from celery_agboss.core.execution_context import ExecutionContext
from celery_agboss.core.masking import MaskingPolicy
from celery_agboss.core.store import Store
from celery_agboss.core.stranded import StrandedOutcome, reconcile_stranded
from celery_agboss.testing import FakeGateway, FakeGatewayError, VirtualClock

gateway = FakeGateway(clock=VirtualClock())


def send_charge(call: CallContext) -> dict[str, Any]:
    return gateway.charge(call.request["amount"], call.idempotency_key)


def reconcile_charge(
    call: CallContext, lookup: Lookup
) -> Completed[dict[str, Any]] | NotSent | Unknown:
    if lookup.key_age is not None and lookup.key_age > timedelta(days=30):
        return Unknown("older than the gateway's search window")
    found = gateway.lookup(lookup.idempotency_key)
    return NotSent() if found is None else Completed(found)


def is_declined(exc: BaseException) -> bool:
    return isinstance(exc, FakeGatewayError) and exc.kind.value == "DECLINED"


charge = OutboundCall(
    name="fake.charge",
    send=send_charge,
    reconcile=reconcile_charge,
    is_definite_failure=is_declined,
    key_retention=timedelta(hours=24),
    mask=MaskingPolicy(mask=["card.number"], keep_for_reconcile=["order"]),
    transaction_id=lambda result: str(result["id"]),
)


class ChargeOrder(PaymentTask):
    """A class-based task: the body calls the typed verbs of PaymentTask."""

    name = "shop.charge_order"

    def run(self, order_id: int) -> dict[str, Any]:
        key = validate_business_key(f"order:{order_id}")
        receipt: dict[str, Any] = self.outbound(
            charge, {"amount": 1000, "order": order_id}, business_key=key
        )
        marked: dict[str, int] = self.fenced_effect(
            "mark-paid", lambda conn: {"order": order_id}, business_key=key
        )
        outcome: Outcome | None = self.last_outcome
        return {"receipt": receipt, "marked": marked, "replayed": outcome is Outcome.REPLAYED}


def run_without_celery(store: Store, task_id: str) -> Any:
    settings = EngineSettings(pseudonym_key=b"a-key-of-at-least-16-bytes", tenant="shop")
    try:
        with ExecutionContext.start(store, task_id, settings) as ctx:
            receipt = ctx.outbound(charge, {"amount": 500}, business_key="order:1")
            count: int = ctx.fenced_effect("count", lambda conn: 1)
            if ctx.last_outcome is Outcome.SENT:
                return receipt, count
            return None
    except (OutboundCallOutcomeUnknownError, OutboundCallInFlightError):
        return "later"
    except (OutboundCallUnreconciledError, ExecutionFencedError):
        return "someone else decides"
    except IdempotencyKeyConflictError as conflict:
        return str(conflict)


def sweep_one(store: Store, settings: EngineSettings, key: str, ctx: ExecutionContext) -> bool:
    outcome = reconcile_stranded(store, settings, key, sweeper_lease=ctx.lease)
    return outcome is StrandedOutcome.COMPLETED


def signals_are_not_exceptions(exc: AGBossSignal) -> BaseException:
    return exc


def errors_are_exceptions(exc: AGBossError) -> Exception:
    return exc


# --- misuses the types must keep refusing ---------------------------------------------------

Completed()  # type: ignore[call-arg]
Unknown()  # type: ignore[call-arg]
OutboundCall(name="fake.refund", send=send_charge)  # type: ignore[call-arg]
EngineSettings(pseudonym_key="a str is not bytes")  # type: ignore[arg-type]


def misuse(ctx: ExecutionContext) -> None:
    ctx.outbound(charge)  # type: ignore[call-arg]
    ctx.outbound(charge, {}, business_key=42)  # type: ignore[arg-type]
    ctx.fenced_effect("x")  # type: ignore[call-arg]
    ctx.last_outcome = Outcome.SENT  # type: ignore[misc]
