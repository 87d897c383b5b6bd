"""``python -m tests.example.charge_statuses DIR DATABASE_URL``: the shop's charges answered
at a status that took no money yet, and what the shop marked each order; as JSON on stdout.

Run in a process of its own (by ``test_charge_statuses.py``), as ``refund_statuses.py``
is: ``example_project.shop`` reads its settings from the environment when imported. Every
status runner here starts from ``shop_on_fake_stripe`` (the fake Stripe, the shop's
environment, its tables, ``bound_app``) and ``StripeIntents``.

The fake's PaymentIntents all succeed at once; Stripe answers a create-and-confirm with
HTTP 200 at ``requires_action`` (3-D Secure) or ``processing`` too, nothing received yet.
So the Stripe dialect here renders each PaymentIntent with what the test says Stripe
would show (``StripeIntents``), over the fake's own object. Each flow that marks an order
paid (``charge_order``, ``place_order``, ``approve_large_order``, the assistant's charge
tool, ``ship_part``, ``spend_budget``, ``pay_attempt``) and ``authorize_order`` charges one
order of 1000 usd so answered; then ``payment_intent.succeeded`` webhooks, applied by
``handle_stripe_event``, name another PaymentIntent of the same order (smaller, or in
another currency), then the order's own once Stripe shows it succeeded. Each task runs in
this thread (``apply``).
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from celery import Celery
from sqlalchemy import Engine

import celery_agboss.testing.dialects.stripe as stripe_dialect
import celery_agboss.testing.dialects.stripe_wire as stripe_wire
from celery_agboss import AGBoss
from celery_agboss.testing.clock import VirtualClock
from celery_agboss.testing.dialects.stripe import StripeDialect
from celery_agboss.testing.gateway import FakeGateway
from celery_agboss.testing.gateway_server import FakeGatewayServer

AMOUNT = 1000
UNPAID = {
    "requires_action": {"status": "requires_action", "amount_received": 0},
    "processing": {"status": "processing", "amount_received": 0},
}
NOT_HELD = {"status": "requires_action", "amount_capturable": 0}  # an authorisation's 3-D Secure


class StripeIntents:
    """What Stripe shows of each PaymentIntent, where the test changes it: ``next`` for
    the next one created (its create's answer and every later read), ``changed`` by id.
    ``original``: another of the fake's renderings (a refund's) to change the same way."""

    def __init__(
        self, original: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None
    ) -> None:
        self.original = stripe_wire.render_intent if original is None else original
        self.changed: dict[str, dict[str, Any]] = {}
        self.next: dict[str, Any] = {}
        self._seen: set[str] = set()

    def render(self, receipt: Mapping[str, Any]) -> dict[str, Any]:
        shown = self.original(receipt)
        if shown["id"] not in self._seen:  # a PaymentIntent is first rendered by its create
            self._seen.add(shown["id"])
            if self.next:
                self.changed[shown["id"]], self.next = self.next, {}
        return {**shown, **self.changed.get(shown["id"], {})}


@dataclass(frozen=True)
class FakeStripeShop:
    """``example_project.shop`` on the test's store, its Stripe SDK talking to a fake
    Stripe (``shop_on_fake_stripe``): what every status runner here starts from."""

    gateway: FakeGateway
    app: Celery

    @property
    def runtime(self) -> AGBoss:
        return AGBoss.of(self.app)

    @property
    def engine(self) -> Engine:
        return self.runtime.store.engine

    def place(self, case: str) -> str:
        """A new order of ``AMOUNT`` usd named after ``case``; its id."""
        from example_project import orders

        order_id = f"{case}-{uuid.uuid4().hex[:6]}"
        with self.engine.begin() as conn:
            orders.place(conn, order_id, AMOUNT)
        return order_id

    def ledger(self, order_id: str) -> list[str]:
        """The order's ledger entries, in order."""
        from example_project import orders

        with self.engine.connect() as conn:
            return [entry for entry, _ in orders.entries(conn, order_id)]

    def another_intent(
        self, order_id: str, amount: int = AMOUNT, currency: str = "usd", *, shops: bool = False
    ) -> str:
        """A succeeded PaymentIntent naming the order, made outside the shop's tasks (a
        duplicate, an older attempt; with ``shops``, the shop's checkout page, marked as
        the shop marks its own); its id."""
        from example_project import shop

        metadata = {"reference": order_id, **({shop.SHOP_CHARGE: order_id} if shops else {})}
        params: Any = {
            "amount": amount,
            "currency": currency,
            "payment_method": "pm_card_visa",
            "confirm": True,
            "metadata": metadata,
        }
        return str(shop.stripe.client.v1.payment_intents.create(params=params).id)

    def webhook(self, kind: str, payment_id: str) -> str:
        """Stripe's event ``kind`` about the PaymentIntent (``charge.refunded`` names its
        charge), applied by ``handle_stripe_event``; the event's id."""
        from celery_agboss.webhooks import WebhookEvent
        from example_project import shop

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
        return event.event_id


