"""``cancel --payments-handled`` of an execution whose charge declared no undo: the
operator's word covers every payment of it, not only those with an undo
(``core.handled_steps``: one rule), so the charge is claimed as a declared one is — never
replayed as paid to a later click on the same order (goods shipped on a charge refunded
by hand). Real worker, both stores, counted at the fake gateway.

A waiting order charged the card under the order's business key and declared no undo.
The operator refunds it by hand and cancels with ``--payments-handled``: ``CANCELLED`` at
once; a later click on the same order is told the charge was claimed, not undone, and is
handed nothing. Twin ``payments-handled-skips-undeclared-charges`` (only steps with a
declared undo are claimed): the later click replays the refunded charge as paid. While a
later click that was handed the charge still waits, the cancel is refused naming it, as
for a charge with a declared undo.
"""

from __future__ import annotations

from typing import Any

from celery_agboss.core.protections import PAYMENTS_HANDLED_SKIPS_UNDECLARED_CHARGES
from celery_agboss.testing import sabotage
from tests.delivery.conftest import PaymentShop
from tests.delivery.wallet_orders import our_refund_requests
from tests.operations.handled_orders import (
    card_step_that_waits,
    handled_at_once,
    placed_with_a_click,
    refused_naming,
)


def _order_without_an_undo(shop: PaymentShop) -> Any:
    """``pay_by_card(customer)``: charges the card (no undo declared), then waits an hour."""
    return card_step_that_waits(shop, name="pay_by_card")


def test_payments_handled_claims_a_charge_that_declared_no_undo(shop: PaymentShop) -> None:
    task_id, told = handled_at_once(shop, _order_without_an_undo(shop))
    assert [(t.undone, t.undo_by) for t in told] == [(False, task_id)]
    assert len(shop.gateway.payments) == 1 and len(shop.gateway.refunds) == 1
    assert our_refund_requests(shop) == []


def test_twin_payments_handled_skips_an_undeclared_charge_and_replays_it_as_paid(
    shop: PaymentShop,
) -> None:
    with sabotage(PAYMENTS_HANDLED_SKIPS_UNDECLARED_CHARGES):
        _, told = handled_at_once(shop, _order_without_an_undo(shop))
    assert told == [], "the later click was handed the charge refunded by hand as paid"
    assert len(shop.gateway.payments) == 1 and len(shop.gateway.refunds) == 1


def test_payments_handled_of_an_undeclared_charge_is_refused_while_a_click_uses_it(
    shop: PaymentShop,
) -> None:
    pay = _order_without_an_undo(shop)
    task_id, click_id = placed_with_a_click(shop, pay, card_step_that_waits(shop))
    kept = refused_naming(shop, task_id, click_id)
    assert kept.state.value == "WAITING" and not kept.cancel_requested, "nothing written"
