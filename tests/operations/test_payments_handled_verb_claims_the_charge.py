"""``agboss payments-handled ID`` of a ``FAILED`` execution ("failed after a payment")
claims the charge it left behind, as ``cancel --payments-handled`` does
(``core.handled_steps``: one rule): once the operator refunded it by hand and said so, a
later click on the same order is told the charge was claimed, never handed it as paid
(goods shipped on a refunded charge), and its undo never refunds it a second time. Real
worker, both stores, counted at the fake gateway.

An order charged the card under the order's business key (no undo declared) and failed.
The operator refunds it by hand and confirms with ``payments-handled``; ``pending`` stops
listing it. A later click on the same order, which declares a refund and then fails, is
told the charge was claimed by the order: nothing shipped, no refund request sent. Twin
``payments-handled-verb-claims-nothing`` (the verb only sets the flag): the click is
handed the refunded charge as paid, ships, and its undo sends a second refund.
"""

from __future__ import annotations

from typing import Any

from celery_agboss import OutboundCallCompensatedError
from celery_agboss.core.protections import PAYMENTS_HANDLED_VERB_CLAIMS_NOTHING
from celery_agboss.operator import list_failed_after_payment, payments_handled
from celery_agboss.testing import sabotage
from tests.delivery.conftest import PaymentShop
from tests.delivery.wallet_orders import (
    CUSTOMER,
    HANDLED,
    charge_the_card,
    our_refund_requests,
    refund_by_hand,
    refund_charge_undo,
)
from tests.operations.handled_orders import NEW_CLICK_ENDS, failed_after_a_charge


def _handled_then_clicked(shop: PaymentShop) -> tuple[str, list[Any], list[Any]]:
    """The failed order is refunded by hand and marked handled; a later click on the same
    order charges the card (undo: a refund), ships on what it is handed, then fails. The
    order's id, what the click was told, and what it shipped on."""
    task_id = failed_after_a_charge(shop)
    refund_by_hand(shop)
    marked = payments_handled(shop.app, task_id, HANDLED)
    assert marked.state.value == "FAILED" and list_failed_after_payment(shop.app) == []
    charge, told, shipped = shop.call(), [], []
    refund_charge_undo(shop, shop.refund_call())

    @shop.task()
    def click_ship_then_fail(self: Any, customer: str) -> Any:
        try:
            receipt = charge_the_card(self, charge, customer)
        except OutboundCallCompensatedError as exc:
            told.append(exc)
            return None
        shipped.append(receipt)
        self.undo_with("refund-charge", payment=receipt["id"])
        raise LookupError("the courier lost it")

    shop.run(click_ship_then_fail, CUSTOMER, states=NEW_CLICK_ENDS)
    return task_id, told, shipped


def _charge_requests(shop: PaymentShop) -> list[Any]:
    return [r for r in shop.gateway.requests if r.operation == "charge"]


def test_payments_handled_verb_claims_the_charge_for_a_later_click(shop: PaymentShop) -> None:
    task_id, told, shipped = _handled_then_clicked(shop)
    assert [(t.undone, t.undo_by) for t in told] == [(False, task_id)]
    assert shipped == []
    assert len(_charge_requests(shop)) == 1 and len(shop.gateway.refunds) == 1
    assert our_refund_requests(shop) == [], "no refund beyond the operator's by hand"


def test_twin_payments_handled_verb_claims_nothing_and_refunds_again(shop: PaymentShop) -> None:
    with sabotage(PAYMENTS_HANDLED_VERB_CLAIMS_NOTHING):
        _, told, shipped = _handled_then_clicked(shop)
    assert told == [] and len(shipped) == 1, "shipped on the charge refunded by hand"
    assert len(_charge_requests(shop)) == 1
    # At least one: the gateway refuses a refund of what is already refunded, an answer
    # the call does not classify as definite, so the undo may send it again before the
    # test stops its worker (nothing moves; the first request is the defect).
    assert len(our_refund_requests(shop)) >= 1, "the click's undo refunded it again"
