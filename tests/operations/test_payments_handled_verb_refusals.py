"""``agboss payments-handled ID`` of a ``FAILED`` execution is refused (``wrong-state``,
nothing written, the other execution named) in the cases ``cancel --payments-handled``
is (``store.handled_payments.refuse_handled_txn``: one rule): its word would not hold.
Real worker, both stores, counted at the fake gateway.

- A later click on the same order relied on the failed order's charge and still waits:
  refused naming the click (a claim would not stop it: re-delivered, it would be handed
  the charge refunded by hand as paid). Twin ``payments-handled-while-another-uses``:
  accepted, and the click, re-delivered, ships on the refunded charge.
- The order's refund is a task of its own (an undo declared as a signature), published
  and still queued: refused naming the task. Twin
  ``payments-handled-while-undo-task-queued``: accepted, and the task then sends a second
  refund of the charge the operator refunded by hand.
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import select

from celery_agboss.core.protections import (
    PAYMENTS_HANDLED_WHILE_ANOTHER_USES,
    PAYMENTS_HANDLED_WHILE_UNDO_TASK_QUEUED,
)
from celery_agboss.operator import payments_handled
from celery_agboss.store.schema_executions import outbox
from celery_agboss.testing import sabotage
from tests.delivery.conftest import PaymentShop
from tests.delivery.wallet_orders import (
    CUSTOMER,
    HANDLED,
    REFUND_TASK,
    charge_the_card,
    refund_by_hand,
    register_refund_task,
    released,
    task_refund_requests,
)
from tests.operations.handled_orders import (
    delivered_again,
    failed_then_a_click_waits,
    refused_naming,
)


def _refused_nothing_written(shop: PaymentShop, task_id: str, other: str) -> None:
    """``payments-handled`` of the failed order refused naming ``other``, nothing written."""
    kept = refused_naming(shop, task_id, other, verb=True)
    assert kept.state.value == "FAILED" and kept.payments_handled_at_ms is None


# --- a later click still uses the charge ------------------------------------------------------


def test_payments_handled_verb_refused_while_a_later_click_uses_the_charge(
    shop: PaymentShop,
) -> None:
    task_id, click_id, _ = failed_then_a_click_waits(shop, [])
    _refused_nothing_written(shop, task_id, click_id)


def test_twin_payments_handled_verb_while_a_click_waits_ships_on_the_refund(
    shop: PaymentShop,
) -> None:
    shipped: list[Any] = []
    task_id, click_id, click = failed_then_a_click_waits(shop, shipped)
    with sabotage(PAYMENTS_HANDLED_WHILE_ANOTHER_USES):
        payments_handled(shop.app, task_id, HANDLED)  # accepted
    with shop.worker():
        delivered_again(shop, click, click_id)
    assert shop.execution(click_id).state.value == "COMPLETED"
    assert len(shipped) == 1, "shipped on the charge the operator refunded by hand"
    assert len(shop.gateway.payments) == 1 and len(shop.gateway.refunds) == 1


# --- a refund task of the order is still queued ---------------------------------------------


def _failed_with_a_queued_refund(shop: PaymentShop) -> tuple[str, str, str]:
    """The order charged the card (undo: ``refund_payment``, a signature on a queue no
    worker consumes yet) and failed: the refund task is published. The operator refunds
    the card by hand. The order's id, the refund task's, and its queue."""
    queue, charge = f"refunds-{uuid.uuid4().hex[:8]}", shop.call()
    register_refund_task(shop)

    @shop.task()
    def pay_then_fail(self: Any, customer: str) -> Any:
        receipt = charge_the_card(self, charge, customer)
        self.undo_with(shop.app.signature(REFUND_TASK, args=[receipt["id"]]).set(queue=queue))
        raise LookupError("out of stock")

    task_id = shop.run(pay_then_fail, CUSTOMER, states=("FAILED",))
    released(shop, task_id)
    with shop.agboss.store.transaction() as tx:
        rows = tx.execute(select(outbox.c.task_id).where(outbox.c.execution_id == task_id))
        (refund_task,) = [str(row.task_id) for row in rows]
    refund_by_hand(shop)
    assert task_refund_requests(shop) == []
    return task_id, refund_task, queue


def test_payments_handled_verb_refused_while_the_refund_task_is_queued(
    shop: PaymentShop,
) -> None:
    task_id, refund_task, _ = _failed_with_a_queued_refund(shop)
    _refused_nothing_written(shop, task_id, refund_task)


def test_twin_payments_handled_verb_while_the_refund_task_is_queued_refunds_twice(
    shop: PaymentShop,
) -> None:
    task_id, refund_task, queue = _failed_with_a_queued_refund(shop)
    with sabotage(PAYMENTS_HANDLED_WHILE_UNDO_TASK_QUEUED):
        payments_handled(shop.app, task_id, HANDLED)  # accepted
    with shop.worker(queues=[shop.app.conf.task_default_queue, queue]):
        shop.wait_state(refund_task, "COMPLETED", "FAILED", "WAITING_OPERATOR", "WAITING")
        released(shop, refund_task)
    # At least one: the refund of what is already refunded is refused, an answer the call
    # does not classify as definite, so the task may send it again before its worker
    # stops (nothing moves; the first request is the defect).
    assert len(task_refund_requests(shop)) >= 1, "refunded again after the operator's word"
