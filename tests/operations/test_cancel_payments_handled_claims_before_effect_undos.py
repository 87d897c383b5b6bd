"""``cancel --payments-handled`` of an execution whose fenced effects' undos still run
(``COMPENSATING``: the wallet's credit-back) claims its charge at once, not once those
ran: a later click on the same order in between is told the charge was claimed, never
handed the charge the operator refunded by hand as paid (goods shipped on a refund).
Real worker, both stores, counted at the fake gateway.

A waiting order debited the wallet and charged the card (undo: a refund). The operator
refunds it by hand and cancels with ``--payments-handled``: ``COMPENSATING``; before the
sweep re-drives it, a later click on the same order. Twin
``payments-handled-claimed-after-undos``: the click replays the refunded charge as paid.
"""

from __future__ import annotations

from typing import Any

from celery_agboss.core.protections import PAYMENTS_HANDLED_CLAIMED_AFTER_UNDOS
from celery_agboss.testing import sabotage
from tests.delivery.conftest import PaymentShop
from tests.delivery.wallet_orders import our_refund_requests, wallet_and_card_order
from tests.operations.handled_orders import handled_then_clicked


def _clicked_while_compensating(shop: PaymentShop) -> tuple[str, list[Any]]:
    """The order waits; refunded by hand, ``--payments-handled`` moves it to
    ``COMPENSATING``; a later click before its credit-back runs. Its id, what the click
    was told."""
    pay, _ = wallet_and_card_order(shop)
    return handled_then_clicked(shop, pay, moved_to="COMPENSATING")


def test_payments_handled_claims_the_charge_before_the_effect_undos_run(
    shop: PaymentShop,
) -> None:
    task_id, told = _clicked_while_compensating(shop)
    assert [(t.undone, t.undo_by) for t in told] == [(False, task_id)]
    assert len(shop.gateway.payments) == 1 and len(shop.gateway.refunds) == 1
    assert our_refund_requests(shop) == []


def test_twin_payments_handled_claimed_after_undos_hands_the_refunded_charge_out(
    shop: PaymentShop,
) -> None:
    with sabotage(PAYMENTS_HANDLED_CLAIMED_AFTER_UNDOS):
        _, told = _clicked_while_compensating(shop)
    assert told == [], "the later click was handed the charge refunded by hand as paid"
    assert len(shop.gateway.payments) == 1 and len(shop.gateway.refunds) == 1
