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
- Both kinds left (the refund's undo failed, the credit never ran, the operator refunded
  by hand): refused, naming both undos. Running them would refund a second time what the
  operator says is dealt with; ending it would keep the debit. Nothing is changed.

Twin ``payments-handled-skips-effect-undos`` (the confirmation ends the cancel whatever
is left): each ends ``CANCELLED`` at once, the debit kept, the credit never run.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from celery_agboss.cli import EXIT_REFUSED
from celery_agboss.core.compensation import UndoStep
from celery_agboss.core.executions import ExecutionRecord
from celery_agboss.core.protections import PAYMENTS_HANDLED_SKIPS_EFFECT_UNDOS
from celery_agboss.errors import OperatorRefusedError
from celery_agboss.operator import cancel, list_failed_after_payment
from celery_agboss.task import undo_function
from celery_agboss.testing import sabotage
from tests.delivery import conftest as delivery
from tests.delivery.conftest import PaymentShop
from tests.delivery.test_cancel_runs_effect_undos import (
    CUSTOMER,
    OPENING_BALANCE,
    PRICE,
    _balance,
    _credit_wallet_undo,
    _debit,
    _open_wallet,
    _released,
)
from tests.operations.cli import run

# The delivery folder's shop (a real worker in this process), reused as it is.
delivery_store_url = delivery.delivery_store_url
shop_config = delivery.shop_config
shop = delivery.shop

HANDLED = "refunded the card at the gateway by hand"


def _refund_by_hand(shop: PaymentShop) -> None:
    """What the operator does in the gateway's dashboard: the card's charge refunded."""
    (payment,) = shop.gateway.payments
    shop.gateway.refund(payment["id"], "dashboard-refund-1")


def _ended(shop: PaymentShop, task_id: str) -> ExecutionRecord:
    """The sweep runs (it re-drives a ``COMPENSATING`` execution); the state it ends in."""
    shop.sweep()
    return shop.wait_state(task_id, "CANCELLED", "WAITING_OPERATOR", "FAILED")


# --- a waiting execution -------------------------------------------------------------------


def _handled_cancel_of_a_waiting_debit(
    shop: PaymentShop,
) -> tuple[str, ExecutionRecord, list[Any]]:
    """The body debits the wallet (undo: credit it), charges the card (no undo), then waits
    an hour for a retry. The operator refunds the card by hand and cancels with
    ``--payments-handled``; the sweep runs. The state the cancel moved it to, the record it
    ends with, and the credits made."""
    _open_wallet(shop)
    ledger_up = threading.Event()
    ledger_up.set()
    credited = _credit_wallet_undo(shop, ledger_up)
    charge = shop.call()

    @shop.task()
    def pay_from_wallet_and_card(self: Any, customer: str) -> Any:
        amount = self.fenced_effect(
            "debit-wallet",
            lambda conn: _debit(conn, customer),
            business_key=f"order:{customer}:wallet",
        )
        self.undo_with("credit-wallet", customer=customer, amount=amount)
        self.outbound(charge, {"amount": PRICE}, business_key=f"order:{customer}:card")
        raise self.retry(countdown=3600)  # waits in the store

    with shop.worker():
        task_id = str(pay_from_wallet_and_card.delay(CUSTOMER).id)
        shop.wait_state(task_id, "WAITING")
        _released(shop, task_id)
        assert _balance(shop) == OPENING_BALANCE - PRICE
        _refund_by_hand(shop)
        moved = cancel(shop.app, task_id, HANDLED, payments_handled=True)
        ended = _ended(shop, task_id)
    assert len(shop.gateway.payments) == 1
    assert len(shop.gateway.refunds) == 1, "only the operator's refund: none sent by us"
    return moved.state.value, ended, credited


def test_payments_handled_cancel_still_credits_back_a_fenced_debit(shop: PaymentShop) -> None:
    moved, ended, credited = _handled_cancel_of_a_waiting_debit(shop)
    assert moved == "COMPENSATING", "the fenced effect's undo runs before the cancel ends"
    assert ended.state.value == "CANCELLED", ended.reason
    assert credited == [(CUSTOMER, PRICE, "cancel")]
    assert _balance(shop) == OPENING_BALANCE, "the debit was credited back, once"
    assert ended.payments_handled_at_ms is not None, "the operator's word is kept"
    assert ended.id not in [left.execution.id for left in list_failed_after_payment(shop.app)]


def test_twin_payments_handled_cancel_keeps_the_debit(shop: PaymentShop) -> None:
    with sabotage(PAYMENTS_HANDLED_SKIPS_EFFECT_UNDOS):
        moved, ended, credited = _handled_cancel_of_a_waiting_debit(shop)
    assert moved == ended.state.value == "CANCELLED"
    assert credited == []
    assert _balance(shop) == OPENING_BALANCE - PRICE, "the customer's debit is kept"


# --- undos stopped part-way ----------------------------------------------------------------


