"""The orders the cancel tests share, built on this folder's ``shop``: a body that debits
the app's own wallet with ``fenced_effect()`` (undo: credit it back) and charges the card
at the fake gateway (undo: refund it), and the operator's steps around them: a refund by
hand, a sweep to an end, a later click on the card step; and the checks of the wallet
after (credited back once, or the debit kept). One copy, used by the plain
cancel here and by ``cancel --payments-handled`` in ``operations``, so that each test
file reads as its scenario."""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import select, text

from celery_agboss import Completed, NotSent, OutboundCall, OutboundCallCompensatedError
from celery_agboss.core.compensation import UndoStep
from celery_agboss.core.executions import ExecutionRecord
from celery_agboss.core.outbound import CallContext, Lookup
from celery_agboss.store.schema_executions import outbox
from celery_agboss.task import undo_function
from celery_agboss.testing.gateway_types import (
    FakeGatewayError,
    FakeGatewayErrorKind,
    GatewayRequest,
    is_definite_failure,
)
from tests.delivery.conftest import PaymentShop, assert_waits_for_an_operator
from tests.support.processes import wait_until

CUSTOMER = "c-1"
OPENING_BALANCE = 5000
PRICE = 1000
HANDLED = "refunded the card at the gateway by hand"


# --- the app's own ledger ------------------------------------------------------------------


def open_wallet(shop: PaymentShop) -> None:
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


def balance(shop: PaymentShop) -> int:
    with shop.agboss.store.engine.connect() as conn:
        found = conn.execute(
            text("SELECT balance FROM shop_wallet WHERE customer = :c"), {"c": CUSTOMER}
        ).scalar_one()
    return int(found)


def wallet_with_credit_undo(
    shop: PaymentShop, *, ledger_up: bool
) -> tuple[threading.Event, list[Any]]:
    """Opens the wallet and registers ``credit-wallet`` (a fenced effect crediting it back,
    refused while the ledger's switch is not set; set at once if ``ledger_up``). The
    switch, and the credits made."""
    open_wallet(shop)
    switch = threading.Event()
    if ledger_up:
        switch.set()
    credited: list[Any] = []

    @undo_function(shop.app, "credit-wallet")
    def credit_wallet(task: Any, undo: UndoStep, customer: str, amount: int) -> None:
        if not switch.is_set():
            raise ConnectionError("the ledger is down")
        task.fenced_effect("credit-wallet", lambda conn: _move(conn, customer, amount))
        credited.append((customer, amount, undo.cause))

    return switch, credited


def credited_back_once(shop: PaymentShop, credited: list[Any], cause: str) -> None:
    """The wallet's debit credited back once, by the undos ``cause`` started."""
    assert credited == [(CUSTOMER, PRICE, cause)]
    assert balance(shop) == OPENING_BALANCE, "the debit was credited back, once"


def debit_kept(shop: PaymentShop, credited: list[Any]) -> None:
    """The wallet's debit kept: its credit never ran."""
    assert credited == []
    assert balance(shop) == OPENING_BALANCE - PRICE, "the customer's debit is kept"


# --- the steps of an order's body ------------------------------------------------------------


def debit_the_wallet(task: Any, customer: str, *, key: str = "order:{customer}:wallet") -> None:
    """The wallet debited (fenced, under ``key``), its ``credit-wallet`` undo declared."""
    amount = task.fenced_effect(
        "debit-wallet",
        lambda conn: _debit(conn, customer),
        business_key=key.format(customer=customer),
    )
    task.undo_with("credit-wallet", customer=customer, amount=amount)


def charge_the_card(task: Any, charge: OutboundCall, customer: str) -> Any:
    """The order's card step: the price charged under ``order:<customer>:card``."""
    return task.outbound(charge, {"amount": PRICE}, business_key=f"order:{customer}:card")


def refund_charge_undo(shop: PaymentShop, refund: OutboundCall, *, fails: bool = False) -> None:
    """Registers ``refund-charge``: the payment refunded through ``refund``, or, ``fails``,
    a refund that raises before anything is sent (the credit after it never runs)."""

    @undo_function(shop.app, "refund-charge")
    def refund_charge(task: Any, undo: UndoStep, payment: str) -> None:
        if fails:
            raise ConnectionError("the gateway's refunds are down")
        task.outbound(refund, {"payment": payment})


