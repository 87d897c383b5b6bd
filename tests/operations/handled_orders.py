"""The orders the operator's "payments handled" tests share (the cancel and the verb):
an order that charged the card with no undo and failed, a click that relied on its
charge, a new click on the same order that ships on what it is handed. Built on
``tests.delivery.wallet_orders``, so that each test file reads as its scenario."""

from __future__ import annotations

from typing import Any

from celery_agboss import OutboundCallCompensatedError
from celery_agboss.operator import cancel, list_failed_after_payment, payments_handled
from tests.delivery.conftest import PaymentShop
from tests.delivery.wallet_orders import (
    CUSTOMER,
    HANDLED,
    charge_the_card,
    click_again,
    placed_and_waiting,
    refund_by_hand,
    refund_charge_undo,
)


def failed_after_a_charge(shop: PaymentShop) -> str:
    """``pay_then_fail(customer)`` charged the card (no undo declared) and failed: listed
    as "failed after a payment". Its id."""
    charge = shop.call()

    @shop.task()
    def pay_then_fail(self: Any, customer: str) -> Any:
        charge_the_card(self, charge, customer)
        raise LookupError("out of stock")

    task_id = shop.run(pay_then_fail, CUSTOMER, states=("FAILED",))
    assert [left.execution.id for left in list_failed_after_payment(shop.app)] == [task_id]
    return task_id


_ENDS = ("COMPLETED", "FAILED", "WAITING_OPERATOR", "CANCELLED", "WAITING", "COMPENSATING")


def relying_click(shop: PaymentShop, *, waits: bool) -> Any:
    """``click(customer)``: the order's card step (handed the charge, no undo declared),
    then it waits an hour (``waits``) or fails."""
    charge = shop.call()
    if waits:

        @shop.task()
        def click_and_wait(self: Any, customer: str) -> Any:
            charge_the_card(self, charge, customer)
            raise self.retry(countdown=3600)

        return click_and_wait

    @shop.task()
    def click_and_fail(self: Any, customer: str) -> Any:
        charge_the_card(self, charge, customer)
        raise LookupError("out of stock")

    return click_and_fail


def a_new_click(shop: PaymentShop) -> tuple[list[Any], list[Any]]:
    """A new click on the same order ships on what it is handed: what it was told, and
    what it shipped on."""
    charge, told, shipped = shop.call(), [], []

    @shop.task()
    def new_click(self: Any, customer: str) -> Any:
        try:
            shipped.append(charge_the_card(self, charge, customer))
        except OutboundCallCompensatedError as exc:
            told.append(exc)

    shop.run(new_click, CUSTOMER, states=_ENDS)
    return told, shipped


def verb_on_a_relying_click(shop: PaymentShop) -> tuple[str, list[Any], list[Any]]:
    failed_after_a_charge(shop)
    click_id = shop.run(relying_click(shop, waits=False), CUSTOMER, states=("FAILED",))
    refund_by_hand(shop)
    payments_handled(shop.app, click_id, HANDLED)
    return click_id, *a_new_click(shop)


def cancel_of_a_relying_click(shop: PaymentShop) -> tuple[str, list[Any], list[Any]]:
    failed_after_a_charge(shop)
    with shop.worker():
        click_id = placed_and_waiting(shop, relying_click(shop, waits=True))
    refund_by_hand(shop)
    ended = cancel(shop.app, click_id, HANDLED, payments_handled=True)
    assert ended.state.value == "CANCELLED", ended.reason
    return click_id, *a_new_click(shop)


def card_only_order(shop: PaymentShop) -> Any:
    """``pay_by_card(customer)``: charges the card (undo: a refund), then waits an hour."""
    charge = shop.call()
    refund_charge_undo(shop, shop.refund_call())

    @shop.task()
    def pay_by_card(self: Any, customer: str) -> Any:
        receipt = charge_the_card(self, charge, customer)
        self.undo_with("refund-charge", payment=receipt["id"])
        raise self.retry(countdown=3600)

    return pay_by_card


def waiting_and_refunded_by_hand(shop: PaymentShop, pay: Any) -> str:
    """``pay`` placed and waiting, its charge refunded by hand. Its id."""
    with shop.worker():
        task_id = placed_and_waiting(shop, pay)
    refund_by_hand(shop)
    return task_id


def handled_at_once(shop: PaymentShop, pay: Any) -> tuple[str, list[Any]]:
    """``pay`` waits; refunded by hand, ``--payments-handled`` ends it at once; a later
    click on the same order. Its id and what the click was told."""
    task_id = waiting_and_refunded_by_hand(shop, pay)
    ended = cancel(shop.app, task_id, HANDLED, payments_handled=True)
    assert ended.state.value == "CANCELLED", ended.reason
    return task_id, click_again(shop)
