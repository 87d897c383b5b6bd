"""A holder's reconcile is asked about the intent's own request
(design: only the request's payment), even when the delivery that reconciles brought
another request under the key.

Order A's charge lost its answer under the business key ``order:1``; another execution
then calls that key with order B's request (a second click with another basket, a
rolling deploy). Its reconcile used to get B's request in its ``CallContext``: a
reconcile that finds the payment by the request's reference found B's payment and
stored it as A's, so A's re-run was handed B's receipt (A's order marked paid with
another customer's charge; a refund of it refunds the wrong card). Twin
(``reconcile-reads-this-request``): the receipt A is handed is B's.
"""

from __future__ import annotations

from typing import Any

import pytest

from celery_agboss.core.outbound import CallContext, Completed, Lookup, NotSent, OutboundCall
from celery_agboss.core.protections import RECONCILE_READS_THIS_REQUEST
from celery_agboss.errors import IdempotencyKeyConflictError
from celery_agboss.testing import sabotage
from tests.engine.helpers import Shop

KEY = "order:1"


def _by_reference(shop: Shop) -> Any:
    """Finds the payment whose reference is the request's order (a search by reference,
    as gateways without a lookup by key offer)."""

    def reconcile(call: CallContext, lookup: Lookup) -> Completed[Any] | NotSent:
        for payment in shop.gateway.payments:
            if payment.get("reference") == call.request["order"]:
                return Completed(payment)
        return NotSent()

    return reconcile


def _charge_with_reference(shop: Shop) -> Any:
    def send(call: CallContext) -> Any:
        request = call.request
        return shop.gateway.charge(
            request["amount"], call.idempotency_key, reference=request["order"]
        )

    return send


def _a_re_run_after_b_reconciled(shop: Shop) -> tuple[Any, OutboundCall]:
    call = shop.charge_call(reconcile=_by_reference(shop), send=_charge_with_reference(shop))
    shop.gateway.charge(1000, "elsewhere", reference="B")  # B paid, under its own key
    shop.lose_the_answer("pay-A", call, {"amount": 1000, "order": "A"}, business_key=KEY)
    shop.expire_leases()
    with shop.start("pay-B") as other, pytest.raises(IdempotencyKeyConflictError):
        other.outbound(call, {"amount": 1000, "order": "B"}, business_key=KEY)
    with shop.start("pay-A") as rerun:
        receipt = rerun.outbound(call, {"amount": 1000, "order": "A"}, business_key=KEY)
    return receipt, call


def test_another_request_under_the_key_reconciles_the_stored_one(shop: Shop) -> None:
    receipt, _ = _a_re_run_after_b_reconciled(shop)
    assert receipt["reference"] == "A", "A is handed its own payment"
    assert sorted(p["reference"] for p in shop.gateway.payments) == ["A", "B"]


def test_twin_reconcile_reads_this_request_and_hands_a_b_s_payment(shop: Shop) -> None:
    with sabotage(RECONCILE_READS_THIS_REQUEST):
        receipt, _ = _a_re_run_after_b_reconciled(shop)
    assert receipt["reference"] == "B", "A's order marked paid with B's charge"
