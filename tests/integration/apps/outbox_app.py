"""The integration shop plus a payment that sends its receipt through the outbox.

``it.outbox.pay_order`` charges, then in one fenced effect marks the order paid in the
application's table ``it_outbox_orders`` and enqueues ``it.outbox.send_receipt`` with
``celery_agboss.outbox.enqueue``. Two switches of the test's choosing: the effect raises
after enqueuing (its transaction rolls back), or — on the execution's first delivery
only — the pool child SIGKILLs itself right after the effect committed, before its
publish. The receipt task says at the gateway (``/note``) each time its body runs.

The worker runs ``celery -A tests.integration.apps.outbox_app:app`` with the config in
``AGBOSS_IT_OUTBOX_CONFIG`` (not the shop's variable: the shop module then builds no
app of its own in the worker).
"""

from __future__ import annotations

import os
import signal
from typing import Any

from celery import Celery
from sqlalchemy import text
from sqlalchemy.engine import Engine

from celery_agboss import PaymentTask, outbox
from celery_agboss.core.executions import execution_scope
from celery_agboss.testing.fault_arming import FENCED_AFTER_COMMIT, arm_fault
from tests.integration.apps.shop import app_from_environment, gateway_app, shop_charge

CONFIG_ENV = "AGBOSS_IT_OUTBOX_CONFIG"
ORDERS_TABLE = "it_outbox_orders"


class OrderNotMarkable(Exception):
    """The application's own failure inside the effect, after it enqueued the receipt."""


def create_orders_table(engine: Engine) -> None:
    """The application's table, in the store's database (the outbox's premise)."""
    with engine.begin() as conn:
        conn.execute(
            text(f"CREATE TABLE IF NOT EXISTS {ORDERS_TABLE} (id VARCHAR(64) PRIMARY KEY)")
        )


def _die_after_this_commit(execution_id: str) -> None:
    """SIGKILL this process at the end of the fenced transaction now open: after its
    COMMIT, before anything else (the publish) happens."""
    scope = execution_scope(execution_id)
    arm_fault(
        FENCED_AFTER_COMMIT,
        lambda _context: os.kill(os.getpid(), signal.SIGKILL),
        only=lambda context: context.get("scope") == scope,
    )


def make_app(config: dict[str, Any]) -> Celery:
    app, agboss, _, note = gateway_app(config, shop_tasks=True)
    grace = float(config.get("outbox_grace", 1.0))

    @app.task(base=PaymentTask, bind=True, shared=False, name="it.outbox.send_receipt")
    def send_receipt(self: Any, order_id: str) -> dict[str, str]:
        note("receipt", self.request.id, order=order_id)
        return {"receipt": order_id}

    @app.task(base=PaymentTask, bind=True, shared=False, name="it.outbox.pay_order")
    def pay_order(  # type: ignore[no-untyped-def]
        self: Any, order_id: str, fail_in_effect: bool = False, die_after_commit: bool = False
    ):
        receipt = shop_charge(self, order_id)
        record = agboss.executions.read_execution(self.request.id)
        first_delivery = record is not None and record.deliveries == 1

        def mark_paid(conn: Any) -> str:
            conn.execute(text(f"INSERT INTO {ORDERS_TABLE} (id) VALUES (:id)"), {"id": order_id})
            task_id = outbox.enqueue(conn, send_receipt.s(order_id), grace=grace)
            if fail_in_effect:
                raise OrderNotMarkable(f"order {order_id} cannot be marked paid")
            if die_after_commit and first_delivery:
                _die_after_this_commit(self.request.id)
            return task_id

        receipt_task = self.fenced_effect("mark-paid", mark_paid)
        return {"payment": receipt["id"], "receipt_task": receipt_task}

    return app


app = app_from_environment(CONFIG_ENV, make_app)
