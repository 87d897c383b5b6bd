"""``cancel --payments-handled`` is still refused a week after the refund's own undo task
was published, while that task is queued: retention has deleted the outbox row the
refusal first looked at, and the task's own execution row (its ``agboss_undo_of`` header
names the order) still says it may refund. Real workers on both stores, counted at the
fake gateway.

The order debited the wallet (undo: credit it) and charged the card (undo:
``refund_payment.s(payment)``, on a queue no worker consumes yet), then failed: the
refund task is published, the wallet's credit refused (the ledger is down). Eight days
pass and a sweep runs retention. ``--payments-handled`` is refused, naming the task,
nothing recorded; once the task refunded, it is accepted and the credit runs: one refund.
Twin ``undo-tasks-found-by-outbox-only``: accepted once the outbox row is gone, and the
task, still queued, then refunds the charge the operator said was dealt with.

Speed-up: the virtual clock moves the database past the 7-day outbox retention.
"""

from __future__ import annotations

from sqlalchemy import select

from celery_agboss.core.protections import UNDO_TASKS_FOUND_BY_OUTBOX_ONLY
from celery_agboss.operator import cancel
from celery_agboss.store.schema_executions import outbox
from celery_agboss.testing import sabotage
from tests.delivery.conftest import PaymentShop
from tests.delivery.wallet_orders import (
    HANDLED,
    OPENING_BALANCE,
    QueuedRefund,
    balance,
    order_with_a_queued_refund_task,
    task_refund_requests,
)
from tests.operations.handled_orders import refused_naming

PAST_RETENTION = 8 * 24 * 3600  # seconds: past the 7-day retention of published rows


def _queued_past_retention(shop: PaymentShop) -> QueuedRefund:
    """The order waits for an operator, its refund task queued; eight days pass and a
    sweep runs retention: the outbox row is gone, the task still queued."""
    queued = order_with_a_queued_refund_task(shop)
    shop.clock.advance(PAST_RETENTION)
    shop.sweep()
    with shop.agboss.store.transaction() as tx:
        rows = tx.execute(select(outbox.c.task_id).where(outbox.c.task_id == queued.task)).all()
    assert rows == [], "retention deleted the published outbox row"
    assert shop.execution(queued.task).state.value == "REQUESTED"
    return queued


def test_payments_handled_refused_while_the_refund_task_is_queued_past_retention(
    shop: PaymentShop,
) -> None:
    queued = _queued_past_retention(shop)
    record = refused_naming(shop, queued.order, queued.task)
    assert record.payments_handled_at_ms is None and not record.cancel_requested
    assert record.state.value == "WAITING_OPERATOR"
    # The task refunds; then the confirmation is accepted and the credit runs, once.
    queued.ledger_up.set()
    with shop.worker(queues=[shop.app.conf.task_default_queue, queued.queue]):
        shop.wait_state(queued.task, "COMPLETED")
        moved = cancel(shop.app, queued.order, HANDLED, payments_handled=True)
        assert moved.state.value == "COMPENSATING"
        shop.sweep()
        ended = shop.wait_state(queued.order, "FAILED", "CANCELLED", "WAITING_OPERATOR")
    assert ended.state.value == "FAILED", ended.reason
    assert balance(shop) == OPENING_BALANCE
    assert len(task_refund_requests(shop)) == 1 and len(shop.gateway.refunds) == 1


def test_twin_outbox_only_accepts_past_retention_and_the_task_refunds_after_it(
    shop: PaymentShop,
) -> None:
    with sabotage(UNDO_TASKS_FOUND_BY_OUTBOX_ONLY):
        queued = _queued_past_retention(shop)
        accepted = cancel(shop.app, queued.order, HANDLED, payments_handled=True)
    assert accepted.payments_handled_at_ms is not None, "the operator's word recorded"
    with shop.worker(queues=[shop.app.conf.task_default_queue, queued.queue]):
        shop.wait_state(queued.task, "COMPLETED")
    # After the operator said the card was dealt with (refunded by hand), the queued task
    # refunded it too: with the refund by hand (the fake would refuse a second full one),
    # two refunds.
    assert len(task_refund_requests(shop)) == 1 and len(shop.gateway.refunds) == 1
