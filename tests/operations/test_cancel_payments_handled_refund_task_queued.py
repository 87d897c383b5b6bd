"""``cancel --payments-handled`` is refused while a refund of the execution runs in a task
of its own (an undo declared as a Celery signature, published and not ended): the
operator's refund by hand and the task's would both be made. Real workers on both
stores, counted at the fake gateway.

The order debited the wallet (undo: credit it, a function) and charged the card (undo:
``refund_payment.s(payment)``, on a queue no worker consumes yet), then failed: its undos
run last declared first, so the refund task is published and the wallet's credit is
refused (the ledger is down): it waits for an operator. ``--payments-handled`` is
refused (``wrong-state``, the task named, nothing recorded); once the task refunded, it
is accepted and the credit runs. Twin ``payments-handled-while-undo-task-queued``: it is
accepted while the task is queued, and the task then sends its refund to the gateway
after the operator's confirmation.
"""

from __future__ import annotations

from typing import Any

from celery_agboss.core.protections import PAYMENTS_HANDLED_WHILE_UNDO_TASK_QUEUED
from celery_agboss.operator import cancel
from celery_agboss.testing import sabotage
from tests.delivery.conftest import PaymentShop
from tests.delivery.wallet_orders import (
    OPENING_BALANCE,
    balance,
    order_with_a_queued_refund_task,
)
from tests.operations.handled_orders import refused_naming

HANDLED = "the card is dealt with at the gateway"


def _refund_requests(shop: PaymentShop) -> list[Any]:
    return [r for r in shop.gateway.requests if r.operation == "refund"]


def _waiting_with_a_queued_refund(shop: PaymentShop) -> tuple[str, str, str, Any]:
    queued = order_with_a_queued_refund_task(shop)
    return queued.order, queued.task, queued.queue, queued.ledger_up


def test_payments_handled_refused_while_the_refund_task_is_queued(shop: PaymentShop) -> None:
    task_id, refund_task, queue, ledger_up = _waiting_with_a_queued_refund(shop)
    record = refused_naming(shop, task_id, refund_task, reason=HANDLED)
    assert record.payments_handled_at_ms is None and not record.cancel_requested
    assert record.state.value == "WAITING_OPERATOR"
    # The task refunds; then the confirmation is accepted and the credit runs, once.
    ledger_up.set()
    with shop.worker(queues=[shop.app.conf.task_default_queue, queue]):
        shop.wait_state(refund_task, "COMPLETED")
        moved = cancel(shop.app, task_id, HANDLED, payments_handled=True)
        assert moved.state.value == "COMPENSATING"
        shop.sweep()
        ended = shop.wait_state(task_id, "FAILED", "CANCELLED", "WAITING_OPERATOR")
    assert ended.state.value == "FAILED", ended.reason
    assert ended.payments_handled_at_ms is not None
    assert balance(shop) == OPENING_BALANCE
    assert len(_refund_requests(shop)) == 1 and len(shop.gateway.refunds) == 1


def test_twin_payments_handled_accepted_while_the_refund_task_is_queued(
    shop: PaymentShop,
) -> None:
    task_id, refund_task, queue, _ = _waiting_with_a_queued_refund(shop)
    with sabotage(PAYMENTS_HANDLED_WHILE_UNDO_TASK_QUEUED):
        accepted = cancel(shop.app, task_id, HANDLED, payments_handled=True)
    assert accepted.payments_handled_at_ms is not None, "the operator's word recorded"
    with shop.worker(queues=[shop.app.conf.task_default_queue, queue]):
        shop.wait_state(refund_task, "COMPLETED")
    # After the operator said the card was dealt with, the queued task refunded it too:
    # with a refund by hand (the fake refuses a second full refund) that is two refunds.
    assert len(_refund_requests(shop)) == 1 and len(shop.gateway.refunds) == 1
