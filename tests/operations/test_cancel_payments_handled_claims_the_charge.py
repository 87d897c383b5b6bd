"""After ``cancel --payments-handled`` the charge the operator dealt with reads one way,
whichever path the cancel took: claimed for the cancelled execution's undo, never read
undone and never replayed as paid (docs/undo.md: a new attempt is a person's to start;
the store cannot tell a refund by hand from a charge kept). Real workers on both stores,
counted in the app's own ledger and at the fake gateway.

- A waiting order that debited the wallet and charged the card (undo: a refund); a later
  click on the same order relied on the charge and waits too. The operator refunds by
  hand; ``--payments-handled`` of the order is refused naming the click (a claim would
  not stop it: re-delivered, it would be handed the refunded charge as paid), nothing
  written. Twin ``payments-handled-while-another-uses``: accepted, and the click,
  re-delivered, completes on the refunded charge. The operator ends the click first
  (``--payments-handled``), then the order: the wallet is credited back once,
  ``CANCELLED``, and a new click is told the charge was claimed, not undone.
- A click that came after the cancel was accepted (played by switching the refusal off):
  the refund is never run, so nothing waits for the click: the wallet is credited back
  once. (No twin: the charge is claimed at acceptance, so the compensating delivery
  finds it claimed by itself and never waits; ``test_payments_handled_claim_is_the_decision``
  proves the claim at acceptance.)
- Contention while the cancel claims a charge is refused (``conflict``), nothing written,
  never a signal escaping the operator's verb.
- A waiting order that only charged the card (undo: a refund) ends ``CANCELLED`` at once;
  a later click is told the charge was claimed, and nothing is charged. Twin
  ``payments-handled-step-unclaimed``: the later click replays the charge the operator
  refunded as paid, and completes.
"""

from __future__ import annotations

from contextlib import suppress
from typing import Any

import pytest

from celery_agboss.core import handled_steps
from celery_agboss.core.executions import ExecutionRecord
from celery_agboss.core.protections import (
    PAYMENTS_HANDLED_STEP_UNCLAIMED,
    PAYMENTS_HANDLED_WHILE_ANOTHER_USES,
)
from celery_agboss.errors import OperatorRefusedError
from celery_agboss.operator import cancel
from celery_agboss.testing import sabotage
from tests.delivery.conftest import PaymentShop
from tests.delivery.wallet_orders import (
    HANDLED,
    click_again,
    credited_back_once,
    ended_after_a_sweep,
    our_refund_requests,
    placed_and_waiting,
    refund_by_hand,
    released,
    wallet_and_card_order,
)
from tests.operations import handled_orders
from tests.operations.handled_orders import (
    card_only_order,
    card_step_that_waits,
    delivered_again,
    handled_at_once,
    refused_naming,
)
from tests.support.processes import wait_until

_short_wait_for_a_claimed_undo = handled_orders.short_wait_for_a_claimed_undo


def _refused_while_a_click_waits(shop: PaymentShop) -> tuple[str, str, list[Any]]:
    """The order waits, a later click on it waits; the operator refunds the card by hand
    and cancels the order with ``--payments-handled``: refused naming the click, nothing
    written. Then the operator ends the click first, and cancels the order again; the
    sweep re-drives it. Its id, the click's, and the credits made."""
    pay, credited = wallet_and_card_order(shop)
    click = card_step_that_waits(shop)
    with shop.worker():
        task_id = placed_and_waiting(shop, pay)
        click_id = placed_and_waiting(shop, click)
        refund_by_hand(shop)
        kept = refused_naming(shop, task_id, click_id)
        assert kept.state.value == "WAITING" and not kept.cancel_requested, "nothing written"
        assert cancel(shop.app, click_id, HANDLED, payments_handled=True).state.value == (
            "CANCELLED"
        )
        assert cancel(shop.app, task_id, HANDLED, payments_handled=True).state.value == (
            "COMPENSATING"
        )
        ended = ended_after_a_sweep(shop, task_id)
        released(shop, task_id)
    assert ended.state.value == "CANCELLED", ended.reason
    return task_id, click_id, credited


