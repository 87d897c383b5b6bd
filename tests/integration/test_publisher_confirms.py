"""Publisher confirms on RabbitMQ: a follow-up the broker drops is never recorded as sent.

``it.confirms.pay_and_ship`` charges, then enqueues its follow-up ``it.confirms.ship``
(a plain task) through the outbox, on a queue of its own declared
``x-max-length: 1, x-overflow: reject-publish`` and already full
(tests/integration/apps/confirms_app.py): the broker accepts the publish's bytes and
drops the message. ``AGBoss(app)`` turns publisher confirms on (kombu's amqp transport
has them off by default), so the worker's publish is refused, the outbox row stays
unpublished, and once the queue is drained the sweep publishes it: ship runs, the order
is charged once. The twin leaves the transport option unset: the row is marked
published, and ship never runs, nobody told.

The worker is started as the README starts one; the app sets no transport option (the
harness sets none on RabbitMQ). Deployment speed-ups it relies on: the harness's
(``-Q``, ``--without-heartbeat --without-gossip --without-mingle``, a 5 s lease, no
beat, the sweep run by the test every 0.5 s: tests/integration/harness.py) and a 1 s
outbox grace (``outbox.enqueue(grace=1.0)``; 30 s by default).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from kombu import Connection

from celery_agboss import outbox
from celery_agboss.core.protections import PUBLISHER_CONFIRMS_LEFT_UNSET
from celery_agboss.delivery.outcomes import decode_result
from celery_agboss.runtime.broker_defaults import CONFIRM_PUBLISH
from tests.integration.apps import confirms_app
from tests.integration.gateway_http import wait_for
from tests.integration.harness import Shop, ShopFactory

pytestmark = [pytest.mark.worker, pytest.mark.rabbitmq, pytest.mark.slow]

FULL = {"x-max-length": 1, "x-overflow": "reject-publish"}
"""A queue that holds one message and refuses the next publish (RabbitMQ 3.7+)."""

SHIP_SECONDS = 12.0
"""Bound on the follow-up's run once the queue was drained: the shipper is already
ready, the grace (1 s) long past, and the sweep runs every 0.5 s."""

NEVER_SECONDS = 4.0
"""How long the twin watches for a ship that never comes: in the guarded test it runs
within the first sweep after the drain, well under a second here."""


@pytest.fixture
def ship_queue(rabbitmq_url: str) -> Iterator[str]:
    """A queue for the follow-up, declared full: one filler message at its
    ``x-max-length`` of 1. Deleted after the test, with its exchange."""
    name = f"it-ship-{uuid.uuid4().hex[:8]}"
    with Connection(rabbitmq_url, connect_timeout=5) as conn:
        channel = conn.channel()
        channel.queue_declare(name, durable=True, auto_delete=False, arguments=FULL)
        channel.basic_publish(channel.prepare_message(b"filler"), exchange="", routing_key=name)
    yield name
    with Connection(rabbitmq_url, connect_timeout=5) as conn:
        channel = conn.channel()
        channel.queue_delete(name)
        channel.exchange_delete(name)


def _paid_with_the_queue_full(
    shop_factory: ShopFactory, rabbitmq_url: str, ship_queue: str, sabotage: tuple[str, ...]
) -> tuple[Shop, str]:
    """The order paid while its follow-up's queue was full, then the queue drained and a
    worker consuming it started: the shop, and the follow-up's task id."""
    shop = shop_factory(
        broker_url=rabbitmq_url,
        app_module=confirms_app,
        ship_queue=ship_queue,
        ship_queue_arguments=FULL,
    )
    shop.start_worker(sabotage=sabotage)
    task_id = shop.app.signature("it.confirms.pay_and_ship", ("o-1",)).apply_async().id
    record = shop.wait_state(task_id, "COMPLETED", timeout=30)
    ship_task = decode_result(record.result)["ship"]
    with Connection(rabbitmq_url, connect_timeout=5) as conn:
        conn.channel().queue_purge(ship_queue)
    shipper = shop_factory(
        broker_url=rabbitmq_url,
        app_module=confirms_app,
        queue=ship_queue,
        ship_queue=ship_queue,
        ship_queue_arguments=FULL,
    )
    shipper.start_worker()
    return shop, ship_task


def test_a_follow_up_the_broker_dropped_still_runs_once(
    shop_factory: ShopFactory, rabbitmq_url: str, ship_queue: str
) -> None:
    shop, ship_task = _paid_with_the_queue_full(shop_factory, rabbitmq_url, ship_queue, ())
    with shop.sweeping():
        wait_for(lambda: shop.gateway.notes_of("ship"), SHIP_SECONDS, "the follow-up to run")
    assert len(shop.gateway.gateway.payments) == 1
    assert [note.task_id for note in shop.gateway.notes_of("ship")] == [ship_task]
    row = outbox.read(shop.app, ship_task)
    assert row is not None and row.published
    assert row.sweep_publishes == 1, "the worker's refused publish was not recorded as sent"
    assert shop.app.conf.broker_transport_options == {CONFIRM_PUBLISH: True}


def test_without_confirms_a_follow_up_the_broker_dropped_never_runs(
    shop_factory: ShopFactory, rabbitmq_url: str, ship_queue: str
) -> None:
    shop, ship_task = _paid_with_the_queue_full(
        shop_factory, rabbitmq_url, ship_queue, (PUBLISHER_CONFIRMS_LEFT_UNSET,)
    )
    row = outbox.read(shop.app, ship_task)
    assert row is not None and row.published, "the dropped message was recorded as sent"
    with shop.sweeping():
        shop.assert_stays(lambda: not shop.gateway.notes_of("ship"), NEVER_SECONDS)
    assert len(shop.gateway.gateway.payments) == 1, "the order was charged"


def test_a_confirm_publish_the_application_turned_off_is_kept_and_warned_of(
    shop_factory: ShopFactory, rabbitmq_url: str
) -> None:
    shop = shop_factory(broker_url=rabbitmq_url, app_module=confirms_app, confirm_publish=False)
    assert shop.app.conf.broker_transport_options == {CONFIRM_PUBLISH: False}
    with shop.app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1)
        assert conn.connection.confirm_publish is False
    shop.start_worker()
    shop.wait_logged("broker_transport_options['confirm_publish'] is False")
    assert "a message the broker drops after accepting it" in shop.worker_log()


def test_a_publishers_first_connection_confirms(
    shop_factory: ShopFactory, rabbitmq_url: str
) -> None:
    """kombu reads the option when a connection is made: the test process's publish
    pool, made by its first publish, has it."""
    shop = shop_factory(broker_url=rabbitmq_url)
    shop.app.signature("it.charge_order", ("o-9",)).apply_async()
    with shop.app.pool.acquire(block=True) as conn:
        assert conn.transport_options[CONFIRM_PUBLISH] is True
        assert conn.connection.confirm_publish is True
