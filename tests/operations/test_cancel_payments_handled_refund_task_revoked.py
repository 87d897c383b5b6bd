"""A refund's undo task that its publisher did not record (the worker that ran the
order's undos knew the task by name only), revoked while still queued, is recorded by
the revoke: it waits for an operator, and the order's ``cancel --payments-handled``,
refused while the task may refund, is accepted. Real workers on both stores, counted at
the fake gateway.

The order debited the wallet (undo: credit it) and charged the card (undo: the
signature ``shop.refund_payment``, by name, on a queue no worker consumes yet), then
failed: the refund task is published (no execution row), the wallet's credit refused.
``--payments-handled`` is refused while it is queued. The operator revokes it (a worker
is running, so the worker holds the id revoked); the store records it waiting for an
operator; the operator refunds by hand and confirms; a worker that takes the revoked
message sends nothing. Twin ``revoked-undo-task-not-recorded``: the revoke records
nothing, the message is dropped, and every ``--payments-handled`` stays refused while
the outbox row says queued (a week).
"""

from __future__ import annotations

from typing import Any

from celery import signals as celery_signals
from celery.worker.state import revoked as revoked_ids

from celery_agboss.core.protections import REVOKED_UNDO_TASK_NOT_RECORDED
from celery_agboss.operator import cancel
from celery_agboss.testing import sabotage
from tests.delivery.conftest import PaymentShop, assert_waits_for_an_operator
from tests.delivery.wallet_orders import (
    HANDLED,
    OPENING_BALANCE,
    PRICE,
    QueuedRefund,
    balance,
    order_with_a_queued_refund_task,
    refund_by_hand,
    register_refund_task,
    task_refund_requests,
)
from tests.operations.handled_orders import refused_naming
from tests.support.processes import wait_until


def _refused(shop: PaymentShop, queued: QueuedRefund) -> None:
    assert refused_naming(shop, queued.order, queued.task).payments_handled_at_ms is None


def _revoked_while_queued(shop: PaymentShop) -> QueuedRefund:
    """The order's refund task, published unrecorded and still queued, is revoked while a
    worker runs (it holds the id revoked, as a deployment's workers do)."""
    queued = order_with_a_queued_refund_task(shop, recorded=False)
    assert shop.agboss.executions.read_execution(queued.task) is None, "not recorded"
    _refused(shop, queued)
    with shop.worker():
        shop.app.control.revoke(queued.task)
        wait_until(lambda: queued.task in revoked_ids, 10, message="the worker's revoked set")
    register_refund_task(shop)  # the refunds worker knows it
    return queued


def _taken_by_a_refunds_worker(shop: PaymentShop, queued: QueuedRefund) -> None:
    """A worker consuming the refunds queue (and the default one) takes the revoked
    message, and the order's undos left run to their end."""
    ran: list[str] = []

    def on_postrun(task_id: Any = None, **_: Any) -> None:
        ran.append(str(task_id))

    def on_revoked(request: Any = None, **_: Any) -> None:
        ran.append(str(getattr(request, "id", "")))

    celery_signals.task_postrun.connect(on_postrun, weak=False)
    celery_signals.task_revoked.connect(on_revoked, weak=False)
    try:
        with shop.worker(queues=[shop.app.conf.task_default_queue, queued.queue]):
            wait_until(lambda: queued.task in ran, 10, message="the revoked message taken")
            shop.sweep()
            shop.wait_state(queued.order, "FAILED", "CANCELLED", "WAITING_OPERATOR")
    finally:
        celery_signals.task_postrun.disconnect(on_postrun)
        celery_signals.task_revoked.disconnect(on_revoked)


def test_a_revoked_unrecorded_refund_task_waits_and_the_confirmation_is_accepted(
    shop: PaymentShop,
) -> None:
    queued = _revoked_while_queued(shop)
    assert_waits_for_an_operator(shop.execution(queued.task), "undo task cancelled", queued.order)
    refund_by_hand(shop)
    moved = cancel(shop.app, queued.order, HANDLED, payments_handled=True)
    assert moved.payments_handled_at_ms is not None and moved.state.value == "COMPENSATING"
    queued.ledger_up.set()
    _taken_by_a_refunds_worker(shop, queued)
    assert_waits_for_an_operator(shop.execution(queued.task), "undo task cancelled")
    ended = shop.execution(queued.order)
    assert ended.state.value == "FAILED", ended.reason
    assert balance(shop) == OPENING_BALANCE
    assert task_refund_requests(shop) == [], "the revoked task refunded nothing"
    assert len(shop.gateway.refunds) == 1  # the operator's, by hand


def test_twin_a_revoke_not_recorded_leaves_every_confirmation_refused(shop: PaymentShop) -> None:
    with sabotage(REVOKED_UNDO_TASK_NOT_RECORDED):
        queued = _revoked_while_queued(shop)
        _taken_by_a_refunds_worker(shop, queued)
    # The message was dropped: the task will never refund, and nothing in the store says
    # so. The operator, told to revoke it and wait, is refused still.
    assert shop.agboss.executions.read_execution(queued.task) is None
    _refused(shop, queued)
    assert task_refund_requests(shop) == [] and balance(shop) == OPENING_BALANCE - PRICE
