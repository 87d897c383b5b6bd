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
    MaskingPolicy,
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


def charge_in_a_helper(task: PaymentTask, order_id: int) -> tuple[Any, int] | None:
    """A helper the body calls with ``self``: the verbs are typed on any PaymentTask."""
    try:
        receipt = task.outbound(charge, {"amount": 500}, business_key=f"order:{order_id}")
        count: int = task.fenced_effect("count", lambda conn: 1)
    except (
        OutboundCallOutcomeUnknownError,
        OutboundCallInFlightError,
        OutboundCallUnreconciledError,
        ExecutionFencedError,
    ):
        raise  # signals: a body lets them through
    except IdempotencyKeyConflictError as conflict:
        raise ValueError(str(conflict)) from conflict
    if task.last_outcome is Outcome.SENT:
        return receipt, count
    return None


def signals_are_not_exceptions(exc: AGBossSignal) -> BaseException:
    return exc


def errors_are_exceptions(exc: AGBossError) -> Exception:
    return exc


# --- misuses the types must keep refusing ---------------------------------------------------

Completed()  # type: ignore[call-arg]
Unknown()  # type: ignore[call-arg]
OutboundCall(name="fake.refund", send=send_charge)  # type: ignore[call-arg]


def misuse(task: PaymentTask) -> None:
    task.outbound(charge)  # type: ignore[call-arg]
    task.outbound(charge, {}, business_key=42)  # type: ignore[arg-type]
    task.fenced_effect("x")  # type: ignore[call-arg]
    task.last_outcome = Outcome.SENT  # type: ignore[misc]
