"""``python -m tests.example.settle_and_3ds_statuses DIR DATABASE_URL SECTION``: the shop's
``settle_authorization`` answered at statuses that took (or released) nothing, and its
``checkout_3ds`` reading a status still pending after the return page answered; what the
shop did, as JSON on stdout.

Run in a process of its own (by ``test_settle_and_3ds_statuses.py``), as
``charge_statuses.py`` is: ``example_project.shop`` reads its settings from the
environment when imported. The Stripe dialect renders each PaymentIntent with what the
test says Stripe would show (``StripeIntents``), over the fake's own object.

- ``settle``: each order of 1000 usd is authorised (``authorize_order``, Stripe holding
  it), then Stripe is made to show the PaymentIntent as the case says and
  ``settle_authorization`` captures or voids it.
- ``cancelled``: the same, captured, then voided (the customer cancels after the capture
  won the disposition: a refund, if the capture took the order's amount).
- ``3ds``: the authorisation shows ``requires_action``; the return page
  (``web.returned``) answers the checkout's wait before Stripe decided, the checkout runs
  again; then Stripe shows ``requires_capture`` and its signed
  ``payment_intent.amount_capturable_updated`` reaches ``web.stripe_webhook``. Another
  checkout stays ``processing`` through every wait the return page answers, until an
  operator answers the next one. Another fails 3-D Secure: Stripe's signed
  ``payment_intent.payment_failed`` answers its wait. Each delivery runs in this thread
  (``apply``).
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import celery_agboss.testing.dialects.stripe_wire as stripe_wire
from tests.example.charge_statuses import (
    AMOUNT,
    FakeStripeShop,
    StripeIntents,
    shop_on_fake_stripe,
)

SETTLE_CASES: dict[str, tuple[str, dict[str, Any]]] = {
    # case: (action, what Stripe shows of the PaymentIntent from the settle's request on)
    "capture_processing": ("capture", {"status": "processing", "amount_received": 0}),
    "capture_short": ("capture", {"amount_received": AMOUNT - 600}),
    "capture_other_currency": ("capture", {"currency": "eur"}),
    "capture_succeeded": ("capture", {}),
    "void_not_canceled": ("void", {"status": "requires_capture"}),
    "void_canceled": ("void", {}),
}
CANCELLED_AFTER_CAPTURE: dict[str, dict[str, Any]] = {
    # case: what Stripe shows of the PaymentIntent from the capture's request on
    "capture_processing": {"status": "processing", "amount_received": 0},
    "capture_short": {"amount_received": AMOUNT - 600},
    "capture_succeeded": {},
}
AUTHENTICATING = {"status": "requires_action", "amount_capturable": 0}
FAILED: dict[str, Any] = {"status": "requires_payment_method", "amount_capturable": 0}


def _requests(world: FakeStripeShop, payment_id: str) -> list[list[str]]:
    """The gateway's requests about the PaymentIntent after its charge: [operation, outcome]."""
    fake_id = stripe_wire.payment_id_of(payment_id)
    return [
        [r.operation, r.outcome.value]
        for r in world.gateway.requests
        if r.operation != "charge" and r.payment_id == fake_id
    ]


def _settled(world: FakeStripeShop, intents: StripeIntents) -> dict[str, Any]:
    """Each ``SETTLE_CASES`` order authorised, Stripe made to show the case, then settled."""
    from example_project import shop

    seen: dict[str, Any] = {}
    for case, (action, shown) in SETTLE_CASES.items():
        order_id = world.place(case)
        payment_id = shop.authorize_order.apply((order_id,)).get()["id"]
        intents.changed[payment_id] = dict(shown)
        result = shop.settle_authorization.apply((order_id, action))
        seen[case] = {
            "succeeded": result.successful(),
            "status": shop._read(order_id)["status"],
            "ledger": world.ledger(order_id),
            "requests": _requests(world, payment_id),
        }
    return seen


def _cancelled(world: FakeStripeShop, intents: StripeIntents) -> dict[str, Any]:
    """The customer cancels after the capture won: the void becomes a refund."""
    from example_project import shop

    seen: dict[str, Any] = {}
    for case, shown in CANCELLED_AFTER_CAPTURE.items():
        order_id = world.place(case)
        payment_id = shop.authorize_order.apply((order_id,)).get()["id"]
        intents.changed[payment_id] = dict(shown)
        shop.settle_authorization.apply((order_id, "capture")).get()
        result = shop.settle_authorization.apply((order_id, "void"))
        seen[case] = {
            "succeeded": result.successful(),
            "answered": sorted(result.get()) if result.successful() else None,
            "status": shop._read(order_id)["status"],
            "ledger": world.ledger(order_id),
            "requests": _requests(world, payment_id),
        }
        if case == "capture_processing":
            # The capture then takes the money, and Stripe's webhook says so: the
            # cancelled order is never paid (to be shipped), noted for a person.
            intents.changed[payment_id] = {}
            world.webhook("payment_intent.succeeded", payment_id)
            seen["captured_after_the_cancel"] = {
                "status": shop._read(order_id)["status"],
                "last": world.ledger(order_id)[-1],
            }
    return seen


