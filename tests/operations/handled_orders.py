"""The orders the operator's "payments handled" tests share (the cancel and the verb):
an order that charged the card with no undo and failed, a click that relied on its
charge, a new click on the same order that ships on what it is handed; and the steps
they repeat (placed and refunded by hand, a refusal naming who still uses the charge, a
re-delivery). Built on ``tests.delivery.wallet_orders`` (the wallet's credit-back checked
there), so that each test file reads as its scenario."""

from __future__ import annotations

from typing import Any

import pytest

from celery_agboss import OutboundCallCompensatedError
from celery_agboss.core import state_machine
from celery_agboss.core.executions import ExecutionRecord
from celery_agboss.errors import OperatorRefusedError
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
    released,
)


@pytest.fixture(autouse=True)
def short_wait_for_a_claimed_undo(monkeypatch: pytest.MonkeyPatch) -> None:
    """A click that meets a claimed step waits for its undo (5 s deployed); it never comes.
    Autouse in a test module that binds it to a name of its own."""
    monkeypatch.setattr(state_machine, "COMPENSATION_WAIT_S", 0.05)


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


NEW_CLICK_ENDS = ("COMPLETED", "FAILED", "WAITING_OPERATOR", "CANCELLED", "WAITING", "COMPENSATING")
"""Where a new click on the order may stop: it is judged by what it was told."""

_REDELIVERED_ENDS = ("COMPLETED", "FAILED", "WAITING_OPERATOR", "CANCELLED")


def card_step_that_waits(
    shop: PaymentShop, shipped: list[Any] | None = None, *, name: str = "click_and_wait"
) -> Any:
    """``<name>(customer)``: the order's card step (no undo declared; a later click is
    handed the charge), then a wait of an hour. Delivered again with ``shipped``, it ships
    on the charge it is handed; without, it waits again. ``name``: a test's tasks each
    need their own."""
    charge = shop.call()

    def card_then_wait(self: Any, customer: str) -> Any:
        receipt = charge_the_card(self, charge, customer)
        if shipped is None or self.request.retries == 0:
            raise self.retry(countdown=3600)
        shipped.append(receipt)
        return receipt

    card_then_wait.__name__ = name  # ``shop.task`` names the task after the function
    return shop.task()(card_then_wait)


def relying_click(shop: PaymentShop, *, waits: bool) -> Any:
    """``click(customer)``: the order's card step (handed the charge, no undo declared),
    then it waits an hour (``waits``) or fails."""
    if waits:
        return card_step_that_waits(shop)
    charge = shop.call()

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

    shop.run(new_click, CUSTOMER, states=NEW_CLICK_ENDS)
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


def card_only_order(shop: PaymentShop, *, name: str = "pay_by_card") -> Any:
    """``<name>(customer)``: charges the card (undo: a refund), then waits an hour."""
    charge = shop.call()
    refund_charge_undo(shop, shop.refund_call())

    def pay_by_card(self: Any, customer: str) -> Any:
        receipt = charge_the_card(self, charge, customer)
        self.undo_with("refund-charge", payment=receipt["id"])
        raise self.retry(countdown=3600)

    pay_by_card.__name__ = name  # ``shop.task`` names the task after the function
    return shop.task()(pay_by_card)


def waiting_and_refunded_by_hand(shop: PaymentShop, pay: Any) -> str:
    """``pay`` placed and waiting, its charge refunded by hand. Its id."""
    with shop.worker():
        task_id = placed_and_waiting(shop, pay)
    refund_by_hand(shop)
    return task_id


def handled_then_clicked(shop: PaymentShop, pay: Any, *, moved_to: str) -> tuple[str, list[Any]]:
    """``pay`` waits; refunded by hand, ``--payments-handled`` moves it to ``moved_to``; a
    later click on the same order. Its id and what the click was told."""
    task_id = waiting_and_refunded_by_hand(shop, pay)
    moved = cancel(shop.app, task_id, HANDLED, payments_handled=True)
    assert moved.state.value == moved_to, moved.reason
    return task_id, click_again(shop)


def handled_at_once(shop: PaymentShop, pay: Any) -> tuple[str, list[Any]]:
    """``handled_then_clicked``, the cancel ending ``pay`` at once (``CANCELLED``)."""
    return handled_then_clicked(shop, pay, moved_to="CANCELLED")


def placed_with_a_click(shop: PaymentShop, pay: Any, click: Any) -> tuple[str, str]:
    """``pay`` and a later ``click`` on the same order placed and waiting, then the card
    refunded by hand: their ids."""
    with shop.worker():
        task_id = placed_and_waiting(shop, pay)
        click_id = placed_and_waiting(shop, click)
    refund_by_hand(shop)
    return task_id, click_id


def failed_then_a_click_waits(
    shop: PaymentShop, shipped: list[Any] | None = None
) -> tuple[str, str, Any]:
    """The order failed after its charge; a later click on it replayed the charge and waits
    an hour (``card_step_that_waits``, shipping into ``shipped``); the operator refunds the
    card by hand. The order's id, the click's, and the click's task."""
    task_id = failed_after_a_charge(shop)
    click = card_step_that_waits(shop, shipped)
    with shop.worker():
        click_id = placed_and_waiting(shop, click)
    refund_by_hand(shop)
    return task_id, click_id, click


def refused_naming(
    shop: PaymentShop, execution_id: str, other: str, *, verb: bool = False, reason: str = HANDLED
) -> ExecutionRecord:
    """The operator's word on ``execution_id`` (``cancel --payments-handled``; ``verb``:
    ``payments-handled``) is refused ``wrong-state``, naming ``other``. The record after."""
    with pytest.raises(OperatorRefusedError) as refused:
        if verb:
            payments_handled(shop.app, execution_id, reason)
        else:
            cancel(shop.app, execution_id, reason, payments_handled=True)
    assert refused.value.code == "wrong-state" and other in str(refused.value)
    return shop.execution(execution_id)


def delivered_again(shop: PaymentShop, task: Any, task_id: str, *states: str) -> ExecutionRecord:
    """``task_id`` delivered again as its retry (a worker running) until it reaches one of
    ``states`` (default: any end), its lease then released: the record it reached."""
    task.apply_async((CUSTOMER,), task_id=task_id, retries=1)
    ended = shop.wait_state(task_id, *(states or _REDELIVERED_ENDS))
    released(shop, task_id)
    return ended
