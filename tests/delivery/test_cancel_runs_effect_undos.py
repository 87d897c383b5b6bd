"""A cancel runs the undos a body declared after its fenced effects, not only after its
payments (docs/undo.md: an operator's cancel of an execution that is not running and has
declared undos moves it to ``COMPENSATING``), on both stores, counted in the app's own
table: a wallet the body debits with ``fenced_effect()`` and whose undo credits back.

- A body that debited the wallet, declared ``credit-wallet`` and waits for a long retry,
  cancelled by an operator: ``COMPENSATING``, the sweep re-drives it, the wallet is
  credited back once, then ``CANCELLED``.
- An execution whose undos stopped part-way (its charge refunded, the wallet's credit
  refused by a ledger that was down, so it waits for a person), cancelled by an operator:
  ``COMPENSATING``, the credit runs, the charge is not refunded twice, and it ends
  ``FAILED`` as the undos a failure started do.

Twin ``cancel-skips-effect-undos`` (the cancel counts only payments): both end
``CANCELLED`` at once with the debit kept and the credit never run.
"""

from __future__ import annotations

from typing import Any

from celery_agboss.core.protections import CANCEL_SKIPS_EFFECT_UNDOS
from celery_agboss.operator import cancel
from celery_agboss.testing import sabotage
from tests.delivery.conftest import PaymentShop
from tests.delivery.wallet_orders import (
    CUSTOMER,
    OPENING_BALANCE,
    PRICE,
    balance,
    credited_back_once,
    debit_kept,
    debit_the_wallet,
    ended_after_a_sweep,
    failing_wallet_and_card_order,
    placed_and_waiting,
    released,
    wallet_with_credit_undo,
)

# --- a waiting execution ---------------------------------------------------------------------


def _cancel_a_waiting_debit(shop: PaymentShop) -> tuple[str, str, list[Any]]:
    """The body debits the wallet, declares its credit back, then waits for a retry an hour
    away; an operator cancels it and the sweep runs. The state the cancel moved it to, the
    state it ends in, and the credits made."""
    _, credited = wallet_with_credit_undo(shop, ledger_up=True)

    @shop.task()
    def pay_from_wallet(self: Any, customer: str) -> Any:
        debit_the_wallet(self, customer, key="order:{customer}")
        raise self.retry(countdown=3600)  # waits in the store

    with shop.worker():
        task_id = placed_and_waiting(shop, pay_from_wallet)
        assert balance(shop) == OPENING_BALANCE - PRICE
        moved = cancel(shop.app, task_id, "the customer changed their mind")
        ended = ended_after_a_sweep(shop, task_id)
    return moved.state.value, ended.state.value, credited


def test_a_cancel_of_a_waiting_execution_credits_back_its_fenced_debit(shop: PaymentShop) -> None:
    moved, ended, credited = _cancel_a_waiting_debit(shop)
    assert moved == "COMPENSATING", "its undos run before the cancel ends"
    assert ended == "CANCELLED"
    credited_back_once(shop, credited, "cancel")


def test_twin_a_cancel_that_counts_only_payments_keeps_the_debit(shop: PaymentShop) -> None:
    with sabotage(CANCEL_SKIPS_EFFECT_UNDOS):
        moved, ended, credited = _cancel_a_waiting_debit(shop)
    assert moved == ended == "CANCELLED"
    debit_kept(shop, credited)


# --- undos stopped part-way ------------------------------------------------------------------


def _cancel_after_undos_stopped(shop: PaymentShop) -> tuple[str, str, list[Any]]:
    """The body debits the wallet (undo: credit it), charges the card (undo: refund it),
    then fails. The refund runs; the credit is refused (the ledger is down) and the
    execution waits for a person, who cancels it once the ledger is back; the sweep runs.
    The state the cancel moved it to, the state it ends in, and the credits made."""
    pay_half_from_wallet, ledger_up, credited = failing_wallet_and_card_order(shop)
    with shop.worker():
        task_id = shop.deliver(pay_half_from_wallet, CUSTOMER, states=("WAITING_OPERATOR",))
        released(shop, task_id)
        assert len(shop.gateway.refunds) == 1 and balance(shop) == OPENING_BALANCE - PRICE
        ledger_up.set()
        moved = cancel(shop.app, task_id, "the customer changed their mind")
        ended = ended_after_a_sweep(shop, task_id)
    assert len(shop.gateway.payments) == 1
    assert len(shop.gateway.refunds) == 1, "the refund already made is not made again"
    return moved.state.value, ended.state.value, credited


def test_a_cancel_after_undos_stopped_part_way_runs_the_rest(shop: PaymentShop) -> None:
    moved, ended, credited = _cancel_after_undos_stopped(shop)
    assert moved == "COMPENSATING"
    assert ended == "FAILED", "its undos were started by the failure: they end it"
    credited_back_once(shop, credited, "failure")


def test_twin_a_cancel_after_undos_stopped_drops_the_rest(shop: PaymentShop) -> None:
    with sabotage(CANCEL_SKIPS_EFFECT_UNDOS):
        moved, ended, credited = _cancel_after_undos_stopped(shop)
    assert moved == ended == "CANCELLED"
    debit_kept(shop, credited)
