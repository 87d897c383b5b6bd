"""A re-run is handed a definite failure as it was, under a policy that masks card fields.

A body that catches a soft decline by its codes (``["insufficient_funds"]``) and charges a
backup card must take that branch again when it re-runs after the backup's answer was
lost. The failure's arguments pass the call's field paths before they are stored; a text
in a list argument is not the request's, so the codes come back as they were and the
re-run completes the paid order (it waited for an operator, "failed while an outbound
call is pending", though the backup card had paid). On SQLite and PostgreSQL; money
counted at the fake gateway.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from celery_agboss import NotSent, OutboundCall
from celery_agboss.core.masking import MaskingPolicy
from celery_agboss.core.outbound import CallContext
from celery_agboss.testing.gateway_types import FakeGatewayError, FakeGatewayFault
from tests.delivery.conftest import PaymentShop

CARD_FIELDS = MaskingPolicy(mask=["card.number", "card.cvc"], keep_for_reconcile=["amount"])


class SoftDecline(Exception):
    """A decline carrying the gateway's decline codes."""

    def __init__(self, message: str, codes: list[str]) -> None:
        super().__init__(message, codes)
        self.codes = codes


def _soft_decline_then_backup(shop: PaymentShop, policy: MaskingPolicy) -> str:
    def send(call: CallContext) -> Any:
        try:
            return shop.gateway.charge(call.request["amount"], call.idempotency_key)
        except FakeGatewayError as exc:
            raise SoftDecline(str(exc), ["insufficient_funds"]) from exc

    primary = shop.agboss.register(
        OutboundCall(
            name="shop.primary-card",
            send=send,
            reconcile=lambda call, lookup: NotSent(),
            key_retention=timedelta(hours=24),
            is_definite_failure=lambda exc: isinstance(exc, SoftDecline),
            mask=policy,
        )
    )
    backup = shop.call("shop.backup-card")

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        request = {"amount": 1000, "order": order, "card": {"number": "4000000000000002"}}
        try:
            return self.outbound(primary, request, business_key=order)
        except SoftDecline as declined:
            if "insufficient_funds" not in declined.codes:
                raise
            return self.outbound(backup, {"amount": 1000, "order": order}, business_key=order)

    shop.gateway.inject_fault(FakeGatewayFault.DECLINE, operation="charge")
    shop.gateway.inject_fault(FakeGatewayFault.ANSWER_THEN_DROP, operation="charge")
    return shop.run(pay, "o-1", states=("COMPLETED", "WAITING_OPERATOR", "FAILED"), timeout=30)


def test_a_rerun_past_a_soft_decline_takes_the_same_branch_and_completes(
    shop: PaymentShop,
) -> None:
    task_id = _soft_decline_then_backup(shop, CARD_FIELDS)
    record = shop.execution(task_id)
    assert len(shop.gateway.payments) == 1, "the backup card paid, once"
    assert record.state.value == "COMPLETED", (record.state, record.reason)


def test_the_same_rerun_without_field_paths_completes_too(shop: PaymentShop) -> None:
    """The control: a policy that masks no field changes nothing of the failure."""
    task_id = _soft_decline_then_backup(shop, MaskingPolicy(keep_for_reconcile=["amount"]))
    assert shop.execution(task_id).state.value == "COMPLETED"
    assert len(shop.gateway.payments) == 1
