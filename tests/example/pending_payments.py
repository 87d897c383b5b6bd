"""``python -m tests.example.pending_payments DIR DATABASE_URL CASE``: money Stripe has not
moved yet (a 3-D Secure authorisation, a charge still processing), and what the shop did
with it; as JSON on stdout.

Run in a process of its own (by ``test_capture_during_3ds_frees_the_authorisation.py`` and
``test_saga_waits_for_its_charge.py``), as ``settle_and_3ds_statuses.py`` is:
``example_project.shop`` reads its settings from the environment when imported. Each
delivery runs here (``apply``); the Stripe dialect renders each PaymentIntent with what
the test says Stripe shows (``StripeIntents``).

- ``3ds:then-capture``: a 3-D Secure checkout authorises (Stripe ``requires_action``,
  nothing held); fulfilment settles the order then (``settle_authorization(order,
  "capture")``), Stripe refuses the capture; the customer authenticates (Stripe holds the
  amount), its webhook answers the checkout's wait and the checkout captures; then the
  customer cancels (``settle_authorization(order, "void")``).
- ``3ds:then-void``: the same refused capture, then the customer authenticates and
  cancels before the checkout captured; Stripe's ``payment_intent.canceled`` answers the
  checkout's wait.
- ``saga:out-of-stock``, ``saga:in-stock``, ``saga:failed``: ``place_order`` charges an order
  (a mug out of stock, or in stock), Stripe answering ``processing``; then Stripe takes the
  money (or the charge fails), its signed webhook reaches ``web.stripe_webhook`` (which
  answers the saga's wait) and ``handle_stripe_event`` applies it; the saga resumes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import celery_agboss.testing.dialects.stripe_wire as stripe_wire
from tests.example.charge_statuses import UNPAID, FakeStripeShop, StripeIntents, shop_on_fake_stripe
from tests.example.settle_and_3ds_statuses import AUTHENTICATING, FAILED, _checkout, _webhook


def _fake(world: FakeStripeShop, payment_id: str) -> dict[str, Any]:
    """The fake Stripe's own PaymentIntent (what Stripe holds)."""
    return dict(world.gateway._objects[stripe_wire.payment_id_of(payment_id)])


def _set_fake_status(world: FakeStripeShop, payment_id: str, status: str) -> None:
    world.gateway._objects[stripe_wire.payment_id_of(payment_id)]["status"] = status


def _run(task: Any, arguments: tuple[Any, ...], task_id: str) -> Any:
    """One delivery: its answer's ``status`` (a PaymentIntent), its answer, or the failure."""
    done = task.apply(arguments, task_id=task_id)
    if not done.successful():
        return {"failed": type(done.result).__name__}
    answer = done.get()
    return answer.get("status", answer) if isinstance(answer, dict) else answer


def _state(world: FakeStripeShop, task_id: str) -> str:
    record = world.runtime.executions.read_execution(task_id)
    return "none" if record is None else str(record.state.value)


