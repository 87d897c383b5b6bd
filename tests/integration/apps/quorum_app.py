"""The integration shop on a RabbitMQ quorum queue with a small ``delivery-limit``.

The test's queue is declared ``x-queue-type: quorum`` with ``x-delivery-limit`` =
``config["delivery_limit"]`` (here and in the workers alike, so neither declaration
refuses the other's): the broker counts each hand-back of a message and drops it past
the limit, as RabbitMQ 4.0 does by default at 20.

The worker runs ``celery -A tests.integration.apps.quorum_app:app`` with the config in
``AGBOSS_IT_QUORUM_CONFIG``.
"""

from __future__ import annotations

from typing import Any

from celery import Celery
from kombu import Exchange, Queue

from tests.integration.apps.shop import app_from_environment
from tests.integration.apps.shop import make_app as make_shop_app

CONFIG_ENV = "AGBOSS_IT_QUORUM_CONFIG"


def make_app(config: dict[str, Any]) -> Celery:
    app = make_shop_app(config)
    name = config["queue"]
    arguments = {"x-queue-type": "quorum", "x-delivery-limit": int(config["delivery_limit"])}
    app.conf.task_queues = [
        Queue(name, Exchange(name), routing_key=name, durable=True, queue_arguments=arguments)
    ]
    return app


app = app_from_environment(CONFIG_ENV, make_app)