@contextmanager
def shop_on_fake_stripe(
    data_dir: Path,
    database_url: str,
    intents: StripeIntents | None = None,
    *,
    clock: VirtualClock | None = None,
) -> Iterator[FakeStripeShop]:
    """A fake Stripe server, the shop's environment pointed at it, every table of the
    shop's (``migrate.run``; the assistant's budgets too) and ``shop.app`` bound to the
    store, for the block. ``intents``, when given, renders every PaymentIntent (a
    create's answer, retrieve, capture, cancel, list, search); ``clock`` moves the
    store's clock (a dead delivery's lease expires). ``example_project`` reads its
    settings when imported: import its modules inside the block."""
    if intents is not None:
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
        from celery_agboss.testing.celery_app import bound_app
        from example_project import assistant, migrate, shop

        assert assistant  # imported before migrating: its budgets table is made too
        offset = None if clock is None else clock.offset_ms
        with bound_app(shop.app, migrate.run(), clock_offset_source=offset) as app:
            yield FakeStripeShop(gateway, app)


def _flows(world: FakeStripeShop) -> dict[str, Callable[[str], Any]]:
    """Each flow that marks an order paid, started for an order: its task's result."""
    from sqlalchemy import insert

    from celery_agboss import answer_pause
    from example_project import assistant, shop

    def approved(order_id: str) -> Any:
        task_id = f"approve-{order_id}"
        shop.approve_large_order.apply((order_id,), task_id=task_id)  # paused
        answer_pause(world.app, f"{task_id}:approve", {"approved": True, "by": "ops"})
        return shop.approve_large_order.apply((order_id,), task_id=task_id)

    def spend(order_id: str) -> Any:
        with world.engine.begin() as conn:
            budget = {"customer": order_id, "remaining": 5000}
            conn.execute(insert(assistant.budgets).values(**budget))
        return assistant.spend_budget.apply((order_id, order_id))

    tool_calls = [{"tool": "charge", "amount": AMOUNT}]
    return {
        "charge_order": lambda o: shop.charge_order.apply((o,)),
        "place_order": lambda o: shop.place_order.apply((o,)),
        "approve_large_order": approved,
        "assistant_session": lambda o: assistant.assistant_session.apply((o, tool_calls)),
        "ship_part": lambda o: assistant.ship_part.apply((o, "lid")),
        "spend_budget": spend,
        "pay_attempt": lambda o: assistant.pay_attempt.apply((o,)),
    }


def run(data_dir: Path, database_url: str) -> dict[str, Any]:
    intents = StripeIntents()
    with shop_on_fake_stripe(data_dir, database_url, intents) as world:
        from example_project import orders, shop

        with world.engine.begin() as conn:
            orders.stock_up(conn, "mug", 10)

        def charges() -> int:
            return sum(1 for r in world.gateway.requests if r.operation == "charge")

        def webhook(payment_id: str) -> str:
            """Stripe's ``payment_intent.succeeded`` for the PaymentIntent, applied."""
            return world.webhook("payment_intent.succeeded", payment_id)

        seen: dict[str, Any] = {"flows": {}, "webhooks": {}}
        flows = _flows(world)
        for status, shown in UNPAID.items():
            for flow, start in flows.items():
                order_id = world.place(f"{flow}-{status}")
                before = charges()
                intents.next = dict(shown)
                result = start(order_id)
                row = shop._read(order_id)
                seen["flows"][f"{flow}:{status}"] = {
                    "succeeded": result.successful(),
                    "status": row["status"],
                    "ledger": world.ledger(order_id),
                    "charge_requests": charges() - before,
                }

        # An authorisation answered requires_action holds nothing: the order is not
        # authorized until Stripe says requires_capture (its webhook).
        order_id = world.place("authorize_order-requires_action")
        intents.next = dict(NOT_HELD)
        authorization = shop.authorize_order.apply((order_id,)).get()
        after_authorize = shop._read(order_id)["status"]
        intents.changed[authorization["id"]] = {}
        webhook(authorization["id"])
        seen["authorize_order"] = {
            "after_authorize": after_authorize,
            "after_webhook": shop._read(order_id)["status"],
            "ledger": world.ledger(order_id),
        }

        # Webhooks for charge_order's order, left unpaid by its requires_action answer.
        order_id = world.place("webhooks-requires_action")
        intents.next = dict(UNPAID["requires_action"])
        own = shop.charge_order.apply((order_id,)).get()["id"]
        named = {
            "smaller": world.another_intent(order_id, AMOUNT - 600, "usd"),
            "other_currency": world.another_intent(order_id, AMOUNT, "eur"),
            "own_still_requires_action": own,
        }
        for case, payment_id in named.items():
            webhook(payment_id)
            seen["webhooks"][case] = shop._read(order_id)["status"]
        intents.changed[own] = {}  # the customer authenticated: Stripe shows succeeded
        webhook(own)
        row = shop._read(order_id)
        seen["webhooks"]["own_succeeded"] = row["status"]
        seen["webhooks"]["payment_id_is_own"] = row["payment_id"] == own
        seen["webhooks"]["ledger"] = world.ledger(order_id)
    return seen


if __name__ == "__main__":
    print(json.dumps(run(Path(sys.argv[1]).resolve(), sys.argv[2])))