def refused_definitely(exc: BaseException) -> bool:
    """The gateway's refusal of a refund moved nothing: a decline, or a refund of more than
    is left (the charge already refunded)."""
    invalid = isinstance(exc, FakeGatewayError) and exc.kind is FakeGatewayErrorKind.INVALID_REQUEST
    return invalid or is_definite_failure(exc)


def wallet_and_card_order(shop: PaymentShop) -> tuple[Any, list[Any]]:
    """``pay_from_wallet_and_card(customer)``: debits the wallet (undo: ``credit-wallet``),
    charges the card (undo: ``refund-charge``, a refund at the gateway whose refusal is
    definite), then waits an hour for a retry. The task, and the credits made."""
    _, credited = wallet_with_credit_undo(shop, ledger_up=True)
    charge, gateway = shop.call(), shop.gateway

    def looked_up(call: CallContext, lookup: Lookup) -> Any:
        found = gateway.lookup(lookup.idempotency_key)
        return NotSent() if found is None else Completed(found)

    refund = OutboundCall(
        name="shop.refund",
        send=lambda call: gateway.refund(call.request["payment"], call.idempotency_key),
        reconcile=looked_up,
        key_retention=timedelta(hours=24),
        is_definite_failure=refused_definitely,
    )
    shop.agboss.register(refund)
    refund_charge_undo(shop, refund)

    @shop.task()
    def pay_from_wallet_and_card(self: Any, customer: str) -> Any:
        debit_the_wallet(self, customer)
        receipt = charge_the_card(self, charge, customer)
        self.undo_with("refund-charge", payment=receipt["id"])
        raise self.retry(countdown=3600)  # waits in the store

    return pay_from_wallet_and_card, credited


def failing_wallet_and_card_order(
    shop: PaymentShop, *, refund_fails: bool = False
) -> tuple[Any, threading.Event, list[Any]]:
    """``pay_half_from_wallet(customer)``: debits the wallet (undo: credit it), charges the
    card (undo: refund it, or raise if ``refund_fails``), then fails; its undos run, last
    declared first, with the ledger down (the credit refused until its switch is set).
    The task, the ledger's switch, and the credits made."""
    ledger_up, credited = wallet_with_credit_undo(shop, ledger_up=False)
    charge, refund = shop.call(), shop.refund_call()
    refund_charge_undo(shop, refund, fails=refund_fails)

    @shop.task()
    def pay_half_from_wallet(self: Any, customer: str) -> Any:
        debit_the_wallet(self, customer)
        receipt = charge_the_card(self, charge, customer)
        self.undo_with("refund-charge", payment=receipt["id"])
        raise LookupError("out of stock")

    return pay_half_from_wallet, ledger_up, credited


REFUND_TASK = "shop.refund_payment"
"""The refund task of ``order_with_a_queued_refund_task``: an undo declared as a signature."""


@dataclass(frozen=True)
class QueuedRefund:
    """An order whose refund is queued in a task of its own, and what the test needs."""

    order: str  # the order's execution id
    task: str  # the refund task's id
    queue: str  # the refund task's queue, of this test's own
    ledger_up: threading.Event  # the switch of the wallet's credit-back


def register_refund_task(shop: PaymentShop) -> Any:
    """``shop.refund_payment(payment)``: a ``PaymentTask`` refunding the payment through
    ``shop.sig-refund``."""
    refund = shop.refund_call("shop.sig-refund")

    @shop.task()
    def refund_payment(self: Any, payment: str) -> Any:
        return self.outbound(refund, {"payment": payment}, business_key=f"refund:{payment}")

    return refund_payment


