"""The integration tests' shop with a webhook endpoint (``-A …apps.webhook_app:app``).

``make_app(config)`` is the shop of ``tests.integration.apps.shop`` plus what a shop's
webhook intake adds: ``receive(app, body, headers)``, the endpoint (verify the Stripe-style
signature, then publish one ``wh.apply_event`` execution per delivery), and the task that
applies the event once, counting each application in ``wh_events_applied`` (written in the
fenced effect's connection). The config comes in ``AGBOSS_WH_CONFIG``, not the shop's
variable, so importing the shop module here builds no second app in the worker.
"""

from __future__ import annotations

import json
import os
import urllib.request
from typing import Any

from celery import Celery
from sqlalchemy import Column, Integer, MetaData, String, Table, func, insert, select
from sqlalchemy.engine import Connection

from celery_agboss import AGBoss, PaymentTask
from celery_agboss.webhooks import WebhookEvent, record_event, verify_webhook
from tests.integration.apps.shop import app_from_environment
from tests.integration.apps.shop import make_app as make_shop_app

CONFIG_ENV = "AGBOSS_WH_CONFIG"
STRIPE_SECRET = "whsec_integration_tests"
GATE_TIMEOUT_SECONDS = 30.0

tables = MetaData()
events_applied = Table(
    "wh_events_applied",
    tables,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("event_key", String(200), nullable=False),
    Column("execution_id", String(200), nullable=False),
    Column("pid", Integer, nullable=False),
)


def create_tables(app: Celery) -> None:
    tables.create_all(AGBoss.of(app).store.engine)


def times_applied(app: Celery, event: WebhookEvent) -> list[tuple[str, int]]:
    """``(execution id, pid)`` of every application of ``event``, in order."""
    with AGBoss.of(app).store.engine.connect() as conn:
        rows = conn.execute(
            select(events_applied.c.execution_id, events_applied.c.pid)
            .where(events_applied.c.event_key == event.business_key)
            .order_by(events_applied.c.id)
        ).all()
    return [(str(row.execution_id), int(row.pid)) for row in rows]


def rows_applied(app: Celery) -> int:
    with AGBoss.of(app).store.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(events_applied)).scalar_one())


def receive(app: Celery, body: bytes, headers: dict[str, str], gate_name: str | None = None) -> str:
    """The shop's webhook endpoint: refuse (raise) before anything is published, else
    publish one execution per event; the task id of the last one."""
    task_id = ""
    for event in verify_webhook("stripe", body, headers, STRIPE_SECRET):
        result = app.signature("wh.apply_event", args=(event.to_message(), gate_name))
        task_id = str(result.apply_async().id)
    return task_id


def _gate(gateway: str, name: str) -> None:
    request = urllib.request.Request(
        gateway + "/gate",
        data=json.dumps({"name": name}).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "X-Worker-Pid": str(os.getpid())},
    )
    with urllib.request.urlopen(request, timeout=GATE_TIMEOUT_SECONDS) as response:
        response.read()


def make_app(config: dict[str, Any]) -> Celery:
    app = make_shop_app(config)

    @app.task(base=PaymentTask, bind=True, shared=False, name="wh.apply_event")  # type: ignore[untyped-decorator]
    def apply_event(
        self: PaymentTask, message: dict[str, Any], gate_name: str | None = None
    ) -> dict[str, Any]:
        event = WebhookEvent.from_message(message)
        if gate_name:  # the test holds every copy here, then lets them go at once
            _gate(config["gateway_url"], gate_name)

        def mark_paid(conn: Connection) -> dict[str, Any]:
            conn.execute(
                insert(events_applied).values(
                    event_key=event.business_key, execution_id=self.request.id, pid=os.getpid()
                )
            )
            return {"order": event.object_id, "status": "paid"}

        recorded = record_event(self, event, mark_paid)
        return {"applied_by": recorded.applied_by, "duplicate": recorded.duplicate}

    return app


app = app_from_environment(CONFIG_ENV, make_app)
