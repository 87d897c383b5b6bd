"""A step's key has one home: the delivery's ``ExecutionContext`` (``core.step_identity``).

The intent of an outbound call, the record of a fenced effect, the outbox row that
effect writes and the undo declared after each step are all kept under the key the
context made for the step. Here that one function is made to mark every key it makes:
a place that counted the position or derived the key itself would miss the mark, and
its record would part from the others (an undo declared under one key, the payment
kept under another).
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import select

from celery_agboss import outbox
from celery_agboss.core.compensation import read_declarations
from celery_agboss.core.store_protocol import EFFECT_RECORD, INTENT_RECORD
from celery_agboss.outbox import publishing
from celery_agboss.store.schema_executions import outbox as outbox_table
from celery_agboss.task import undo_function
from tests.delivery.conftest import PaymentShop
from tests.engine.helpers import mark_every_step_key

MARK = ":marked"


def test_the_intent_the_effect_the_outbox_row_and_the_undo_share_one_step_key(
    shop: PaymentShop, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = mark_every_step_key(monkeypatch, MARK)
    charge = shop.call()

    @undo_function(shop.app, "nothing-to-undo")
    def nothing_to_undo(task: Any, undo: Any) -> None:
        """Never runs here: the execution completes."""

    @shop.task()
    def follow_up(self: Any, order: str) -> str:
        return order

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        receipt = self.outbound(charge, {"amount": 1000, "order": order})
        self.undo_with("nothing-to-undo")
        task_id = self.fenced_effect(
            "mark-paid", lambda conn: outbox.enqueue(conn, follow_up.s(order))
        )
        self.undo_with("nothing-to-undo")
        return [receipt["id"], task_id]

    with shop.worker():
        execution_id = shop.deliver(pay, "o-1", states=("COMPLETED",))
    call_step, effect_step = [s for s in made if s.kind in (INTENT_RECORD, EFFECT_RECORD)][:2]
    assert (call_step.kind, effect_step.kind) == (INTENT_RECORD, EFFECT_RECORD)
    assert all(step.key.endswith(MARK) for step in (call_step, effect_step))

    store = shop.agboss.store
    assert [intent.idempotency_key for intent in shop.intents(execution_id)] == [call_step.key]
    assert store.read_effect(effect_step.key) is not None, "the effect's record"
    with store.read_transaction() as tx:
        rows = tx.execute(
            select(outbox_table.c.task_id).where(outbox_table.c.execution_id == execution_id)
        ).scalars()
        declared = read_declarations(tx, shop.agboss.engine_settings, execution_id)
        task_ids = [str(task_id) for task_id in rows]
    assert task_ids == [str(uuid.uuid5(publishing._IDS, f"effect/{effect_step.key}/1"))]
    assert [(d.step_key, d.kind) for d in declared] == [
        (call_step.key, INTENT_RECORD),
        (effect_step.key, EFFECT_RECORD),
    ]
