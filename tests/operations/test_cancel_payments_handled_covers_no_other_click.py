"""A charge claimed by ``cancel --payments-handled`` covers no other execution's undos of
it: the claimer never runs them, and what the operator did at the gateway is not in the
store (a refund by hand, or the charge kept on purpose), so a later click that relied on
the charge and then failed owes its own and a person decides (``NOT_COVERED``) — never
``COVERED`` by an undo nobody runs (design: cancel request, operator decisions). Real
worker, both stores, counted at the fake gateway.

A waiting order charged the card (undo: a refund). A later click on the same order was
handed the charge and waits (as if it came after the cancel was accepted: the refusal is
switched off). The operator keeps the charge (the click is to ship on it) and cancels the
order with ``--payments-handled``: it claims the charge. The click, delivered again,
runs out of stock and fails:

- it declared the same refund: it waits for an operator, told the claimer's undos of the
  step were dealt with by a person. Twin ``handled-claimer-covers``: ``FAILED``, no refund
  sent and nothing listed — the customer charged for goods never shipped, nobody told;
- it declared none: ``agboss pending`` lists it as failed after a payment. Twin: not
  listed.
"""

from __future__ import annotations

from typing import Any

from celery_agboss.core.executions import ExecutionRecord
from celery_agboss.core.protections import (
    HANDLED_CLAIMER_COVERS,
    PAYMENTS_HANDLED_WHILE_ANOTHER_USES,
)
from celery_agboss.operator import cancel, list_failed_after_payment
from celery_agboss.testing import sabotage
from tests.delivery.conftest import PaymentShop, assert_waits_for_an_operator
from tests.delivery.wallet_orders import charge_the_card, placed_and_waiting
from tests.operations import handled_orders
from tests.operations.handled_orders import card_only_order, delivered_again

KEPT = "kept the charge at the gateway: the later click ships the order on it"

_short_wait_for_a_claimed_undo = handled_orders.short_wait_for_a_claimed_undo


def _orders(shop: PaymentShop, *, click_undoes: bool) -> tuple[Any, Any]:
    """``pay_by_card(customer)``: charges the card (undo: a refund), then waits an hour.
    ``click(customer)``: the same order's card step (handed the charge), its refund declared
    if ``click_undoes``; waits an hour, then, delivered again, runs out of stock."""
    pay_by_card, charge = card_only_order(shop), shop.call()

    @shop.task()
    def click(self: Any, customer: str) -> Any:
        receipt = charge_the_card(self, charge, customer)
        if click_undoes:
            self.undo_with("refund-charge", payment=receipt["id"])
        if self.request.retries == 0:
            raise self.retry(countdown=3600)
        raise LookupError("out of stock")

    return pay_by_card, click


def _click_fails_after_a_handled_claim(shop: PaymentShop, *, click_undoes: bool) -> str:
    """The order and the click wait; the operator keeps the charge and cancels the order
    with ``--payments-handled`` (it claims the charge); the click is delivered again and
    fails. The click's id."""
    pay, click = _orders(shop, click_undoes=click_undoes)
    with shop.worker():
        task_id = placed_and_waiting(shop, pay)
        click_id = placed_and_waiting(shop, click)
        with sabotage(PAYMENTS_HANDLED_WHILE_ANOTHER_USES):  # the click came after it
            ended = cancel(shop.app, task_id, KEPT, payments_handled=True)
        assert ended.state.value == "CANCELLED", ended.reason
        delivered_again(shop, click, click_id)
    assert len(shop.gateway.payments) == 1 and shop.gateway.refunds == []
    return click_id


def _listed(shop: PaymentShop) -> list[str]:
    return [left.execution.id for left in list_failed_after_payment(shop.app)]


def test_a_click_that_declared_a_refund_waits_for_an_operator(shop: PaymentShop) -> None:
    click_id = _click_fails_after_a_handled_claim(shop, click_undoes=True)
    waiting: ExecutionRecord = shop.execution(click_id)
    assert_waits_for_an_operator(waiting, "", "dealt with by a person")
    assert "refund-charge" in str(waiting.reason), waiting.reason


def _failed_unlisted_under_the_twin(shop: PaymentShop, *, click_undoes: bool) -> None:
    """Twin ``handled-claimer-covers``: the click ends ``FAILED`` and nobody is told."""
    with sabotage(HANDLED_CLAIMER_COVERS):
        click_id = _click_fails_after_a_handled_claim(shop, click_undoes=click_undoes)
        listed = _listed(shop)
    assert shop.execution(click_id).state.value == "FAILED"
    assert click_id not in listed, "charged, nothing shipped, nobody told"


def test_twin_handled_claimer_covers_the_click_and_nobody_refunds(shop: PaymentShop) -> None:
    _failed_unlisted_under_the_twin(shop, click_undoes=True)


def test_a_click_that_declared_no_undo_is_listed_as_failed_after_a_payment(
    shop: PaymentShop,
) -> None:
    click_id = _click_fails_after_a_handled_claim(shop, click_undoes=False)
    assert shop.execution(click_id).state.value == "FAILED"
    assert click_id in _listed(shop)


def test_twin_handled_claimer_covers_a_click_without_an_undo_unlisted(shop: PaymentShop) -> None:
    _failed_unlisted_under_the_twin(shop, click_undoes=False)
