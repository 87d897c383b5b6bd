"""``python -m tests.example.checkout_3ds_retry DIR DATABASE_URL [MODE]``: a 3-D Secure
checkout that gave up (authentication failed), then the customer confirming the same
PaymentIntent again; what the shop did, as JSON on stdout.

Run in a process of its own (by ``test_checkout_3ds_retry.py``), as
``settle_and_3ds_statuses.py`` is: ``example_project.shop`` reads its settings from the
environment when imported. Each delivery runs in this thread (``apply``).

The checkout authorises (Stripe shows ``requires_action``), Stripe's signed
``payment_intent.payment_failed`` answers its wait, and it ends noted
``checkout:requires_payment_method``. The customer then confirms that PaymentIntent
again and authenticates: Stripe shows ``requires_capture`` and sends
``payment_intent.amount_capturable_updated``, delivered twice (one event), while the
customer's return page answers nothing. Every capture execution ``web`` published runs,
then another one as a later event's would, then Stripe's events are applied. An order
authorised by ``authorize_order`` (no checkout) gets the same event, and nothing is
captured. MODE ``without-retry``: ``web`` publishes no capture (as before the fix).
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from tests.example.charge_statuses import FakeStripeShop, StripeIntents, shop_on_fake_stripe
from tests.example.settle_and_3ds_statuses import (
    AUTHENTICATING,
    FAILED,
    _checkout,
    _requests,
    _webhook,
)


def _signed(order_id: str, payment_id: str, kind: str, event_id: str) -> tuple[bytes, str]:
    """Stripe's signed event ``kind`` about the PaymentIntent: its body and signature."""
    from celery_agboss.webhooks import sign_stripe
    from example_project import config

    about = {"id": payment_id, "object": "payment_intent", "metadata": {"reference": order_id}}
    event = {
        "id": event_id,
        "object": "event",
        "created": int(time.time()),
        "type": kind,
        "data": {"object": about},
    }
    body = json.dumps(event).encode()
    return body, sign_stripe(body, config.stripe_webhook_secret())


def _retried(world: FakeStripeShop, intents: StripeIntents) -> dict[str, Any]:
    from example_project import shop, web

    order_id = world.place("3ds-retried")
    intents.next = dict(AUTHENTICATING)
    states = [_checkout(world, order_id)]
    payment_id = str(shop._read(order_id)["payment_id"])
    intents.changed[payment_id] = dict(FAILED)
    _webhook(order_id, payment_id, "payment_intent.payment_failed", FAILED["status"])
    states.append(_checkout(world, order_id))
    gave_up = {"status": shop._read(order_id)["status"], "ledger": world.ledger(order_id)}

    intents.changed[payment_id] = {}  # confirmed again, authenticated: requires_capture
    event_id = f"evt_{uuid.uuid4().hex[:24]}"
    published: list[str] = []
    for _ in range(2):  # Stripe delivers the one event twice
        body, signature = _signed(order_id, payment_id, web.AUTHENTICATED, event_id)
        published += web.stripe_webhook(body, signature)[1]["published"]
    returned = web.returned(order_id)[1]["answered"]
    captures = sorted({task_id for task_id in published if task_id.startswith("retried-")})
    results = []
    later = [f"{task_id}-later" for task_id in captures[:1]]  # as a later event's would
    for task_id in [*captures, *later]:
        done = shop.capture_retried_checkout.apply((order_id, payment_id), task_id=task_id)
        answer = done.get() if done.successful() else {"failed": True}
        results.append(answer.get("status") or f"not_captured:{answer.get('not_captured')}")
    world.webhook(web.AUTHENTICATED, payment_id)
    world.webhook("payment_intent.succeeded", payment_id)
    return {
        "states": states,
        "gave_up": gave_up,
        "return_page_answered": returned,
        "capture_executions": len(captures),
        "results": results,
        "status": shop._read(order_id)["status"],
        "payment_id_is_the_checkouts": shop._read(order_id)["payment_id"] == payment_id,
        "ledger": world.ledger(order_id),
        "requests": _requests(world, payment_id),
    }


def _not_a_checkout(world: FakeStripeShop) -> dict[str, Any]:
    """An authorisation no checkout made: its event publishes no capture."""
    from example_project import shop, web

    order_id = world.place("authorized-only")
    payment_id = str(shop.authorize_order.apply((order_id,)).get()["id"])
    body, signature = _signed(order_id, payment_id, web.AUTHENTICATED, f"evt_{uuid.uuid4().hex}")
    published = web.stripe_webhook(body, signature)[1]["published"]
    return {
        "capture_executions": sum(1 for task_id in published if task_id.startswith("retried-")),
        "status": shop._read(order_id)["status"],
        "requests": _requests(world, payment_id),
    }


def run(data_dir: Path, database_url: str, mode: str) -> dict[str, Any]:
    intents = StripeIntents()
    with shop_on_fake_stripe(data_dir, database_url, intents) as world:
        from example_project import web

        if mode == "without-retry":
            web._capture_if_retried = lambda order_id, event: []
        return {"retried": _retried(world, intents), "not_a_checkout": _not_a_checkout(world)}


if __name__ == "__main__":
    mode = sys.argv[3] if len(sys.argv) > 3 else "protected"
    print(json.dumps(run(Path(sys.argv[1]).resolve(), sys.argv[2], mode)))