def test_payments_handled_refused_while_a_later_click_uses_the_charge(shop: PaymentShop) -> None:
    task_id, _, credited = _refused_while_a_click_waits(shop)
    credited_back_once(shop, credited, "cancel")
    (told,) = click_again(shop)
    assert told.undone is False and told.undo_by == task_id, str(told)
    assert len(shop.gateway.payments) == 1 and len(shop.gateway.refunds) == 1
    assert our_refund_requests(shop) == []


def test_twin_payments_handled_while_a_click_waits_ships_on_the_refund(
    shop: PaymentShop,
) -> None:
    pay, _ = wallet_and_card_order(shop)
    shipped: list[Any] = []
    click = card_step_that_waits(shop, shipped)
    with shop.worker(), sabotage(PAYMENTS_HANDLED_WHILE_ANOTHER_USES):
        task_id = placed_and_waiting(shop, pay)
        click_id = placed_and_waiting(shop, click)
        refund_by_hand(shop)
        cancel(shop.app, task_id, HANDLED, payments_handled=True)  # accepted
        ended_after_a_sweep(shop, task_id)
        delivered_again(shop, click, click_id)
    assert shop.execution(click_id).state.value == "COMPLETED"
    assert len(shipped) == 1, "shipped on the charge the operator refunded by hand"
    assert len(shop.gateway.payments) == 1 and len(shop.gateway.refunds) == 1


def test_payments_handled_claim_contention_is_refused(shop: PaymentShop) -> None:
    """Contention while the cancel claims: ``conflict``, nothing written, never a signal."""
    pay = card_only_order(shop)
    with shop.worker():
        task_id = placed_and_waiting(shop, pay)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(handled_steps, "HANDLED_CLAIM_ROUNDS", 0)
        with pytest.raises(OperatorRefusedError) as refused:
            cancel(shop.app, task_id, HANDLED, payments_handled=True)
    assert refused.value.code == "conflict"
    kept = shop.execution(task_id)
    assert kept.state.value == "WAITING" and not kept.cancel_requested, "nothing written"


# --- a click that came after the cancel was accepted --------------------------------------


def _handled_while_a_click_waits(shop: PaymentShop) -> tuple[str, ExecutionRecord, list[Any]]:
    """The order waits, a later click on it waits (as if it came after the cancel was
    accepted: the refusal is switched off); the operator refunds the card by hand and
    cancels the order with ``--payments-handled``; the sweep re-drives it. Its id, the
    record it is in once its credit ran (or 10 s later), and the credits made."""
    pay, credited = wallet_and_card_order(shop)
    click = card_step_that_waits(shop)
    with shop.worker(), sabotage(PAYMENTS_HANDLED_WHILE_ANOTHER_USES):
        task_id = placed_and_waiting(shop, pay)
        placed_and_waiting(shop, click)
        refund_by_hand(shop)
        moved = cancel(shop.app, task_id, HANDLED, payments_handled=True)
        assert moved.state.value == "COMPENSATING", "the credit runs before the cancel ends"
        shop.sweep()
        with suppress(AssertionError):  # still waiting for the click: the caller judges
            wait_until(lambda: shop.execution(task_id).state.value != "COMPENSATING", 10)
        ended = shop.execution(task_id)
        released(shop, task_id)
    assert len(shop.gateway.payments) == 1 and our_refund_requests(shop) == []
    return task_id, ended, credited


def test_payments_handled_charge_never_waits_for_a_later_click(shop: PaymentShop) -> None:
    _, ended, credited = _handled_while_a_click_waits(shop)
    assert ended.state.value == "CANCELLED", ended.reason
    credited_back_once(shop, credited, "cancel")


# --- no fenced effect left: the cancel ends at once -------------------------------------------


def test_payments_handled_cancel_at_once_leaves_the_charge_claimed(shop: PaymentShop) -> None:
    task_id, told = handled_at_once(shop, card_only_order(shop))
    assert [(t.undone, t.undo_by) for t in told] == [(False, task_id)]
    assert len(shop.gateway.payments) == 1 and our_refund_requests(shop) == []


def test_twin_payments_handled_cancel_at_once_replays_the_refunded_charge(
    shop: PaymentShop,
) -> None:
    with sabotage(PAYMENTS_HANDLED_STEP_UNCLAIMED):
        _, told = handled_at_once(shop, card_only_order(shop))
    assert told == [], "the later click was handed the refunded charge as paid"
    assert len(shop.gateway.payments) == 1 and len(shop.gateway.refunds) == 1