def order_with_a_queued_refund_task(shop: PaymentShop, *, recorded: bool = True) -> QueuedRefund:
    """The order debited the wallet, charged the card (undo: ``refund_payment``, a
    signature on a queue of this test's own, never a shared one: a message left there
    would reach another test's worker) and failed: the refund task is published, the
    credit refused. ``recorded``: the publishing worker knows the task (its publish is
    recorded ``REQUESTED``); else it knew it by name only, and the test registers it
    later (``register_refund_task``): no execution row until a worker takes it."""
    ledger_up, _ = wallet_with_credit_undo(shop, ledger_up=False)
    queue = f"refunds-{uuid.uuid4().hex[:8]}"
    charge = shop.call()
    if recorded:
        register_refund_task(shop)

    @shop.task()
    def pay_half_from_wallet(self: Any, customer: str) -> Any:
        debit_the_wallet(self, customer)
        receipt = charge_the_card(self, charge, customer)
        self.undo_with(shop.app.signature(REFUND_TASK, args=[receipt["id"]]).set(queue=queue))
        raise LookupError("out of stock")

    task_id = shop.run(pay_half_from_wallet, CUSTOMER, states=("WAITING_OPERATOR",))
    released(shop, task_id)
    assert_waits_for_an_operator(shop.execution(task_id), "undo credit-wallet failed")
    with shop.agboss.store.transaction() as tx:
        rows = tx.execute(select(outbox.c.task_id).where(outbox.c.execution_id == task_id)).all()
    (refund_task,) = [str(r.task_id) for r in rows]
    assert task_refund_requests(shop) == [] and balance(shop) == OPENING_BALANCE - PRICE
    return QueuedRefund(task_id, refund_task, queue, ledger_up)


def task_refund_requests(shop: PaymentShop) -> list[GatewayRequest]:
    """The refund requests ``refund_payment`` sent (not the operator's by hand)."""
    return [
        r
        for r in shop.gateway.requests
        if r.operation == "refund" and "shop.sig-refund" in (r.idempotency_key or "")
    ]


# --- what the test and the operator do around it ----------------------------------------------


def released(shop: PaymentShop, task_id: str) -> None:
    wait_until(
        lambda: not getattr(shop.agboss.store.read_lease(task_id), "live", False),
        20,
        message=f"the lease of {task_id} to be released",
    )


def placed_and_waiting(shop: PaymentShop, task: Any) -> str:
    """The customer's order published (a worker running): its id once it waits for its
    retry, its lease is released and its charge is settled (``charge_settled``)."""
    task_id = str(task.delay(CUSTOMER).id)
    shop.wait_state(task_id, "WAITING")
    released(shop, task_id)
    charge_settled(shop, task_id)
    return task_id


def charge_settled(shop: PaymentShop, task_id: str) -> None:
    """No intent of ``task_id`` is left ``PENDING``. A machine stall longer than SQLite's
    write-lock bound (ttl/4: 1.25 s on the tests' 5 s lease) inside the settle's
    transaction has it rolled back, and the delivery waits with its charge ``PENDING``
    (``OutboundCallOutcomeUnknownError``), as it must; seen once in CI. The sweep then
    reconciles it, as deployed, before the test acts on an order that charged."""
    if shop.agboss.executions.pending_intent_keys(task_id):
        shop.sweep()
    assert shop.agboss.executions.pending_intent_keys(task_id) == [], "the sweep settled it"


def ended_after_a_sweep(shop: PaymentShop, task_id: str) -> ExecutionRecord:
    """The sweep runs (it re-drives a ``COMPENSATING`` execution); the state it ends in."""
    shop.sweep()
    return shop.wait_state(task_id, "CANCELLED", "WAITING_OPERATOR", "FAILED")


def refund_by_hand(shop: PaymentShop) -> None:
    """What the operator does in the gateway's dashboard: the card's charge refunded."""
    (payment,) = shop.gateway.payments
    shop.gateway.refund(payment["id"], "dashboard-refund-1")


def our_refund_requests(shop: PaymentShop) -> list[GatewayRequest]:
    """Every refund request the undos sent to the gateway (not the operator's by hand)."""
    return [
        r
        for r in shop.gateway.requests
        if r.operation == "refund" and "shop.refund" in (r.idempotency_key or "")
    ]


def click_again(shop: PaymentShop) -> list[OutboundCallCompensatedError]:
    """A later click on the same order's card step; what it is told of the first charge."""
    charge, told = shop.call(), []

    @shop.task()
    def click_again(self: Any, customer: str) -> Any:
        try:
            return charge_the_card(self, charge, customer)
        except OutboundCallCompensatedError as exc:
            told.append(exc)
            return None

    shop.run(click_again, CUSTOMER, states=("COMPLETED", "FAILED", "WAITING_OPERATOR"))
    return told