def _checkout(world: FakeStripeShop, order_id: str) -> str:
    """One delivery of the order's checkout; the execution's state after it."""
    from example_project import shop, web

    task_id = web.task_id_of(order_id)
    shop.checkout_3ds.apply((order_id,), task_id=task_id)
    record = world.runtime.executions.read_execution(task_id)
    assert record is not None
    return str(record.state.value)


def _webhook(order_id: str, payment_id: str, kind: str, status: str) -> Any:
    """Stripe's signed event ``kind`` about the PaymentIntent, posted to the endpoint."""
    from celery_agboss.webhooks import sign_stripe
    from example_project import config, web

    event = {
        "id": f"evt_{uuid.uuid4().hex[:24]}",
        "object": "event",
        "created": int(time.time()),
        "type": kind,
        "data": {
            "object": {
                "id": payment_id,
                "object": "payment_intent",
                "status": status,
                "metadata": {"reference": order_id},
            }
        },
    }
    body = json.dumps(event).encode()
    return web.stripe_webhook(body, sign_stripe(body, config.stripe_webhook_secret()))


def _authenticated(world: FakeStripeShop, intents: StripeIntents) -> dict[str, Any]:
    """Checkouts whose wait Stripe's webhook answers: authorised after the return page
    answered too early, or failed."""
    from example_project import shop, web

    seen: dict[str, Any] = {}
    # The return page answers before the bank did; the webhook says it authorised.
    order_id = world.place("3ds-pending")
    intents.next = dict(AUTHENTICATING)
    states = [_checkout(world, order_id)]
    payment_id = str(shop._read(order_id)["payment_id"])
    answered = [web.returned(order_id)[1]["answered"]]
    states.append(_checkout(world, order_id))
    intents.changed[payment_id] = {}  # the customer authenticated: requires_capture
    status, _ = _webhook(order_id, payment_id, web.AUTHENTICATED, "requires_capture")
    states.append(_checkout(world, order_id))
    seen["pending_then_authorised"] = {
        "states": states,
        "return_page_answered": answered,
        "webhook_status": status,
        "status": shop._read(order_id)["status"],
        "ledger": world.ledger(order_id),
        "requests": _requests(world, payment_id),
    }

    # The customer failed 3-D Secure: Stripe's payment_failed answers the wait.
    order_id = world.place("3ds-failed")
    intents.next = dict(AUTHENTICATING)
    states = [_checkout(world, order_id)]
    payment_id = str(shop._read(order_id)["payment_id"])
    intents.changed[payment_id] = dict(FAILED)
    failed = "payment_intent.payment_failed"
    status, _ = _webhook(order_id, payment_id, failed, FAILED["status"])
    states.append(_checkout(world, order_id))
    seen["authentication_failed"] = {
        "states": states,
        "webhook_status": status,
        "status": shop._read(order_id)["status"],
        "ledger": world.ledger(order_id),
        "requests": _requests(world, payment_id),
    }
    return seen


def _bound(world: FakeStripeShop, intents: StripeIntents) -> dict[str, Any]:
    """Stripe stays processing through every wait the return page answers."""
    from celery_agboss import answer_pause
    from celery_agboss.operator import read_pause
    from example_project import shop, web

    order_id = world.place("3ds-bound")
    intents.next = {"status": "processing", "amount_capturable": 0}
    states = [_checkout(world, order_id)]
    payment_id = str(shop._read(order_id)["payment_id"])
    answered = []
    for _ in range(shop.OUTCOME_ROUNDS):
        answered.append(web.returned(order_id)[1]["answered"])
        states.append(_checkout(world, order_id))
    answered.append(web.returned(order_id)[1]["answered"])  # the operator's wait
    operator_name = shop.outcome_pause(shop.OUTCOME_ROUNDS + 1)
    operator_wait = f"{web.task_id_of(order_id)}:{operator_name}"
    pause = read_pause(world.app, operator_wait)
    payload = None if pause is None else pause.payload
    asks = json.loads(payload) if isinstance(payload, str) else payload
    requests_before = _requests(world, payment_id)
    intents.changed[payment_id] = {}
    if pause is not None and pause.status == "PENDING":
        answer_pause(world.app, operator_wait, {"by": "ops"})
    states.append(_checkout(world, order_id))
    return {
        "states": states,
        "return_page_answered": answered,
        "operator_wait": None if pause is None else pause.status,
        "operator_told": bool(asks and "processing" in str(asks.get("operator"))),
        "requests_before_operator": requests_before,
        "status": shop._read(order_id)["status"],
        "ledger": world.ledger(order_id),
        "requests": _requests(world, payment_id),
    }


def run(data_dir: Path, database_url: str, section: str) -> dict[str, Any]:
    intents = StripeIntents()
    seen: dict[str, Any] = {"settle": {}, "cancelled": {}, "3ds": {}}
    with shop_on_fake_stripe(data_dir, database_url, intents) as world:
        if section == "settle":
            seen["settle"] = _settled(world, intents)
        elif section == "cancelled":
            seen["cancelled"] = _cancelled(world, intents)
        elif section == "3ds":
            seen["3ds"] = {**_authenticated(world, intents), "bound": _bound(world, intents)}
    return seen


if __name__ == "__main__":
    print(json.dumps(run(Path(sys.argv[1]).resolve(), sys.argv[2], sys.argv[3])))