def _failed_with_undos_left(
    shop: PaymentShop, *, refund_fails: bool
) -> tuple[str, threading.Event, list[Any]]:
    """The body debits the wallet (undo: credit it), charges the card (undo: refund it),
    then fails; its undos run, last declared first. ``refund_fails``: the refund raises
    (the credit never runs); else the refund is made and the credit is refused (the
    ledger is down). It waits for a person either way. Its id, the ledger's switch, and
    the credits made."""
    _open_wallet(shop)
    charge, refund = shop.call(), shop.refund_call()
    ledger_up = threading.Event()
    credited = _credit_wallet_undo(shop, ledger_up)

    @undo_function(shop.app, "refund-charge")
    def refund_charge(task: Any, undo: UndoStep, payment: str) -> None:
        if refund_fails:
            raise ConnectionError("the gateway's refunds are down")
        task.outbound(refund, {"payment": payment})

    @shop.task()
    def pay_half_from_wallet(self: Any, customer: str) -> Any:
        amount = self.fenced_effect(
            "debit-wallet",
            lambda conn: _debit(conn, customer),
            business_key=f"order:{customer}:wallet",
        )
        self.undo_with("credit-wallet", customer=customer, amount=amount)
        receipt = self.outbound(charge, {"amount": PRICE}, business_key=f"order:{customer}:card")
        self.undo_with("refund-charge", payment=receipt["id"])
        raise LookupError("out of stock")

    task_id = shop.run(pay_half_from_wallet, CUSTOMER, states=("WAITING_OPERATOR",))
    _released(shop, task_id)
    assert _balance(shop) == OPENING_BALANCE - PRICE
    assert len(shop.gateway.refunds) == (0 if refund_fails else 1)
    return task_id, ledger_up, credited


def _handled_cancel_after_the_credit_failed(
    shop: PaymentShop,
) -> tuple[str, ExecutionRecord, list[Any]]:
    task_id, ledger_up, credited = _failed_with_undos_left(shop, refund_fails=False)
    ledger_up.set()
    with shop.worker():
        moved = cancel(shop.app, task_id, "the refund is made; close it", payments_handled=True)
        ended = _ended(shop, task_id)
    assert len(shop.gateway.payments) == 1
    assert len(shop.gateway.refunds) == 1, "the refund already made is not made again"
    return moved.state.value, ended, credited


def test_payments_handled_cancel_after_undos_stopped_runs_the_credit(shop: PaymentShop) -> None:
    moved, ended, credited = _handled_cancel_after_the_credit_failed(shop)
    assert moved == "COMPENSATING"
    assert ended.state.value == "FAILED", "its undos were started by the failure: they end it"
    assert credited == [(CUSTOMER, PRICE, "failure")]
    assert _balance(shop) == OPENING_BALANCE, "the debit was credited back, once"
    assert ended.payments_handled_at_ms is not None


def test_twin_payments_handled_cancel_after_undos_stopped_drops_the_credit(
    shop: PaymentShop,
) -> None:
    with sabotage(PAYMENTS_HANDLED_SKIPS_EFFECT_UNDOS):
        moved, ended, credited = _handled_cancel_after_the_credit_failed(shop)
    assert moved == ended.state.value == "CANCELLED"
    assert credited == []
    assert _balance(shop) == OPENING_BALANCE - PRICE, "the customer's debit is kept"


# --- undos of both kinds left --------------------------------------------------------------


def test_payments_handled_cancel_with_a_refund_and_a_credit_left_is_refused(
    shop: PaymentShop,
) -> None:
    task_id, ledger_up, credited = _failed_with_undos_left(shop, refund_fails=True)
    ledger_up.set()
    before = shop.execution(task_id)
    _refund_by_hand(shop)
    with pytest.raises(OperatorRefusedError) as refused:
        cancel(shop.app, task_id, HANDLED, payments_handled=True)
    assert refused.value.code == "wrong-state"
    message = str(refused.value)
    assert "credit-wallet" in message and "refund-charge" in message, message
    result = run(shop.app, "cancel", task_id, "--payments-handled", "--reason", HANDLED)
    assert result.exit_code == EXIT_REFUSED, result.output
    assert "credit-wallet" in result.output, result.output
    after = shop.execution(task_id)
    assert (after.state, after.reason, after.cancel_requested) == (
        before.state,
        before.reason,
        before.cancel_requested,
    ), "nothing was changed"
    assert after.payments_handled_at_ms is None
    assert credited == [] and _balance(shop) == OPENING_BALANCE - PRICE
    assert len(shop.gateway.refunds) == 1, "only the operator's"


def test_twin_payments_handled_cancel_with_both_left_ends_with_the_debit_kept(
    shop: PaymentShop,
) -> None:
    task_id, ledger_up, credited = _failed_with_undos_left(shop, refund_fails=True)
    ledger_up.set()
    _refund_by_hand(shop)
    with sabotage(PAYMENTS_HANDLED_SKIPS_EFFECT_UNDOS):
        ended = cancel(shop.app, task_id, HANDLED, payments_handled=True)
    assert ended.state.value == "CANCELLED"
    assert credited == [] and _balance(shop) == OPENING_BALANCE - PRICE
