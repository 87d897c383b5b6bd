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

import threading
from typing import Any

from sqlalchemy import text

from celery_agboss.core.compensation import UndoStep
from celery_agboss.core.protections import CANCEL_SKIPS_EFFECT_UNDOS
from celery_agboss.operator import cancel
from celery_agboss.task import undo_function
from celery_agboss.testing import sabotage
from tests.delivery.conftest import PaymentShop
from tests.support.processes import wait_until

CUSTOMER = "c-1"
OPENING_BALANCE = 5000
PRICE = 1000


# --- the app's own ledger ------------------------------------------------------------------


def _open_wallet(shop: PaymentShop) -> None:
    with shop.agboss.store.engine.begin() as conn:
        conn.execute(text("CREATE TABLE shop_wallet (customer TEXT PRIMARY KEY, balance INT)"))
        conn.execute(
            text("INSERT INTO shop_wallet VALUES (:c, :b)"), {"c": CUSTOMER, "b": OPENING_BALANCE}
        )


def _move(conn: Any, customer: str, amount: int) -> int:
    conn.execute(
        text("UPDATE shop_wallet SET balance = balance + :a WHERE customer = :c"),
        {"a": amount, "c": customer},
    )
    return amount


def _debit(conn: Any, customer: str) -> int:
    """The body's fenced effect: the price taken from the wallet; the amount debited."""
    _move(conn, customer, -PRICE)
    return PRICE


def _balance(shop: PaymentShop) -> int:
    with shop.agboss.store.engine.connect() as conn:
        found = conn.execute(
            text("SELECT balance FROM shop_wallet WHERE customer = :c"), {"c": CUSTOMER}
        ).scalar_one()
    return int(found)


def _credit_wallet_undo(shop: PaymentShop, ledger_up: threading.Event) -> list[Any]:
    """Registers ``credit-wallet`` (a fenced effect crediting the wallet back, refused
    while ``ledger_up`` is not set); the credits it made."""
    credited: list[Any] = []

    @undo_function(shop.app, "credit-wallet")
    def credit_wallet(task: Any, undo: UndoStep, customer: str, amount: int) -> None:
        if not ledger_up.is_set():
            raise ConnectionError("the ledger is down")
        task.fenced_effect("credit-wallet", lambda conn: _move(conn, customer, amount))
        credited.append((customer, amount, undo.cause))

    return credited


def _released(shop: PaymentShop, task_id: str) -> None:
    wait_until(
        lambda: not getattr(shop.agboss.store.read_lease(task_id), "live", False),
        20,
        message=f"the lease of {task_id} to be released",
    )


# --- a waiting execution ---------------------------------------------------------------------


def _cancel_a_waiting_debit(shop: PaymentShop) -> tuple[str, str, list[Any]]:
    """The body debits the wallet, declares its credit back, then waits for a retry an hour
    away; an operator cancels it and the sweep runs. The state the cancel moved it to, the
    state it ends in, and the credits made."""
    _open_wallet(shop)
    ledger_up = threading.Event()
    ledger_up.set()
    credited = _credit_wallet_undo(shop, ledger_up)

    @shop.task()
    def pay_from_wallet(self: Any, customer: str) -> Any:
        amount = self.fenced_effect(
            "debit-wallet",
            lambda conn: _debit(conn, customer),
            business_key=f"order:{customer}",
        )
        self.undo_with("credit-wallet", customer=customer, amount=amount)
        raise self.retry(countdown=3600)  # waits in the store

    with shop.worker():
        task_id = str(pay_from_wallet.delay(CUSTOMER).id)
        shop.wait_state(task_id, "WAITING")
        _released(shop, task_id)
        assert _balance(shop) == OPENING_BALANCE - PRICE
        moved = cancel(shop.app, task_id, "the customer changed their mind")
        shop.sweep()
        ended = shop.wait_state(task_id, "CANCELLED", "WAITING_OPERATOR", "FAILED")
    return moved.state.value, ended.state.value, credited


def test_a_cancel_of_a_waiting_execution_credits_back_its_fenced_debit(shop: PaymentShop) -> None:
    moved, ended, credited = _cancel_a_waiting_debit(shop)
    assert moved == "COMPENSATING", "its undos run before the cancel ends"
    assert ended == "CANCELLED"
    assert credited == [(CUSTOMER, PRICE, "cancel")]
    assert _balance(shop) == OPENING_BALANCE, "the debit was credited back, once"


def test_twin_a_cancel_that_counts_only_payments_keeps_the_debit(shop: PaymentShop) -> None:
    with sabotage(CANCEL_SKIPS_EFFECT_UNDOS):
        moved, ended, credited = _cancel_a_waiting_debit(shop)
    assert moved == ended == "CANCELLED"
    assert credited == []
    assert _balance(shop) == OPENING_BALANCE - PRICE, "the customer's debit is kept"


# --- undos stopped part-way ------------------------------------------------------------------


def _cancel_after_undos_stopped(shop: PaymentShop) -> tuple[str, str, list[Any]]:
    """The body debits the wallet (undo: credit it), charges the card (undo: refund it),
    then fails. The refund runs; the credit is refused (the ledger is down) and the
    execution waits for a person, who cancels it once the ledger is back; the sweep runs.
    The state the cancel moved it to, the state it ends in, and the credits made."""
    _open_wallet(shop)
    charge, refund = shop.call(), shop.refund_call()
    ledger_up = threading.Event()
    credited = _credit_wallet_undo(shop, ledger_up)

    @undo_function(shop.app, "refund-charge")
    def refund_charge(task: Any, undo: UndoStep, payment: str) -> None:
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

    with shop.worker():
        task_id = shop.deliver(pay_half_from_wallet, CUSTOMER, states=("WAITING_OPERATOR",))
        _released(shop, task_id)
        assert len(shop.gateway.refunds) == 1 and _balance(shop) == OPENING_BALANCE - PRICE
        ledger_up.set()
        moved = cancel(shop.app, task_id, "the customer changed their mind")
        shop.sweep()
        ended = shop.wait_state(task_id, "CANCELLED", "WAITING_OPERATOR", "FAILED")
    assert len(shop.gateway.payments) == 1
    assert len(shop.gateway.refunds) == 1, "the refund already made is not made again"
    return moved.state.value, ended.state.value, credited


def test_a_cancel_after_undos_stopped_part_way_runs_the_rest(shop: PaymentShop) -> None:
    moved, ended, credited = _cancel_after_undos_stopped(shop)
    assert moved == "COMPENSATING"
    assert ended == "FAILED", "its undos were started by the failure: they end it"
    assert credited == [(CUSTOMER, PRICE, "failure")]
    assert _balance(shop) == OPENING_BALANCE, "the debit was credited back, once"


def test_twin_a_cancel_after_undos_stopped_drops_the_rest(shop: PaymentShop) -> None:
    with sabotage(CANCEL_SKIPS_EFFECT_UNDOS):
        moved, ended, credited = _cancel_after_undos_stopped(shop)
    assert moved == ended == "CANCELLED"
    assert credited == []
    assert _balance(shop) == OPENING_BALANCE - PRICE, "the customer's debit is kept"