def _checkout_3ds(world: FakeStripeShop, intents: StripeIntents, then: str) -> dict[str, Any]:
    from example_project import shop, web

    order_id = world.place(f"3ds-{then}")
    intents.next = dict(AUTHENTICATING)
    states = [_checkout(world, order_id)]
    payment_id = str(shop._read(order_id)["payment_id"])
    while_authenticating = shop._read(order_id)["status"]
    # What Stripe shows from here on is the fake's own PaymentIntent, moved by its status.
    intents.changed[payment_id] = {}
    # Fulfilment settles the order meanwhile; Stripe holds nothing yet and refuses.
    _set_fake_status(world, payment_id, "requires_action")
    settle = _run(shop.settle_authorization, (order_id, "capture"), f"settle-{order_id}")
    cancel_id = f"cancel-{order_id}"
    # The customer authenticates: Stripe holds the amount.
    _set_fake_status(world, payment_id, "requires_capture")
    if then == "void":
        # The customer cancels before the checkout captured: Stripe's event answers.
        cancel = _run(shop.settle_authorization, (order_id, "void"), cancel_id)
        _webhook(order_id, payment_id, "payment_intent.canceled", "canceled")
    else:
        _webhook(order_id, payment_id, web.AUTHENTICATED, "requires_capture")
    states.append(_checkout(world, order_id))
    after_checkout = shop._read(order_id)["status"]
    if then == "capture":
        cancel = _run(shop.settle_authorization, (order_id, "void"), cancel_id)
    fake_id = stripe_wire.payment_id_of(payment_id)
    return {
        "while_authenticating": while_authenticating,
        "settle": settle,
        "settle_state": _state(world, f"settle-{order_id}"),
        "checkout_states": states,
        "after_checkout": after_checkout,
        "cancel": cancel,
        "cancel_state": _state(world, cancel_id),
        "captures": sum(1 for c in world.gateway.captures if c["payment"] == fake_id),
        "refunds": sum(1 for r in world.gateway.refunds if r.get("payment") == fake_id),
        "stripe_status": _fake(world, payment_id)["status"],
        "status": shop._read(order_id)["status"],
        "ledger": world.ledger(order_id),
    }


def _saga(world: FakeStripeShop, intents: StripeIntents, case: str) -> dict[str, Any]:
    from sqlalchemy import select

    from example_project import orders, shop, web

    with world.engine.begin() as conn:
        orders.stock_up(conn, "mug", 0 if case == "out-of-stock" else 1)
    order_id = world.place(f"saga-{case}")
    task_id = web.task_id_of(order_id)
    intents.next = dict(UNPAID["processing"])
    first = _run(shop.place_order, (order_id,), task_id)
    states = [_state(world, task_id)]
    payment_id = str(
        next(ref for entry, ref in _entries(world, order_id) if ref and ref.startswith("pi_"))
    )
    if case == "failed":
        intents.changed[payment_id] = dict(FAILED)
        kind, status = "payment_intent.payment_failed", FAILED["status"]
    else:
        intents.changed[payment_id] = {}  # Stripe took the money: succeeded
        kind, status = "payment_intent.succeeded", "succeeded"
    webhook_status, _ = _webhook(order_id, payment_id, kind, status)  # answers the wait
    world.webhook(kind, payment_id)  # handle_stripe_event, applied
    after_webhook = shop._read(order_id)["status"]
    if states[0] == "PAUSED":
        _run(shop.place_order, (order_id,), task_id)
        states.append(_state(world, task_id))
    with world.engine.connect() as conn:
        left = conn.execute(select(orders.stock.c.quantity)).scalar()
    fake_id = stripe_wire.payment_id_of(payment_id)
    return {
        "first": first,
        "states": states,
        "webhook_status": webhook_status,
        "after_webhook": after_webhook,
        "status": shop._read(order_id)["status"],
        "ledger": world.ledger(order_id),
        "charges": sum(1 for r in world.gateway.requests if r.operation == "charge"),
        "refunds": sum(1 for r in world.gateway.refunds if r.get("payment") == fake_id),
        "stock_left": left,
    }


def _entries(world: FakeStripeShop, order_id: str) -> list[tuple[str, str | None]]:
    from example_project import orders

    with world.engine.connect() as conn:
        return orders.entries(conn, order_id)


def run(data_dir: Path, database_url: str, case: str) -> dict[str, Any]:
    intents = StripeIntents()
    flow, _, variant = case.partition(":")
    with shop_on_fake_stripe(data_dir, database_url, intents) as world:
        if flow == "3ds":
            return _checkout_3ds(world, intents, variant.removeprefix("then-"))
        return _saga(world, intents, variant)


if __name__ == "__main__":
    print(json.dumps(run(Path(sys.argv[1]).resolve(), sys.argv[2], sys.argv[3])))
