"""``python -m tests.example.settle_and_3ds_statuses DIR DATABASE_URL settle|3ds``: the shop's
``settle_authorization`` answered at statuses that took (or released) nothing, and its
``checkout_3ds`` reading a status still pending after the return page answered; what the
shop did, as JSON on stdout.

Run in a process of its own (by ``test_settle_and_3ds_statuses.py``), as
``charge_statuses.py`` is: ``example_project.shop`` reads its settings from the
environment when imported. The Stripe dialect renders each PaymentIntent with what the
test says Stripe would show (``StripeIntents``), over the fake's own object.

- Settle: each order of 1000 usd is authorised (``authorize_order``, Stripe holding it),
  then Stripe is made to show the PaymentIntent as the case says and
  ``settle_authorization`` captures or voids it.
- 3-D Secure: the authorisation shows ``requires_action``; the return page
  (``web.returned``) answers the checkout's wait before Stripe decided, the checkout runs
  again; then Stripe shows ``requires_capture`` and its signed
  ``payment_intent.amount_capturable_updated`` reaches ``web.stripe_webhook``. Another
  checkout stays ``processing`` through every wait the return page answers, until an
  operator answers the next one. Each delivery runs in this thread (``apply``).
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import celery_agboss.testing.dialects.stripe as stripe_dialect
import celery_agboss.testing.dialects.stripe_wire as stripe_wire
from celery_agboss.testing.dialects.stripe import StripeDialect
from celery_agboss.testing.gateway import FakeGateway
from celery_agboss.testing.gateway_server import FakeGatewayServer
from tests.example.charge_statuses import StripeIntents

AMOUNT = 1000
SETTLE_CASES: dict[str, tuple[str, dict[str, Any]]] = {
    # case: (action, what Stripe shows of the PaymentIntent from the settle's request on)
    "capture_processing": ("capture", {"status": "processing", "amount_received": 0}),
    "capture_short": ("capture", {"amount_received": AMOUNT - 600}),
    "capture_other_currency": ("capture", {"currency": "eur"}),
    "capture_succeeded": ("capture", {}),
    "void_not_canceled": ("void", {"status": "requires_capture"}),
    "void_canceled": ("void", {}),
}
AUTHENTICATING = {"status": "requires_action", "amount_capturable": 0}


def run(data_dir: Path, database_url: str, section: str) -> dict[str, Any]:
    intents = StripeIntents()
    stripe_wire.render_intent = intents.render  # a create's answer (``charge_answer``)
    stripe_dialect.render_intent = intents.render  # retrieve, capture, cancel, search
    gateway = FakeGateway(capabilities=StripeDialect.documented_capabilities)
    with FakeGatewayServer(gateway, dialect=StripeDialect()) as server:
        os.environ.update(
            EXAMPLE_DATA_DIR=str(data_dir),
            AGBOSS_DATABASE_URL=database_url,
            CELERY_BROKER_URL="memory://",
            STRIPE_API_BASE=server.url,
        )
        from celery_agboss import AGBoss, answer_pause
        from celery_agboss.operator import read_pause
        from celery_agboss.testing.celery_app import bound_app
        from celery_agboss.webhooks import sign_stripe
        from example_project import config, migrate, orders, shop, web

        url = migrate.run()
        with bound_app(shop.app, url) as app:
            runtime = AGBoss.of(app)
            engine = runtime.store.engine

            def order_of(case: str) -> str:
                order_id = f"{case}-{uuid.uuid4().hex[:6]}"
                with engine.begin() as conn:
                    orders.place(conn, order_id, AMOUNT)
                return order_id

            def ledger(order_id: str) -> list[str]:
                with engine.connect() as conn:
                    return [entry for entry, _ in orders.entries(conn, order_id)]

            def requests(payment_id: str) -> list[list[str]]:
                fake_id = stripe_wire.payment_id_of(payment_id)
                return [
                    [r.operation, r.outcome.value]
                    for r in gateway.requests
                    if r.operation != "charge" and r.payment_id == fake_id
                ]

            seen: dict[str, Any] = {"settle": {}, "3ds": {}}
            for case, (action, shown) in SETTLE_CASES.items() if section == "settle" else ():
                order_id = order_of(case)
                payment_id = shop.authorize_order.apply((order_id,)).get()["id"]
                intents.changed[payment_id] = dict(shown)
                result = shop.settle_authorization.apply((order_id, action))
                seen["settle"][case] = {
                    "succeeded": result.successful(),
                    "status": shop._read(order_id)["status"],
                    "ledger": ledger(order_id),
                    "requests": requests(payment_id),
                }

            def checkout(order_id: str) -> str:
                """One delivery of the order's checkout; the execution's state after it."""
                task_id = web.task_id_of(order_id)
                shop.checkout_3ds.apply((order_id,), task_id=task_id)
                record = runtime.executions.read_execution(task_id)
                assert record is not None
                return str(record.state.value)

            def authenticated(order_id: str, payment_id: str) -> Any:
                """Stripe's signed ``amount_capturable_updated``, posted to the endpoint."""
                event = {
                    "id": f"evt_{uuid.uuid4().hex[:24]}",
                    "object": "event",
                    "created": int(time.time()),
                    "type": web.AUTHENTICATED,
                    "data": {
                        "object": {
                            "id": payment_id,
                            "object": "payment_intent",
                            "status": "requires_capture",
                            "metadata": {"reference": order_id},
                        }
                    },
                }
                body = json.dumps(event).encode()
                return web.stripe_webhook(body, sign_stripe(body, config.stripe_webhook_secret()))

            if section != "3ds":
                return seen
            # The return page answers before the bank did; the webhook says it authorised.
            order_id = order_of("3ds-pending")
            intents.next = dict(AUTHENTICATING)
            states = [checkout(order_id)]
            payment_id = str(shop._read(order_id)["payment_id"])
            answered = [web.returned(order_id)[1]["answered"]]
            states.append(checkout(order_id))
            intents.changed[payment_id] = {}  # the customer authenticated: requires_capture
            status, _ = authenticated(order_id, payment_id)
            states.append(checkout(order_id))
            seen["3ds"]["pending_then_authorised"] = {
                "states": states,
                "return_page_answered": answered,
                "webhook_status": status,
                "status": shop._read(order_id)["status"],
                "ledger": ledger(order_id),
                "requests": requests(payment_id),
            }

            # Stripe stays processing through every wait the return page answers.
            order_id = order_of("3ds-bound")
            intents.next = {"status": "processing", "amount_capturable": 0}
            states = [checkout(order_id)]
            payment_id = str(shop._read(order_id)["payment_id"])
            answered = []
            for _ in range(shop.OUTCOME_ROUNDS):
                answered.append(web.returned(order_id)[1]["answered"])
                states.append(checkout(order_id))
            answered.append(web.returned(order_id)[1]["answered"])  # the operator's wait
            operator_name = shop.outcome_pause(shop.OUTCOME_ROUNDS + 1)
            operator_wait = f"{web.task_id_of(order_id)}:{operator_name}"
            pause = read_pause(app, operator_wait)
            payload = None if pause is None else pause.payload
            asks = json.loads(payload) if isinstance(payload, str) else payload
            requests_before = requests(payment_id)
            intents.changed[payment_id] = {}
            if pause is not None and pause.status == "PENDING":
                answer_pause(app, operator_wait, {"by": "ops"})
            states.append(checkout(order_id))
            seen["3ds"]["bound"] = {
                "states": states,
                "return_page_answered": answered,
                "operator_wait": None if pause is None else pause.status,
                "operator_told": bool(asks and "processing" in str(asks.get("operator"))),
                "requests_before_operator": requests_before,
                "status": shop._read(order_id)["status"],
                "ledger": ledger(order_id),
                "requests": requests(payment_id),
            }
    return seen


if __name__ == "__main__":
    print(json.dumps(run(Path(sys.argv[1]).resolve(), sys.argv[2], sys.argv[3])))
