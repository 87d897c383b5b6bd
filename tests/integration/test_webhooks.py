"""PS15 on real worker processes: one webhook delivered twice, and on two workers at once.

Each delivery is its own execution, published by the shop's endpoint
(``tests.integration.apps.webhook_app.receive``) once the Stripe-style signature passed;
the event's effect is applied in a fenced effect under ``event:stripe:<event id>`` and
every application is counted in the shop's ``wh_events_applied`` table. Two workers get
the same event at the same moment (both held at a gate, then let go together), a third
copy comes later: one application. The twin (``webhook-event-not-keyed``) applies
every copy. A forged, stale or modified webhook is refused at the endpoint with
nothing published or recorded.

Deployment speed-ups it relies on: the harness's (``-Q``, a 5 s lease, no beat:
tests/integration/harness.py); workers are started together, each with one pool child.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from celery_agboss.core.protections import EVENT_NOT_KEYED
from celery_agboss.operator import list_executions
from celery_agboss.webhooks import WebhookEvent, WebhookSignatureError, sign_stripe
from tests.integration.apps import webhook_app
from tests.integration.gateway_http import wait_for
from tests.integration.harness import Shop, ShopFactory
from tests.support.processes import ManagedProcess

pytestmark = [pytest.mark.worker, pytest.mark.redis, pytest.mark.slow]

WebhookShopFactory = Callable[..., Shop]
GATE = "webhook-copies"


@pytest.fixture
def webhook_shop(shop_factory: ShopFactory) -> WebhookShopFactory:
    """``webhook_shop(database_url=…) -> Shop`` whose app (here and in its workers) is
    ``webhook_app``'s, with its ``wh_events_applied`` table created."""

    def build(database_url: str | None = None) -> Shop:
        shop = shop_factory(database_url=database_url, app_module=webhook_app)
        webhook_app.create_tables(shop.app)
        return shop

    return build


def start_workers(shop: Shop, count: int, sabotage: tuple[str, ...] = ()) -> list[ManagedProcess]:
    """``count`` webhook_app workers (one pool child each), started together."""
    started = [
        shop.start_worker(concurrency=1, sabotage=sabotage, ready=False) for _ in range(count)
    ]
    for process in started:
        shop.wait_ready(process)
    return started


def signed_webhook(event_id: str, signed_at: float | None = None) -> tuple[bytes, dict[str, str]]:
    body = json.dumps(
        {
            "id": event_id,
            "type": "payment_intent.succeeded",
            "data": {"object": {"id": f"pi_{event_id}", "status": "succeeded"}},
        }
    ).encode()
    at = int(time.time() if signed_at is None else signed_at)
    return body, {"Stripe-Signature": sign_stripe(body, webhook_app.STRIPE_SECRET, at)}


def event_of(event_id: str) -> WebhookEvent:
    return WebhookEvent("stripe", event_id, "payment_intent.succeeded", f"pi_{event_id}")


def outcome(shop: Shop, task_id: str) -> dict[str, Any]:
    shop.wait_state(task_id, "COMPLETED", timeout=20)
    shop.wait_backend(task_id, "SUCCESS", timeout=10)
    result: dict[str, Any] = shop.app.AsyncResult(task_id).result
    return result


def deliver_three_copies(
    shop: Shop, event_id: str, sabotage: tuple[str, ...] = ()
) -> tuple[list[tuple[str, int]], list[dict[str, Any]]]:
    """Two workers given the same webhook at the same moment, then a third copy later:
    every application of the event, and each copy's result (the concurrent two first)."""
    workers = start_workers(shop, 2, sabotage=sabotage)
    body, headers = signed_webhook(event_id)
    copies = [webhook_app.receive(shop.app, body, headers, gate_name=GATE) for _ in range(2)]
    waiting: list[int] = wait_for(
        lambda: len(shop.gateway.gate_waiters(GATE)) == 2 and shop.gateway.gate_waiters(GATE),
        15,
        "both copies to reach the gate",
    )
    children = [set(shop.children(worker)) for worker in workers]
    assert all(any(pid in group for pid in waiting) for group in children), (
        f"one copy in each worker process at once (gate: {waiting}, workers: {children})"
    )
    shop.gateway.open_gate(GATE)
    results = [outcome(shop, task_id) for task_id in copies]
    results.append(outcome(shop, webhook_app.receive(shop.app, body, headers)))
    return webhook_app.times_applied(shop.app, event_of(event_id)), results


def test_a_webhook_delivered_on_two_workers_at_once_and_again_later_is_applied_once(
    webhook_shop: WebhookShopFactory, database_url: str
) -> None:
    shop = webhook_shop(database_url=database_url)
    applied, results = deliver_three_copies(shop, "evt_twice")
    assert len(applied) == 1, f"applied once, not {applied}"
    assert sorted(copy["duplicate"] for copy in results[:2]) == [False, True]
    assert results[2]["duplicate"] is True, "the later copy got the stored result"
    assert {copy["applied_by"] for copy in results} == {applied[0][0]}


def test_without_the_events_business_key_the_copies_are_applied_three_times(
    webhook_shop: WebhookShopFactory,
) -> None:
    """The twin: each delivery's effect keyed by its own execution, so every copy applies."""
    shop = webhook_shop()
    applied, results = deliver_three_copies(shop, "evt_unkeyed", sabotage=(EVENT_NOT_KEYED,))
    assert len(applied) == 3
    assert [copy["duplicate"] for copy in results] == [False, False, False]


def test_a_forged_stale_or_modified_webhook_is_refused_with_nothing_recorded(
    webhook_shop: WebhookShopFactory,
) -> None:
    shop = webhook_shop()
    body, headers = signed_webhook("evt_refused")
    _, stale_headers = signed_webhook("evt_refused", signed_at=time.time() - 3600)
    forged = {"Stripe-Signature": f"t={int(time.time())},v1={'0' * 64}"}
    modified = body.replace(b"succeeded", b"failed")
    for what, raw, sent in [
        ("forged", body, forged),
        ("stale", body, stale_headers),
        ("modified", modified, headers),
        ("unsigned", body, {}),
    ]:
        with pytest.raises(WebhookSignatureError) as excinfo:
            webhook_app.receive(shop.app, raw, sent)
        assert excinfo.value.gateway == "stripe", what
    assert list_executions(shop.app) == [], "no execution recorded"
    assert webhook_app.rows_applied(shop.app) == 0
    assert shop.broker_holds_nothing(), "nothing published"
    # The same endpoint records a genuine one (so the emptiness above is the refusals').
    task_id = webhook_app.receive(shop.app, body, headers)
    assert [record.id for record in list_executions(shop.app)] == [task_id]
