"""``cancel --payments-handled`` says the operator dealt with the execution's PAYMENTS at
the gateway; it does not drop the undos of its fenced effects (docs/operators.md:
Cancelling). Real workers on both stores, counted in the app's own ledger (a wallet the
body debits with ``fenced_effect()``, whose undo credits it back) and at the fake gateway.

- A body that debited the wallet and charged the card (no undo: the operator refunds it
  by hand) waits for a long retry; ``cancel --payments-handled``: ``COMPENSATING``, the
  sweep re-drives it, the wallet is credited back once, then ``CANCELLED`` with the
  payments marked handled (no second confirmation asked, nothing refunded by us).
- Undos stopped part-way (the refund made, the wallet's credit refused while the ledger
  was down); ``cancel --payments-handled`` once the ledger is back: the credit runs, the
  refund is not made again, ``FAILED`` (the failure started them), payments handled.
- Both kinds left: the customer cancelled a waiting order, the gateway declined the
  refund (the credit not run), so it waits for an operator, who refunds the card by hand
  and cancels with ``--payments-handled``: the credit runs, no second refund request
  reaches the gateway, ``CANCELLED``; a later click on the card step is told it was
  claimed for undo, never that it was undone. Likewise after a failure (``FAILED``).

Twin ``payments-handled-skips-effect-undos`` (the confirmation ends the cancel whatever
is left): each ends ``CANCELLED`` at once, the debit kept, the credit never run. Twin
``payments-handled-runs-payment-undos`` (the compensating delivery ignores the operator's
word): the refund's undo runs again and a second refund request reaches the gateway.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from celery_agboss.core import state_machine
from celery_agboss.core.executions import ExecutionRecord
from celery_agboss.core.protections import (
    PAYMENTS_HANDLED_RUNS_PAYMENT_UNDOS,
    PAYMENTS_HANDLED_SKIPS_EFFECT_UNDOS,
)
from celery_agboss.operator import cancel, list_failed_after_payment
from celery_agboss.testing import sabotage
from celery_agboss.testing.gateway import FakeGatewayFault
from tests.delivery.conftest import PaymentShop, assert_waits_for_an_operator
from tests.delivery.wallet_orders import (
    CUSTOMER,
    HANDLED,
    OPENING_BALANCE,
    PRICE,
    balance,
    charge_the_card,
    click_again,
    credited_back_once,
    debit_kept,
    debit_the_wallet,
    ended_after_a_sweep,
    failing_wallet_and_card_order,
    our_refund_requests,
    placed_and_waiting,
    refund_by_hand,
    released,
    wallet_and_card_order,
    wallet_with_credit_undo,
)


def _handled_and_swept(
    shop: PaymentShop, task_id: str, reason: str = HANDLED
) -> tuple[str, ExecutionRecord]:
    """(A worker running.) ``cancel --payments-handled`` of ``task_id``, then the sweep
    re-drives it to its end: the state the cancel moved it to, and the record it ends with."""
    moved = cancel(shop.app, task_id, reason, payments_handled=True)
    return moved.state.value, ended_after_a_sweep(shop, task_id)


# --- a waiting execution -------------------------------------------------------------------


def _handled_cancel_of_a_waiting_debit(
    shop: PaymentShop,
) -> tuple[str, ExecutionRecord, list[Any]]:
    """The body debits the wallet (undo: credit it), charges the card (no undo), then waits
    an hour for a retry. The operator refunds the card by hand and cancels with
    ``--payments-handled``; the sweep runs. The state the cancel moved it to, the record it
    ends with, and the credits made."""
    _, credited = wallet_with_credit_undo(shop, ledger_up=True)
    charge = shop.call()

    @shop.task()
    def pay_from_wallet_and_card(self: Any, customer: str) -> Any:
        debit_the_wallet(self, customer)
        charge_the_card(self, charge, customer)
        raise self.retry(countdown=3600)  # waits in the store

    with shop.worker():
        task_id = placed_and_waiting(shop, pay_from_wallet_and_card)
        assert balance(shop) == OPENING_BALANCE - PRICE
        refund_by_hand(shop)
        moved, ended = _handled_and_swept(shop, task_id)
    assert len(shop.gateway.payments) == 1
    assert len(shop.gateway.refunds) == 1, "only the operator's refund: none sent by us"
    return moved, ended, credited


def test_payments_handled_cancel_still_credits_back_a_fenced_debit(shop: PaymentShop) -> None:
    moved, ended, credited = _handled_cancel_of_a_waiting_debit(shop)
    assert moved == "COMPENSATING", "the fenced effect's undo runs before the cancel ends"
    assert ended.state.value == "CANCELLED", ended.reason
    credited_back_once(shop, credited, "cancel")
    assert ended.payments_handled_at_ms is not None, "the operator's word is kept"
    assert ended.id not in [left.execution.id for left in list_failed_after_payment(shop.app)]


def test_twin_payments_handled_cancel_keeps_the_debit(shop: PaymentShop) -> None:
    with sabotage(PAYMENTS_HANDLED_SKIPS_EFFECT_UNDOS):
        moved, ended, credited = _handled_cancel_of_a_waiting_debit(shop)
    assert moved == ended.state.value == "CANCELLED"
    debit_kept(shop, credited)


# --- undos stopped part-way ----------------------------------------------------------------


def _failed_with_undos_left(
    shop: PaymentShop, *, refund_fails: bool
) -> tuple[str, threading.Event, list[Any]]:
    """The order fails and its undos run, last declared first. ``refund_fails``: the refund
    raises (the credit never runs); else the refund is made and the credit is refused (the
    ledger is down). It waits for a person either way. Its id, the ledger's switch, and
    the credits made."""
    pay_half_from_wallet, ledger_up, credited = failing_wallet_and_card_order(
        shop, refund_fails=refund_fails
    )
    task_id = shop.run(pay_half_from_wallet, CUSTOMER, states=("WAITING_OPERATOR",))
    released(shop, task_id)
    assert balance(shop) == OPENING_BALANCE - PRICE
    assert len(shop.gateway.refunds) == (0 if refund_fails else 1)
    return task_id, ledger_up, credited


def _handled_cancel_after_the_credit_failed(
    shop: PaymentShop,
) -> tuple[str, ExecutionRecord, list[Any]]:
    task_id, ledger_up, credited = _failed_with_undos_left(shop, refund_fails=False)
    ledger_up.set()
    with shop.worker():
        moved, ended = _handled_and_swept(shop, task_id, "the refund is made; close it")
    assert len(shop.gateway.payments) == 1
    assert len(shop.gateway.refunds) == 1, "the refund already made is not made again"
    return moved, ended, credited


def test_payments_handled_cancel_after_undos_stopped_runs_the_credit(shop: PaymentShop) -> None:
    moved, ended, credited = _handled_cancel_after_the_credit_failed(shop)
    assert moved == "COMPENSATING"
    assert ended.state.value == "FAILED", "its undos were started by the failure: they end it"
    credited_back_once(shop, credited, "failure")
    assert ended.payments_handled_at_ms is not None


def test_twin_payments_handled_cancel_after_undos_stopped_drops_the_credit(
    shop: PaymentShop,
) -> None:
    with sabotage(PAYMENTS_HANDLED_SKIPS_EFFECT_UNDOS):
        moved, ended, credited = _handled_cancel_after_the_credit_failed(shop)
    assert moved == ended.state.value == "CANCELLED"
    debit_kept(shop, credited)


# --- undos of both kinds left --------------------------------------------------------------


def _handled_after_a_declined_refund(shop: PaymentShop) -> tuple[str, ExecutionRecord, list[Any]]:
    """The order waits; the customer cancels: its undos run, last declared first, and the
    gateway declines the refund, so it waits for an operator with the wallet's credit not
    run. The operator refunds the card by hand and cancels with ``--payments-handled``;
    the sweep runs. Its id, the record it ends with, and the credits made."""
    pay, credited = wallet_and_card_order(shop)
    shop.gateway.inject_fault(FakeGatewayFault.DECLINE, operation="refund")
    with shop.worker():
        task_id = placed_and_waiting(shop, pay)
        assert cancel(shop.app, task_id, "the customer changed their mind").state.value == (
            "COMPENSATING"
        )
        declined = ended_after_a_sweep(shop, task_id)
        assert_waits_for_an_operator(declined, "undo refund-charge failed")
        released(shop, task_id)
        assert [r.outcome.value for r in our_refund_requests(shop)] == ["DECLINED"]
        refund_by_hand(shop)
        moved, ended = _handled_and_swept(shop, task_id)
        assert moved == "COMPENSATING", "the credit runs before the cancel ends"
    assert len(shop.gateway.payments) == 1
    return task_id, ended, credited


def test_payments_handled_cancel_after_a_declined_refund_credits_and_refunds_nothing(
    shop: PaymentShop, monkeypatch: pytest.MonkeyPatch
) -> None:
    task_id, ended, credited = _handled_after_a_declined_refund(shop)
    assert [r.outcome.value for r in our_refund_requests(shop)] == ["DECLINED"], (
        "the declined refund only: none sent after the operator's"
    )
    assert len(shop.gateway.refunds) == 1, "the operator's refund, by hand"
    assert ended.state.value == "CANCELLED", ended.reason
    credited_back_once(shop, credited, "cancel")
    assert ended.payments_handled_at_ms is not None
    assert task_id not in [left.execution.id for left in list_failed_after_payment(shop.app)]
    # The charge refunded by hand never reads undone: a later click is told it was
    # claimed for this execution's undo (a person decides), and pays nothing.
    monkeypatch.setattr(state_machine, "COMPENSATION_WAIT_S", 0.05)
    (told,) = click_again(shop)
    assert told.undone is False and told.undo_by == task_id, str(told)
    assert len(shop.gateway.payments) == 1


def test_twin_payments_handled_cancel_after_a_declined_refund_refunds_again(
    shop: PaymentShop,
) -> None:
    with sabotage(PAYMENTS_HANDLED_RUNS_PAYMENT_UNDOS):
        _, ended, credited = _handled_after_a_declined_refund(shop)
    outcomes = [r.outcome.value for r in our_refund_requests(shop)]
    assert len(outcomes) == 2, f"a second refund request after the operator's: {outcomes}"
    assert_waits_for_an_operator(ended, "undo refund-charge failed")
    debit_kept(shop, credited)


def test_payments_handled_cancel_after_a_failure_runs_the_credit_not_the_refund(
    shop: PaymentShop,
) -> None:
    """The body failed and its refund's undo raised (the credit never ran); the operator
    refunds by hand: the credit runs, nothing is refunded by us, and it ends ``FAILED``
    (its undos were started by the failure), the payments marked handled."""
    task_id, ledger_up, credited = _failed_with_undos_left(shop, refund_fails=True)
    ledger_up.set()
    refund_by_hand(shop)
    with shop.worker():
        moved, ended = _handled_and_swept(shop, task_id)
        assert moved == "COMPENSATING"
    assert ended.state.value == "FAILED", ended.reason
    credited_back_once(shop, credited, "failure")
    assert len(shop.gateway.refunds) == 1 and our_refund_requests(shop) == [], "only the operator's"
    assert ended.payments_handled_at_ms is not None


def test_twin_payments_handled_cancel_with_both_left_ends_with_the_debit_kept(
    shop: PaymentShop,
) -> None:
    task_id, ledger_up, credited = _failed_with_undos_left(shop, refund_fails=True)
    ledger_up.set()
    refund_by_hand(shop)
    with sabotage(PAYMENTS_HANDLED_SKIPS_EFFECT_UNDOS):
        ended = cancel(shop.app, task_id, HANDLED, payments_handled=True)
    assert ended.state.value == "CANCELLED"
    debit_kept(shop, credited)
