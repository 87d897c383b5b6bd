"""``python -m tests.example.webhook_own_payment DIR DATABASE_URL``: Stripe's webhooks about
another PaymentIntent of an order, applied by ``handle_stripe_event``, and what the shop
then did; as JSON on stdout.

Run in a process of its own (by ``test_webhook_own_payment.py``), as ``charge_statuses.py``
is: ``example_project.shop`` reads its settings from the environment when imported.

Every PaymentIntent carries the order in its metadata, so a duplicate made elsewhere (the
same amount and currency) names the order as its own does. Cases: a paid order whose
duplicate an operator refunds in full (``charge.refunded``), then the shop's own
``refund_order``; an authorised order whose duplicate succeeded, then its capture; an
order whose charge Stripe answered ``requires_action`` (no ``payment_id`` yet, the
PaymentIntent noted ``charge:requires_action``) whose duplicate succeeded, then its own;
and an order the shop never charged, paid by a PaymentIntent naming it.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import celery_agboss.testing.dialects.stripe as stripe_dialect
import celery_agboss.testing.dialects.stripe_wire as stripe_wire
from celery_agboss.testing.dialects.stripe import StripeDialect
from celery_agboss.testing.dialects.stripe_wire import payment_id_of
from celery_agboss.testing.gateway import FakeGateway
from celery_agboss.testing.gateway_server import FakeGatewayServer
from tests.example.charge_statuses import UNPAID, StripeIntents

AMOUNT = 1000


def run(data_dir: Path, database_url: str) -> dict[str, Any]:
    intents = StripeIntents()
    stripe_wire.render_intent = intents.render  # a create's answer (``charge_answer``)
    stripe_dialect.render_intent = intents.render  # retrieve, capture, list, search
    gateway = FakeGateway(capabilities=StripeDialect.documented_capabilities)
    with FakeGatewayServer(gateway, dialect=StripeDialect()) as server:
        os.environ.update(
            EXAMPLE_DATA_DIR=str(data_dir),
            AGBOSS_DATABASE_URL=database_url,
            CELERY_BROKER_URL="memory://",
            STRIPE_API_BASE=server.url,
        )
        from celery_agboss import AGBoss
        from celery_agboss.testing.celery_app import bound_app
        from celery_agboss.webhooks import WebhookEvent
        from example_project import migrate, orders, shop

        url = migrate.run()
        with bound_app(shop.app, url) as app:
            engine = AGBoss.of(app).store.engine

            def order_of(case: str) -> str:
                order_id = f"{case}-{uuid.uuid4().hex[:6]}"
                with engine.begin() as conn:
                    orders.place(conn, order_id, AMOUNT)
                return order_id

            def duplicate(order_id: str) -> str:
                """A PaymentIntent of the order made elsewhere, same amount, succeeded."""
                params: Any = {
                    "amount": AMOUNT,
                    "currency": "usd",
                    "payment_method": "pm_card_visa",
                    "confirm": True,
                    "metadata": {"reference": order_id},
                }
                return str(shop.stripe.client.v1.payment_intents.create(params=params).id)

            def webhook(kind: str, payment_id: str) -> None:
                """Stripe's event ``kind`` for the PaymentIntent, applied by the shop."""
                if kind == "charge.refunded":
                    about = {"object": "charge", "payment_intent": payment_id, "refunded": True}
                    object_id = "ch_" + payment_id.removeprefix("pi_")
                else:
                    about, object_id = {"object": "payment_intent", "id": payment_id}, payment_id
                event = WebhookEvent(
                    gateway="stripe",
                    event_id=f"evt_{uuid.uuid4().hex[:24]}",
                    type=kind,
                    object_id=object_id,
                    payload={"type": kind, "data": {"object": about}},
                )
                shop.handle_stripe_event.apply((event.to_message(),)).get()

            def order(order_id: str, own: str | None, other: str | None) -> dict[str, Any]:
                """The order as the shop holds it; PaymentIntent ids as ``own`` / ``other``."""
                names = {own: "own", other: "other"}
                row = shop._read(order_id)
                with engine.connect() as conn:
                    ledger = [
                        [entry, names.get(reference, "-")]
                        for entry, reference in orders.entries(conn, order_id)
                    ]
                return {
                    "status": row["status"],
                    "payment_id": names.get(row["payment_id"], row["payment_id"]),
                    "ledger": ledger,
                }

            def requests(operation: str, payment_id: str) -> int:
                """Requests for ``operation`` the gateway received about the PaymentIntent."""
                fake_id = payment_id_of(payment_id)
                return sum(
                    1
                    for r in gateway.requests
                    if r.operation == operation and r.payment_id == fake_id
                )

            seen: dict[str, Any] = {}

            # A paid order; the operator refunds its duplicate in full; then the shop refunds.
            order_id = order_of("refunded-duplicate")
            own = str(shop.charge_order.apply((order_id,)).get()["id"])
            other = duplicate(order_id)
            shop.stripe.client.v1.refunds.create(params={"payment_intent": other})
            webhook("charge.refunded", other)
            after_webhook = order(order_id, own, other)
            refunded = shop.refund_order.apply((order_id,))
            seen["refunded_duplicate"] = {
                "after_webhook": after_webhook,
                "refund_order_succeeded": refunded.successful(),
                "after_refund_order": order(order_id, own, other)["status"],
                "own_refund_requests": requests("refund", own),
                "other_refund_requests": requests("refund", other),
            }

            # An authorised order; a duplicate succeeded; then the shop captures.
            order_id = order_of("authorized-duplicate")
            own = str(shop.authorize_order.apply((order_id,)).get()["id"])
            other = duplicate(order_id)
            webhook("payment_intent.succeeded", other)
            after_webhook = order(order_id, own, other)
            captured = shop.settle_authorization.apply((order_id, "capture"))
            seen["authorized_duplicate"] = {
                "after_webhook": after_webhook,
                "capture_succeeded": captured.successful(),
                "after_capture": order(order_id, own, other)["status"],
                "own_capture_requests": requests("capture", own),
            }

            # A charge answered requires_action: no payment_id yet, its PaymentIntent noted.
            order_id = order_of("pending-duplicate")
            intents.next = dict(UNPAID["requires_action"])
            own = str(shop.charge_order.apply((order_id,)).get()["id"])
            other = duplicate(order_id)
            webhook("payment_intent.succeeded", other)
            after_other = order(order_id, own, other)
            intents.changed[own] = {}  # the customer authenticated: Stripe shows succeeded
            webhook("payment_intent.succeeded", own)
            seen["pending_duplicate"] = {
                "after_other": after_other,
                "after_own": order(order_id, own, other),
            }

            # An order the shop never charged (nothing noted): paid by a PaymentIntent naming it.
            order_id = order_of("never-charged")
            own = duplicate(order_id)
            webhook("payment_intent.succeeded", own)
            seen["never_charged"] = order(order_id, own, None)
    return seen


if __name__ == "__main__":
    print(json.dumps(run(Path(sys.argv[1]).resolve(), sys.argv[2])))
