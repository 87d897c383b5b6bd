"""The integration shop plus a payment whose follow-up goes to a queue of its own.

``it.confirms.pay_and_ship`` charges, then in one fenced effect enqueues
``it.confirms.ship`` (a plain task, as docs/outbox.md allows) on the queue
``config["ship_queue"]`` through ``celery_agboss.outbox.enqueue``. A test declares that
queue with ``config["ship_queue_arguments"]`` (RabbitMQ's ``x-max-length`` and
``x-overflow: reject-publish``, say) and fills it, so the broker refuses the follow-up;
a second worker started with ``queue=ship_queue`` consumes it. ``ship`` says at the
gateway (``/note``) each time its body runs.

``config["confirm_publish"]``, when given, is the application's own
``broker_transport_options["confirm_publish"]``; otherwise the app sets no transport
option beyond the harness's.

The worker runs ``celery -A tests.integration.apps.confirms_app:app`` with the config in
``AGBOSS_IT_CONFIRMS_CONFIG``.
"""

from __future__ import annotations

from typing import Any

from celery import Celery
from kombu import Exchange, Queue

from celery_agboss import PaymentTask, outbox
from tests.integration.apps.shop import app_from_environment, gateway_app, shop_charge

CONFIG_ENV = "AGBOSS_IT_CONFIRMS_CONFIG"


def _queue(name: str, arguments: dict[str, Any] | None = None) -> Queue:
    return Queue(name, Exchange(name), routing_key=name, queue_arguments=arguments or {})


def make_app(config: dict[str, Any]) -> Celery:
    app, _, _, note = gateway_app(config, shop_tasks=True)
    ship_queue = config.get("ship_queue") or config["queue"] + "-ship"
    queues = [_queue(ship_queue, config.get("ship_queue_arguments"))]
    if config["queue"] != ship_queue:
        queues.insert(0, _queue(config["queue"]))
    app.conf.task_queues = queues
    if "confirm_publish" in config:
        app.conf.broker_transport_options = {
            **app.conf.broker_transport_options,
            "confirm_publish": config["confirm_publish"],
        }

    @app.task(bind=True, shared=False, name="it.confirms.ship")
    def ship(self: Any, order_id: str) -> str:
        note("ship", self.request.id, order=order_id)
        return order_id

    @app.task(base=PaymentTask, bind=True, shared=False, name="it.confirms.pay_and_ship")
    def pay_and_ship(self: Any, order_id: str) -> dict[str, Any]:
        receipt = shop_charge(self, order_id)

        def mark_paid(conn: Any) -> str:
            return outbox.enqueue(conn, ship.s(order_id).set(queue=ship_queue), grace=1.0)

        return {"payment": receipt["id"], "ship": self.fenced_effect("mark-paid", mark_paid)}

    return app


app = app_from_environment(CONFIG_ENV, make_app)
