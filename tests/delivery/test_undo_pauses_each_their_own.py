"""Two undos of one undo function that each ask a person (``pause("approve-refund")``)
are asked twice, each about its own payment (design: compensating).

A pause in an undo is the undo's own (``<name>@<12 hex of the undo's key>``, the id
``UndoStep.pause_id(name)`` gives): named as the body's, the second undo found the first
one's answer and took it, so the person who declined the refund of one payment also
declined, unasked, the other's (or approved it). Twin ``undo-pauses-share-one-name``:
the bigger charge is kept, no refund sent and nobody asked. Counted at the fake gateway.
"""

from __future__ import annotations

from typing import Any

from celery_agboss import answer_pause
from celery_agboss.core.compensation import UndoStep
from celery_agboss.core.protections import UNDO_PAUSES_SHARE_ONE_NAME
from celery_agboss.task import undo_function
from celery_agboss.testing import sabotage
from tests.delivery.conftest import PaymentShop
from tests.support.processes import wait_until


def _two_charges_each_refunded_after_approval(shop: PaymentShop, asked: list[Any]) -> Any:
    charge, refund = shop.call(), shop.refund_call()

    @undo_function(shop.app, "refund-after-approval")
    def refund_after_approval(task: Any, undo: UndoStep, payment: str) -> None:
        decision = task.pause("approve-refund", {"payment": payment})
        asked.append((payment, undo.pause_id("approve-refund"), decision["approved"]))
        if decision["approved"]:
            task.outbound(refund, {"payment": payment})

    @shop.task()
    def two_part_order(task: Any, order: str) -> Any:
        a = task.outbound(charge, {"amount": 1000}, business_key=f"order:{order}:a")
        task.undo_with("refund-after-approval", payment=a["id"])
        b = task.outbound(charge, {"amount": 200}, business_key=f"order:{order}:b")
        task.undo_with("refund-after-approval", payment=b["id"])
        raise LookupError("out of stock")

    return two_part_order


def _answer_the_pending_pause(shop: PaymentShop, task_id: str, approved: bool) -> str:
    def pending() -> list[str]:
        pauses = shop.agboss.executions.read_pauses(execution_id=task_id)
        return [p.pause_id for p in pauses if p.status == "PENDING"]

    wait_until(lambda: len(pending()) == 1, 20, message="one pause to wait for a person")
    [pause_id] = pending()
    wait_until(
        lambda: not getattr(shop.agboss.store.read_lease(task_id), "live", False),
        20,
        message="the paused delivery to release its lease",
    )
    assert answer_pause(shop.app, pause_id, {"approved": approved})
    return pause_id


def test_each_undo_asks_about_its_own_payment(shop: PaymentShop) -> None:
    asked: list[Any] = []
    order = _two_charges_each_refunded_after_approval(shop, asked)
    with shop.worker():
        task_id = shop.deliver(order, "o-1", states=("PAUSED",))
        first = _answer_the_pending_pause(shop, task_id, approved=False)  # b's: kept
        second = _answer_the_pending_pause(shop, task_id, approved=True)  # a's: refunded
        record = shop.wait_state(task_id, "FAILED", "WAITING_OPERATOR")
    a, b = shop.gateway.payments
    assert first != second
    assert asked == [(b["id"], first, False), (a["id"], second, True)]
    assert record.state.value == "FAILED"
    assert [r["payment"] for r in shop.gateway.refunds] == [a["id"]]


def test_twin_the_second_undo_takes_the_first_ones_answer(shop: PaymentShop) -> None:
    asked: list[Any] = []
    order = _two_charges_each_refunded_after_approval(shop, asked)
    with shop.worker(), sabotage(UNDO_PAUSES_SHARE_ONE_NAME):
        task_id = shop.deliver(order, "o-1", states=("PAUSED",))
        _answer_the_pending_pause(shop, task_id, approved=False)
        record = shop.wait_state(task_id, "FAILED", "WAITING_OPERATOR")
    a, b = shop.gateway.payments
    assert [payment for payment, _, _ in asked] == [b["id"], a["id"]]  # a's never asked
    assert record.state.value == "FAILED" and shop.gateway.refunds == []
