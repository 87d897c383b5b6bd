"""The outbox's task ids across re-runs, effects and executions, in a worker thread.

A follow-up enqueued in a fenced effect is named by the effect's key and its position
in ``fn``: the re-run that replays the effect writes nothing and names the same task;
two effects of one name in one run name two tasks; a business-keyed effect names one
task whichever execution ran it. Outside a fenced effect the application names the
task by its key and publishes it after its own commit. Every follow-up here is a
``PaymentTask`` and runs once.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from celery_agboss import outbox
from celery_agboss.delivery.outcomes import decode_result
from celery_agboss.store.schema_executions import outbox as outbox_table
from celery_agboss.testing.gateway_types import FakeGatewayFault
from tests.delivery.conftest import PaymentShop


class _RolledBack(Exception):
    pass


def _receipts(shop: PaymentShop) -> tuple[Any, list[str]]:
    """A follow-up task that notes the id of each run of its body."""
    ran: list[str] = []

    @shop.task()
    def send_receipt(self: Any, order: str) -> str:
        ran.append(str(self.request.id))
        return order

    return send_receipt, ran


def _rows_of(shop: PaymentShop, execution_id: str) -> list[str]:
    with shop.agboss.store.read_transaction() as tx:
        found = tx.execute(
            select(outbox_table.c.task_id).where(outbox_table.c.execution_id == execution_id)
        ).scalars()
        return [str(task_id) for task_id in found]


def test_a_rerun_replays_the_effect_and_enqueues_nothing_new(shop: PaymentShop) -> None:
    send_receipt, ran = _receipts(shop)
    charge = shop.call()

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        def mark_paid(conn: Any) -> str:
            session = Session(bind=conn, join_transaction_mode="create_savepoint")
            return outbox.enqueue(session, send_receipt.s(order))

        receipt_task = self.fenced_effect("mark-paid", mark_paid)
        self.outbound(charge, {"amount": 1000, "order": order}, business_key=order)
        return receipt_task

    # The charge's answer is lost: the delivery ends unknown, its retry runs the body again.
    shop.gateway.inject_fault(FakeGatewayFault.ANSWER_THEN_DROP, operation="charge")
    with shop.worker():
        task_id = str(pay.delay("o-1").id)
        record = shop.wait_state(task_id, "COMPLETED")
        receipt_task = decode_result(record.result)
        shop.wait_state(receipt_task, "COMPLETED")
    assert record.deliveries == 2, "the body ran twice"
    assert _rows_of(shop, task_id) == [receipt_task], "one row"
    assert ran == [receipt_task], "one receipt"
    assert len(shop.gateway.payments) == 1


def test_effects_name_their_follow_ups_by_position_or_by_business_key(shop: PaymentShop) -> None:
    send_receipt, ran = _receipts(shop)

    @shop.task()
    def pay(self: Any, order: str) -> list[str]:
        def note(suffix: str) -> Any:
            return lambda conn: outbox.enqueue(conn, send_receipt.s(order + suffix))

        return [
            self.fenced_effect("note", note("-a")),
            self.fenced_effect("note", note("-b")),  # the same name again: #2
            self.fenced_effect("paid", note(""), business_key=f"order:{order}"),
        ]

    with shop.worker():
        first, second = (str(pay.delay("o-1").id) for _ in range(2))
        results = [decode_result(shop.wait_state(t, "COMPLETED").result) for t in (first, second)]
        follow_ups = {task_id for result in results for task_id in result}
        for task_id in follow_ups:
            shop.wait_state(task_id, "COMPLETED")
    assert len(set(results[0])) == 3, "two effects of one name name two tasks"
    assert results[0][2] == results[1][2], "one business key, one task, whoever ran it"
    assert len(follow_ups) == 5
    assert sorted(ran) == sorted(follow_ups), "each ran once"
    assert outbox.count_unpublished(shop.app) == 0


def test_the_applications_own_transaction_is_published_after_its_commit(
    shop: PaymentShop,
) -> None:
    send_receipt, ran = _receipts(shop)
    engine = shop.agboss.store.engine
    with pytest.raises(_RolledBack), engine.begin() as conn:
        lost = outbox.enqueue(conn, send_receipt.s("o-1"), key="receipt:o-1")
        raise _RolledBack()
    assert outbox.publish(shop.app, lost) == [], "a rolled-back row is never published"
    with engine.begin() as conn:
        task_id = outbox.enqueue(conn, send_receipt.s("o-1"), key="receipt:o-1")
    with shop.worker():
        assert outbox.publish(shop.app, task_id) == [task_id]
        shop.wait_state(task_id, "COMPLETED")
    assert outbox.publish(shop.app, task_id) == [], "published once"
    assert ran == [task_id]
