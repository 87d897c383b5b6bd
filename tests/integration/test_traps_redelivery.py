"""Traps 3, 7 and 13: copies and flags the broker hands out, and why only the store decides.

- Trap 3 (``retry()`` publishes its message before the original is acked, so the
  retry can be delivered while the original holds the lease) is proved in
  ``test_duplicates.py::test_a_retry_delivered_while_the_original_holds_the_lease_is_woken_on_release``:
  the retry copy is deferred with ``wake_requested`` and re-published on release.
- Trap 7: ``redelivered`` cannot be trusted either way. A delivery flagged redelivered
  whose execution the store has never seen runs normally (one send); a first delivery
  (not flagged) of an execution whose intent the store shows PENDING reconciles it
  first (a lookup, nothing sent again).
- Trap 13: on RabbitMQ a channel closed under a running task (``consumer_timeout``, a
  network blip) requeues it; the requeued copy meets the live lease and is deferred,
  never run twice. The twin is plain Celery, which pays twice.

Deployment speed-ups it relies on: the harness's (``-Q``, a 5 s lease, no beat:
tests/integration/harness.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import redis
from celery import Celery

from celery_agboss.core.execution_context import ExecutionContext
from celery_agboss.errors import OutboundCallOutcomeUnknownError
from celery_agboss.testing.gateway import FakeGatewayFault
from tests.integration.broker_proxy import BrokerProxy
from tests.integration.harness import Shop, ShopFactory

pytestmark = [pytest.mark.worker, pytest.mark.slow]


# --- trap 7 ----------------------------------------------------------------------------


def _flag_queued_message_redelivered(shop: Shop) -> None:
    """Mark the one message waiting in the test queue as redelivered, as kombu's Redis
    transport does when it restores an unacked message (``delivery_info.redelivered``)."""
    client = redis.Redis.from_url(shop.config["broker_url"])
    try:
        queue = shop.config["queue"]
        raw = client.rpop(queue)
        assert raw is not None, "the message is in the queue"
        payload = json.loads(raw)
        payload["headers"]["redelivered"] = True
        payload["properties"]["delivery_info"]["redelivered"] = True
        client.rpush(queue, json.dumps(payload))
    finally:
        client.close()


@pytest.mark.redis
def test_trap_7_a_redelivered_flag_with_nothing_in_the_store_runs_the_body_normally(
    shop_factory: ShopFactory,
) -> None:
    shop = shop_factory()
    # Published by a client without celery_agboss: the store has never heard of it.
    bare = Celery("bare-client", broker=shop.config["broker_url"])
    try:
        task_id = str(
            bare.send_task("it.charge_order", args=("o-31",), queue=shop.config["queue"]).id
        )
    finally:
        bare.close()
    assert shop.execution(task_id) is None
    _flag_queued_message_redelivered(shop)
    shop.start_worker()
    record = shop.wait_state(task_id, "COMPLETED", timeout=30)
    starts = shop.gateway.notes_of("body-start", task_id)
    assert [note.fields["redelivered"] for note in starts] == [True], "Celery said redelivered"
    gateway = shop.gateway.gateway
    assert (len(gateway.requests), len(gateway.payments)) == (1, 1), "sent, once"
    assert gateway.lookups == [], "nothing to reconcile: the store shows no attempt"
    assert record.recovery_count == 0


@pytest.mark.redis
def test_trap_7_a_first_delivery_of_an_execution_with_a_pending_intent_reconciles_first(
    shop_factory: ShopFactory,
) -> None:
    shop = shop_factory()
    gateway = shop.gateway.gateway
    task_id = "trap-7-pending"
    # An earlier delivery (here: the engine in the test process) charged and lost the
    # answer: its intent is PENDING in the store, and its lease was released.
    call = shop.agboss.engine_settings.call_named("it.charge")
    assert call is not None
    gateway.inject_fault(FakeGatewayFault.ANSWER_THEN_DROP)
    ctx = ExecutionContext.start(shop.agboss.store, task_id, shop.agboss.engine_settings)
    with pytest.raises(OutboundCallOutcomeUnknownError):
        ctx.outbound(call, {"amount": 1000, "order": "o-32"}, business_key="order:o-32")
    assert ctx.release(), "the earlier delivery ended"
    assert (len(gateway.requests), len(gateway.payments)) == (1, 1)
    # A first delivery: a fresh message, not flagged redelivered.
    shop.start_worker()
    signature = shop.app.signature("it.charge_order", args=("o-32",))
    signature.apply_async(task_id=task_id)
    record = shop.wait_state(task_id, "COMPLETED", timeout=30)
    starts = shop.gateway.notes_of("body-start", task_id)
    assert [note.fields["redelivered"] for note in starts] == [False]
    ends = shop.gateway.notes_of("body-end", task_id)
    assert [note.fields["outcome"] for note in ends] == ["Outcome.RECONCILED"]
    assert (len(gateway.requests), len(gateway.payments)) == (1, 1), "looked up, never resent"
    assert len(gateway.lookups) >= 1
    shop.wait_backend(task_id, "SUCCESS")
    assert shop.app.AsyncResult(task_id).result["payment"] == gateway.payments[0]["id"]
    assert record.deliveries == 1


# --- trap 13 ---------------------------------------------------------------------------


@pytest.fixture
def rabbit_shop(shop_factory: ShopFactory, rabbitmq_url: str) -> Iterator[tuple[Shop, BrokerProxy]]:
    """A RabbitMQ shop whose worker's connection goes through a proxy the test can cut:
    RabbitMQ then closes its channel and requeues what it held unacknowledged."""
    shop = shop_factory(broker_url=rabbitmq_url)
    with BrokerProxy.for_url(rabbitmq_url) as proxy:
        shop.start_worker(config={"broker_url": proxy.url_for(rabbitmq_url)})
        yield shop, proxy


@pytest.mark.rabbitmq
def test_trap_13_a_channel_closed_under_a_running_charge_defers_the_requeued_copy(
    rabbit_shop: tuple[Shop, BrokerProxy],
) -> None:
    shop, proxy = rabbit_shop
    gateway = shop.gateway.gateway
    task_id, record = shop.cut_under_a_running_charge(proxy, "o-33", timeout=30)
    starts = shop.gateway.notes_of("body-start", task_id)
    assert len(starts) == 1, "the requeued copy never ran the body"
    assert (len(gateway.requests), len(gateway.payments)) == (1, 1)
    assert record.recovery_count == 0


@pytest.mark.rabbitmq
def test_trap_13_without_agboss_a_requeued_running_charge_pays_twice(
    rabbit_shop: tuple[Shop, BrokerProxy],
) -> None:
    shop, proxy = rabbit_shop
    task_id, _ = shop.cut_under_a_plain_charge(proxy, "o-33", timeout=30)
    starts = shop.gateway.notes_of("body-start", task_id)
    assert len(starts) == 2
