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

MODE ``race:before-note`` / ``race:after-note``: the customer confirms again while the
checkout gives up, after its final reading (``requires_payment_method``) and before its
``checkout:<status>`` note commits, or after that commit and before the checkout ends
(the capture its give-up enqueued has then read Stripe already, nothing held). The event
is taken as an early answer to the next wait (``3ds-2``), which the checkout never
waits on. Every capture published (by the give-up's outbox row, by ``web``) runs. A
``+without-outbox-capture`` or ``+without-capture-when-answered`` suffix switches off
the give-up's capture or ``web``'s capture of an authorisation a wait took (as before).
"""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
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
    with _outbox_captures() as enqueued:
        states.append(_checkout(world, order_id))
    gave_up = {"status": shop._read(order_id)["status"], "ledger": world.ledger(order_id)}
    # The capture the give-up enqueued, run before the customer confirms again: nothing held.
    gave_up["capture"] = [_capture(order_id, payment_id, task_id) for task_id in enqueued]

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
        results.append(_capture(order_id, payment_id, task_id))
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


def _capture(order_id: str, payment_id: str, task_id: str) -> str:
    """Run the capture execution ``task_id`` here: Stripe's status it captured, or why not."""
    from example_project import shop

    done = shop.capture_retried_checkout.apply((order_id, payment_id), task_id=task_id)
    answer = done.get() if done.successful() else {"failed": True}
    return str(answer.get("status") or f"not_captured:{answer.get('not_captured')}")


@contextmanager
def _outbox_captures() -> Iterator[list[str]]:
    """The task ids of the captures published in the block other than ``web``'s."""
    from celery.signals import before_task_publish

    from example_project import shop

    seen: list[str] = []

    def published(sender: str | None = None, headers: Any = None, **_: Any) -> None:
        task_id = str((headers or {}).get("id"))
        if sender == shop.capture_retried_checkout.name and not task_id.startswith("retried-"):
            seen.append(task_id)

    before_task_publish.connect(published, weak=False)
    try:
        yield seen
    finally:
        before_task_publish.disconnect(published)


def _race(world: FakeStripeShop, intents: StripeIntents, when: str) -> dict[str, Any]:
    """The customer confirms again while the checkout gives up (``when``: before or after
    its note commits); every capture published runs, then Stripe's events are applied."""
    from example_project import shop, web

    order_id = world.place(f"3ds-race-{when}")
    intents.next = dict(AUTHENTICATING)
    states = [_checkout(world, order_id)]
    payment_id = str(shop._read(order_id)["payment_id"])
    intents.changed[payment_id] = dict(FAILED)
    _webhook(order_id, payment_id, "payment_intent.payment_failed", FAILED["status"])
    published: list[str] = []
    ran: list[str] = []

    def confirmed_again(enqueued: list[str]) -> None:
        if enqueued:  # after the note: the capture it enqueued ran first (a worker's)
            worker = threading.Thread(
                target=lambda: ran.extend(_capture(order_id, payment_id, t) for t in enqueued)
            )
            worker.start()
            worker.join(timeout=60)
            assert not worker.is_alive(), "the give-up's capture did not end within 60 s"
        intents.changed[payment_id] = {}  # authenticated: Stripe shows requires_capture
        event_id = f"evt_{uuid.uuid4().hex[:24]}"
        body, signature = _signed(order_id, payment_id, web.AUTHENTICATED, event_id)
        published.extend(web.stripe_webhook(body, signature)[1]["published"])

    with _outbox_captures() as enqueued, _during_give_up(when, confirmed_again, enqueued):
        states.append(_checkout(world, order_id))
    captures = [*enqueued, *(task_id for task_id in published if task_id.startswith("retried-"))]
    ran += [_capture(order_id, payment_id, task_id) for task_id in captures[len(ran) :]]
    world.webhook(web.AUTHENTICATED, payment_id)
    return {
        "states": states,
        "outbox_captures": len(enqueued),
        "web_captures": len(captures) - len(enqueued),
        "results": ran,
        "status": shop._read(order_id)["status"],
        "ledger": world.ledger(order_id),
        "requests": _requests(world, payment_id),
    }


@contextmanager
def _during_give_up(
    when: str, confirmed_again: Callable[[list[str]], None], enqueued: list[str]
) -> Iterator[None]:
    """``confirmed_again`` runs inside the checkout's give-up: after its final reading
    (``before-note``), or once its note and outbox row committed (``after-note``)."""
    from example_project import shop

    task: Any = shop.app.tasks[shop.checkout_3ds.name]
    reading = shop._outcome_reading

    def final_reading(*args: Any) -> str:
        status = str(reading(*args))
        if status == FAILED["status"]:
            confirmed_again([])
        return status

    def noted(name: str, *args: Any, **kwargs: Any) -> Any:
        result = type(task).fenced_effect(task, name, *args, **kwargs)
        if name == "3ds-not-captured":
            confirmed_again(list(enqueued))
        return result

    if when == "before-note":
        shop._outcome_reading = final_reading
    else:
        task.fenced_effect = noted
    try:
        yield
    finally:
        shop._outcome_reading = reading
        task.__dict__.pop("fenced_effect", None)


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


def _switched_off(switch: str) -> None:
    """The fix's two halves, each put back as it was: no capture enqueued by the give-up,
    or ``web`` publishing a capture only for an authorisation no wait took."""
    from example_project import shop, web

    if switch == "without-outbox-capture":
        shop.outbox = SimpleNamespace(enqueue=lambda conn, signature: "")  # type: ignore[assignment]
    elif switch == "without-capture-when-answered":
        answer, capture = web.answer_checkout, web._capture_if_retried
        answered: list[bool] = []

        def answering(*args: Any) -> bool:
            answered.append(answer(*args))
            return answered[-1]

        web.answer_checkout = answering
        web._capture_if_retried = lambda o, e: [] if answered and answered[-1] else capture(o, e)


def run(data_dir: Path, database_url: str, mode: str) -> dict[str, Any]:
    intents = StripeIntents()
    with shop_on_fake_stripe(data_dir, database_url, intents) as world:
        from example_project import web

        if mode.startswith("race:"):
            when, _, switch = mode.removeprefix("race:").partition("+")
            _switched_off(switch)
            return _race(world, intents, when)
        if mode == "without-retry":
            web._capture_if_retried = lambda order_id, event: []
        return {"retried": _retried(world, intents), "not_a_checkout": _not_a_checkout(world)}


if __name__ == "__main__":
    mode = sys.argv[3] if len(sys.argv) > 3 else "protected"
    print(json.dumps(run(Path(sys.argv[1]).resolve(), sys.argv[2], mode)))
