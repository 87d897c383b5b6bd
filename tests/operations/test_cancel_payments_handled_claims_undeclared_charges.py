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

import pytest

from celery_agboss.core.protections import PAYMENTS_HANDLED_SKIPS_UNDECLARED_CHARGES
from celery_agboss.errors import OperatorRefusedError
from celery_agboss.operator import cancel
from celery_agboss.testing import sabotage
from tests.delivery import conftest as delivery
from tests.delivery.conftest import PaymentShop
from tests.delivery.wallet_orders import (
    HANDLED,
    charge_the_card,
    our_refund_requests,
    placed_and_waiting,
    refund_by_hand,
)
from tests.operations.handled_orders import handled_at_once

delivery_store_url = delivery.delivery_store_url
shop_config = delivery.shop_config
shop = delivery.shop


def _order_without_an_undo(shop: PaymentShop) -> Any:
    """``pay_by_card(customer)``: charges the card (no undo declared), then waits an hour."""
    charge = shop.call()

    @shop.task()
    def pay_by_card(self: Any, customer: str) -> Any:
        charge_the_card(self, charge, customer)
        raise self.retry(countdown=3600)

    return pay_by_card


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
    pay, charge = _order_without_an_undo(shop), shop.call()

    @shop.task()
    def click_and_wait(self: Any, customer: str) -> Any:
        charge_the_card(self, charge, customer)
        raise self.retry(countdown=3600)

    with shop.worker():
        task_id = placed_and_waiting(shop, pay)
        click_id = placed_and_waiting(shop, click_and_wait)
    refund_by_hand(shop)
    with pytest.raises(OperatorRefusedError) as refused:
        cancel(shop.app, task_id, HANDLED, payments_handled=True)
    assert refused.value.code == "wrong-state" and click_id in str(refused.value)
    kept = shop.execution(task_id)
    assert kept.state.value == "WAITING" and not kept.cancel_requested, "nothing written"
