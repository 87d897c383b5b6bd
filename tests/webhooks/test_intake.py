"""``record_event`` and ``answer_pause_with_event`` on a real store, one delivery at a time.

Each delivery of a webhook is its own execution (its own task id); the event's effect is
counted in an application table written in the fenced effect's connection. Run here in
the test's thread (``task.apply``) on the plugin's SQLite store; the same on real worker
processes, two at once and on PostgreSQL, is tests/integration/test_webhooks.py.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import Column, Integer, MetaData, String, Table, func, insert, select
from sqlalchemy.engine import Connection

from celery_agboss import AGBoss, IdempotencyKeyConflictError, PaymentTask
from celery_agboss.core.protections import ADYEN_FIELDS_UNCHECKED, EVENT_NOT_KEYED
from celery_agboss.testing import sabotage
from celery_agboss.webhooks import (
    WebhookEvent,
    WebhookPayloadError,
    WebhookSignatureError,
    answer_pause_with_event,
    event_answer,
    record_event,
    sign_adyen_item,
    verify_adyen,
)
from tests.webhooks.signing_keys import ADYEN_KEY, adyen_item

tables = MetaData()
events_applied = Table(
    "wh_unit_events_applied",
    tables,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("event_key", String(200), nullable=False),
    Column("execution_id", String(200), nullable=False),
)

PAID = WebhookEvent("stripe", "evt_1", "payment_intent.succeeded", "pi_1", {"id": "evt_1"})


@pytest.fixture
def agboss_app_config() -> dict[str, Any]:
    """The default 30 s lease, not the test kit's 5 s. These deliveries run in the test's
    thread on SQLite, where a fenced transaction may hold the write lock a quarter of the
    lease (1.25 s with 5 s) before it is rolled back; on a loaded CI machine one first
    delivery's fence, its commit's fsync included, took longer (twice in about six runs:
    ``StoreLockTimeoutError``, the execution left ``RUNNING`` for a worker, as designed).
    No lease expires in this file."""
    return {"agboss_lease_ttl": 30}


@pytest.fixture
def apply_event(agboss_app: Celery) -> Any:
    tables.create_all(AGBoss.of(agboss_app).store.engine)

    @agboss_app.task(base=PaymentTask, bind=True, name="wh.unit.apply_event")  # type: ignore[untyped-decorator]
    def apply_event(self: PaymentTask, message: dict[str, Any]) -> dict[str, Any]:
        event = WebhookEvent.from_message(message)

        def mark_paid(conn: Connection) -> dict[str, Any]:
            conn.execute(
                insert(events_applied).values(
                    event_key=event.business_key, execution_id=self.request.id
                )
            )
            return {"order": event.object_id, "status": "paid"}

        recorded = record_event(self, event, mark_paid)
        return {
            "result": recorded.result,
            "applied_by": recorded.applied_by,
            "duplicate": recorded.duplicate,
        }

    return apply_event


def deliver(task: Any, event: WebhookEvent) -> Any:
    """One webhook delivery: a new execution, as an endpoint publishing it makes."""
    return task.apply(args=(event.to_message(),), task_id=f"wh-{uuid.uuid4().hex}")


def times_applied(app: Celery, event: WebhookEvent) -> int:
    with AGBoss.of(app).store.engine.connect() as conn:
        query = select(func.count()).where(events_applied.c.event_key == event.business_key)
        return int(conn.execute(query).scalar_one())


def test_the_same_event_delivered_twice_is_applied_once(
    agboss_app: Celery, apply_event: Any
) -> None:
    first = deliver(apply_event, PAID).get()
    second = deliver(apply_event, PAID).get()
    assert times_applied(agboss_app, PAID) == 1
    assert first["duplicate"] is False
    assert second == {**first, "duplicate": True}, "the copy gets the stored result back"


def test_without_the_events_business_key_the_duplicate_is_applied_twice(
    agboss_app: Celery, apply_event: Any
) -> None:
    """The twin: each delivery keyed by its own execution applies the event again."""
    with sabotage(EVENT_NOT_KEYED):
        deliver(apply_event, PAID).get()
        second = deliver(apply_event, PAID).get()
    assert times_applied(agboss_app, PAID) == 2
    assert second["duplicate"] is False


def test_two_events_are_two_effects(agboss_app: Celery, apply_event: Any) -> None:
    refunded = WebhookEvent("stripe", "evt_2", "charge.refunded", "pi_1", {})
    deliver(apply_event, PAID).get()
    deliver(apply_event, refunded).get()
    assert times_applied(agboss_app, PAID) == 1
    assert times_applied(agboss_app, refunded) == 1


def test_the_same_event_id_from_another_gateway_is_another_event(
    agboss_app: Celery, apply_event: Any
) -> None:
    elsewhere = WebhookEvent("checkout", "evt_1", "payment_captured", "pay_1", {})
    deliver(apply_event, PAID).get()
    deliver(apply_event, elsewhere).get()
    assert times_applied(agboss_app, elsewhere) == 1


def test_another_event_under_a_recorded_id_is_refused_not_replayed(
    agboss_app: Celery, apply_event: Any
) -> None:
    deliver(apply_event, PAID).get()
    impostor = WebhookEvent("stripe", "evt_1", "charge.refunded", "pi_9", {})
    with pytest.raises(IdempotencyKeyConflictError):
        deliver(apply_event, impostor).get()
    assert times_applied(agboss_app, PAID) == 1


def test_a_pause_answered_by_an_event_twice_is_answered_once(agboss_app: Celery) -> None:
    """The duplicate webhook (or a return page that answered first) is told it came
    second; it is not an error and it moves nothing."""

    @agboss_app.task(base=PaymentTask, bind=True, name="wh.unit.await_outcome")  # type: ignore[untyped-decorator]
    def await_outcome(self: PaymentTask, order: str) -> Any:
        return self.pause("gateway-outcome", {"order": order})

    execution_id = f"order-{uuid.uuid4().hex}"
    await_outcome.apply(args=("o-1",), task_id=execution_id)
    pause_id = f"{execution_id}:gateway-outcome"
    assert answer_pause_with_event(agboss_app, pause_id, PAID) is True
    duplicate = WebhookEvent("stripe", "evt_1", "payment_intent.succeeded", "pi_1", {})
    assert answer_pause_with_event(agboss_app, pause_id, duplicate) is False
    resumed = await_outcome.apply(args=("o-1",), task_id=execution_id).get()
    assert resumed == event_answer(PAID), "the first answer is the one the body gets"
    # The execution is over: an event for a pause it never reached is not kept for it.
    assert answer_pause_with_event(agboss_app, f"{execution_id}:no-such-pause", PAID) is False


# --- an Adyen notification re-split at its unescaped colons --------------------------


def _adyen_notification() -> dict[str, Any]:
    item = adyen_item(merchantReference="order:42")  # a merchant whose references hold a colon
    item["additionalData"] = {"hmacSignature": sign_adyen_item(item, ADYEN_KEY)}
    return item


def _re_split(item: dict[str, Any]) -> dict[str, Any]:
    """The same signed text read at other colons: another pspReference, another event."""
    return {
        **item,
        "pspReference": item["pspReference"] + ":",
        "originalReference": "ShopAccount",
        "merchantAccountCode": "order",
        "merchantReference": "42",
    }


def _adyen_deliveries(task: Any) -> list[str]:
    """The endpoint: verify, then one delivery per event; the refusals' reasons."""
    genuine = _adyen_notification()
    refused = []
    for item in (genuine, _re_split(genuine)):
        body = json.dumps({"notificationItems": [{"NotificationRequestItem": item}]}).encode()
        try:
            events = verify_adyen(body, ADYEN_KEY, merchant_accounts=["ShopAccount"])
        except (WebhookSignatureError, WebhookPayloadError) as exc:
            refused.append(exc.reason)
            continue
        for event in events:
            deliver(task, event).get()
    return refused


def adyen_applications(app: Celery) -> int:
    with AGBoss.of(app).store.engine.connect() as conn:
        query = select(func.count()).where(events_applied.c.event_key.like("event:adyen:%"))
        return int(conn.execute(query).scalar_one())


def test_a_re_split_adyen_notification_is_never_applied_as_a_second_event(
    agboss_app: Celery, apply_event: Any
) -> None:
    """Both readings of the one signed text are refused before anything is published
    (a colon in a signed field), so the one authorisation is never applied twice."""
    assert _adyen_deliveries(apply_event) == ["malformed", "malformed"]
    assert adyen_applications(agboss_app) == 0


def test_without_the_adyen_field_checks_a_re_split_notification_is_applied_twice(
    agboss_app: Celery, apply_event: Any
) -> None:
    """The twin: with the signed fields unchecked, the re-split verifies under another
    event id, and ``record_event`` applies the one authorisation a second time."""
    with sabotage(ADYEN_FIELDS_UNCHECKED):
        assert _adyen_deliveries(apply_event) == []
    assert adyen_applications(agboss_app) == 2
