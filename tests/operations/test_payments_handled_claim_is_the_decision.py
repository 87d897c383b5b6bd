"""The claim an operator's word makes at acceptance (``cancel --payments-handled``, or
``agboss payments-handled``) is the one decision about another live user of the charge:
a click that relied on the charge after the acceptance's checks and before its claim is
met by the claim itself (its compare-and-set, or its read), which refuses
(``wrong-state``, the click named, nothing written) — never claims over it
(design: cancel request, operator decisions). PostgreSQL only: there the click's replay commits
while the operator's transaction is open; SQLite runs one writer at a time.

The window is placed deterministically: the acceptance's checks (``refuse_handled_txn``)
run, then a click on the same order replays the charge and waits, then the claim runs.

- ``cancel --payments-handled`` of a waiting card-only order, refunded by hand: refused
  naming the click, the order still waiting, no cancel requested. Twin
  ``payments-handled-while-another-uses``: accepted, and the click, re-delivered, ships on
  the charge the operator refunded by hand.
- ``payments-handled`` of an order that failed after its charge: the same, the order's
  flag not set.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from celery_agboss.core.protections import PAYMENTS_HANDLED_WHILE_ANOTHER_USES
from celery_agboss.errors import OperatorRefusedError
from celery_agboss.operator import cancel, payments_handled
from celery_agboss.store import cancels, execution_admin
from celery_agboss.testing import sabotage
from tests.delivery.conftest import PaymentShop
from tests.delivery.wallet_orders import HANDLED, placed_and_waiting, refund_by_hand
from tests.operations.handled_orders import (
    card_only_order,
    card_step_that_waits,
    delivered_again,
    failed_after_a_charge,
    waiting_and_refunded_by_hand,
)


@pytest.fixture(autouse=True)
def _postgresql_only(delivery_store_url: str) -> None:
    if not delivery_store_url.startswith("postgresql"):
        pytest.skip("a replay committing inside the operator's transaction: PostgreSQL")


def _click(shop: PaymentShop, shipped: list[Any]) -> Any:
    """``click(customer)``: the same order's card step (handed the charge); waits an hour,
    then, delivered again, ships on what it was handed (``shipped``)."""
    return card_step_that_waits(shop, shipped, name="click")


@pytest.fixture
def click_in_the_window(
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Callable[[PaymentShop, Any], list[str]]]:
    """Arms both acceptances: their checks run, then the click is placed (and waits)
    before their claim. The ids of the clicks placed."""
    placed: list[str] = []

    def arm(shop: PaymentShop, click: Any) -> list[str]:
        for module in (cancels, execution_admin):
            real = module.refuse_handled_txn

            def checked_then_clicked(tx: Any, execution_id: str, real: Any = real) -> None:
                real(tx, execution_id)
                placed.append(placed_and_waiting(shop, click))

            monkeypatch.setattr(module, "refuse_handled_txn", checked_then_clicked)
        return placed

    yield arm


def _redelivered(shop: PaymentShop, click: Any, click_id: str) -> str:
    with shop.worker():
        return delivered_again(shop, click, click_id).state.value


def test_cancel_refused_when_a_click_relies_between_check_and_claim(
    shop: PaymentShop, click_in_the_window: Callable[[PaymentShop, Any], list[str]]
) -> None:
    task_id = waiting_and_refunded_by_hand(shop, card_only_order(shop))
    placed = click_in_the_window(shop, _click(shop, []))
    with shop.worker(), pytest.raises(OperatorRefusedError) as refused:
        cancel(shop.app, task_id, HANDLED, payments_handled=True)
    (click_id,) = placed
    assert refused.value.code == "wrong-state" and click_id in str(refused.value)
    kept = shop.execution(task_id)
    assert kept.state.value == "WAITING" and not kept.cancel_requested, "nothing written"
    assert kept.payments_handled_at_ms is None


def test_twin_cancel_accepted_in_the_window_ships_on_the_refund(
    shop: PaymentShop, click_in_the_window: Callable[[PaymentShop, Any], list[str]]
) -> None:
    task_id, shipped = waiting_and_refunded_by_hand(shop, card_only_order(shop)), []
    click = _click(shop, shipped)
    placed = click_in_the_window(shop, click)
    with shop.worker(), sabotage(PAYMENTS_HANDLED_WHILE_ANOTHER_USES):
        ended = cancel(shop.app, task_id, HANDLED, payments_handled=True)
    assert ended.state.value == "CANCELLED", ended.reason
    assert _redelivered(shop, click, placed[0]) == "COMPLETED"
    assert len(shipped) == 1, "shipped on the charge the operator refunded by hand"
    assert len(shop.gateway.payments) == 1 and len(shop.gateway.refunds) == 1


def test_verb_refused_when_a_click_relies_between_check_and_claim(
    shop: PaymentShop, click_in_the_window: Callable[[PaymentShop, Any], list[str]]
) -> None:
    task_id = failed_after_a_charge(shop)
    refund_by_hand(shop)
    placed = click_in_the_window(shop, _click(shop, []))
    with shop.worker(), pytest.raises(OperatorRefusedError) as refused:
        payments_handled(shop.app, task_id, HANDLED)
    (click_id,) = placed
    assert refused.value.code == "wrong-state" and click_id in str(refused.value)
    kept = shop.execution(task_id)
    assert kept.state.value == "FAILED" and kept.payments_handled_at_ms is None


def test_twin_verb_accepted_in_the_window_ships_on_the_refund(
    shop: PaymentShop, click_in_the_window: Callable[[PaymentShop, Any], list[str]]
) -> None:
    task_id, shipped = failed_after_a_charge(shop), []
    refund_by_hand(shop)
    click = _click(shop, shipped)
    placed = click_in_the_window(shop, click)
    with shop.worker(), sabotage(PAYMENTS_HANDLED_WHILE_ANOTHER_USES):
        payments_handled(shop.app, task_id, HANDLED)  # accepted
    assert _redelivered(shop, click, placed[0]) == "COMPLETED"
    assert len(shipped) == 1, "shipped on the charge the operator refunded by hand"
    assert len(shop.gateway.payments) == 1 and len(shop.gateway.refunds) == 1
