"""``python -m tests.example.one_disposition DIR DATABASE_URL CASE``: two routes meeting on one
authorisation (PaymentIntent), in either order; what the shop did, as JSON on stdout.

Run in a process of its own (by ``test_one_disposition.py``), as ``checkout_3ds_retry.py``
is: ``example_project.shop`` reads its settings from the environment when imported. Each
delivery runs here (``apply``); the one that comes "meanwhile" runs in a thread of its
own, as another worker's, while the first waits at the point the case names.

- ``shipment:checkout-first``: a 3-D Secure checkout authorises, the customer
  authenticates, the return page answers, the checkout captures and marks the order
  paid; then fulfilment captures shipment 1 (600) of the same PaymentIntent.
- ``shipment:shipment-first``: the same checkout, but shipment 1 (600) is captured
  after the checkout read ``requires_capture`` and before it captures.
- ``cancel:capture-first``: the checkout gives up (3-D Secure failed), the customer
  confirms the PaymentIntent again (Stripe holds the amount), ``capture_retried_checkout``
  captures it; then the customer cancels (``settle_authorization(order, "void")``).
- ``cancel:void-first``: the same, but the cancel runs, void and all, after the retried
  capture read Stripe holding the amount and before it captures.

- ``refused-shipment:capture`` / ``refused-shipment:void``: fulfilment authorises 1000,
  Stripe refuses shipment 1's capture (1500, more than authorised), then fulfilment
  captures the order whole, or the customer cancels.
- ``refused-shipment:in-flight``: the same refused shipment, then shipment 2 (600) is
  captured, and fulfilment's whole capture runs after shipment 2 noted it is shipping and
  before it is sent.

A ``+without-one-record`` suffix switches the one record off: every route takes its
disposition as its own (``shop.dispose`` answering the route's action); a
``+without-shipping-note`` suffix lets a shipment send without noting ``shipping``.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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

SHIPMENT = 600  # of the order's 1000


def _state(world: FakeStripeShop, task_id: str) -> str:
    record = world.runtime.executions.read_execution(task_id)
    return "none" if record is None else str(record.state.value)


def _run(task: Any, arguments: tuple[Any, ...], task_id: str) -> Any:
    """One delivery of ``task`` here: its result, or ``failed`` with the error's type."""
    done = task.apply(arguments, task_id=task_id)
    return done.get() if done.successful() else {"failed": type(done.result).__name__}


def _meanwhile(work: Callable[[], Any]) -> Any:
    """``work`` on another thread (another worker's delivery), to its end: its answer."""
    answers: list[Any] = []
    worker = threading.Thread(target=lambda: answers.append(work()))
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), "the other delivery did not end within 60 s"
    return answers[0]


@contextmanager
def _after_effect(task: Any, effect: str, then: Callable[[], Any]) -> Iterator[list[Any]]:
    """``then`` runs (once, on another thread) right after ``task``'s fenced effect
    ``effect`` returns; what it answered is in the list yielded."""
    seen: list[Any] = []

    def fenced_effect(name: str, *args: Any, **kwargs: Any) -> Any:
        result = type(task).fenced_effect(task, name, *args, **kwargs)
        if name == effect and not seen:
            seen.append(_meanwhile(then))
        return result

    task.fenced_effect = fenced_effect
    try:
        yield seen
    finally:
        task.__dict__.pop("fenced_effect", None)


def _then_or_meanwhile(
    task: Any, effect: str, first: Callable[[], Any], second: Callable[[], Any], meanwhile: bool
) -> tuple[Any, Any]:
    """What ``first`` and ``second`` answered: ``second`` run once ``first`` ended, or
    (``meanwhile``) right after ``task``'s fenced effect ``effect`` in ``first``."""
    if not meanwhile:
        return first(), second()
    with _after_effect(task, effect, second) as seen:
        answered = first()
    return answered, (seen[0] if seen else None)


def _authenticated_checkout(world: FakeStripeShop, intents: StripeIntents, case: str) -> str:
    """A checkout paused for 3-D Secure, its customer authenticated since (Stripe holds the
    amount) and the return page answered; the order's id."""
    from example_project import shop, web

    order_id = world.place(case)
    intents.next = dict(AUTHENTICATING)
    assert _checkout(world, order_id) == "PAUSED"
    intents.changed[str(shop._read(order_id)["payment_id"])] = {}  # requires_capture
    assert web.returned(order_id)[1]["answered"] is True
    return order_id


def _shipment(world: FakeStripeShop, intents: StripeIntents, first: str) -> dict[str, Any]:
    from example_project import shop, web

    order_id = _authenticated_checkout(world, intents, f"shipment-{first}")
    payment_id = str(shop._read(order_id)["payment_id"])

    def ship() -> Any:
        return _run(shop.capture_shipment, (order_id, 1, SHIPMENT), f"ship-{order_id}")

    checkout: Any = shop.app.tasks[shop.checkout_3ds.name]
    checkout_id = web.task_id_of(order_id)

    def capture() -> Any:
        return _run(shop.checkout_3ds, (order_id,), checkout_id)

    meanwhile = first != "checkout-first"
    captured, shipped = _then_or_meanwhile(checkout, "3ds-outcome", capture, ship, meanwhile)
    return {
        "checkout": _state(world, checkout_id),
        "checkout_result": _keys(captured),
        "shipment": _state(world, f"ship-{order_id}"),
        "shipment_result": _keys(shipped),
        **_captured(world, order_id, payment_id),
    }


def _captured(world: FakeStripeShop, order_id: str, payment_id: str) -> dict[str, Any]:
    """The order's status and ledger, the requests about its PaymentIntent and what
    Stripe captured of it."""
    from example_project import shop

    return {
        "status": shop._read(order_id)["status"],
        "ledger": world.ledger(order_id),
        "requests": _requests(world, payment_id),
        "captured": world.gateway.retrieve(_fake(payment_id))["amount_captured"],
    }


def _keys(answer: Any) -> Any:
    """A task's answer as the test compares it: a PaymentIntent (a capture's or a void's
    answer) by its status, a refund by that word, a refusal or a failure whole."""
    if isinstance(answer, dict) and "object" in answer:
        return answer.get("status")
    if isinstance(answer, dict) and "refunded" in answer:
        return "refunded"
    return answer


def _fake(payment_id: str) -> str:
    import celery_agboss.testing.dialects.stripe_wire as stripe_wire

    return str(stripe_wire.payment_id_of(payment_id))


def _given_up_then_confirmed(world: FakeStripeShop, intents: StripeIntents, case: str) -> str:
    """A checkout that gave up (3-D Secure failed), its PaymentIntent then confirmed again
    by the customer (Stripe holds the amount); the order's id."""
    from example_project import shop

    order_id = world.place(case)
    intents.next = dict(AUTHENTICATING)
    assert _checkout(world, order_id) == "PAUSED"
    payment_id = str(shop._read(order_id)["payment_id"])
    intents.changed[payment_id] = dict(FAILED)
    _webhook(order_id, payment_id, "payment_intent.payment_failed", FAILED["status"])
    assert _checkout(world, order_id) == "COMPLETED"  # gave up: checkout:<status>
    intents.changed[payment_id] = {}  # confirmed again, authenticated: requires_capture
    return order_id


def _cancel(world: FakeStripeShop, intents: StripeIntents, first: str) -> dict[str, Any]:
    from example_project import shop

    order_id = _given_up_then_confirmed(world, intents, f"cancel-{first}")
    payment_id = str(shop._read(order_id)["payment_id"])
    capture_id, cancel_id = f"retried-{order_id}", f"cancel-{order_id}"

    def cancel() -> Any:
        return _run(shop.settle_authorization, (order_id, "void"), cancel_id)

    def capture() -> Any:
        return _run(shop.capture_retried_checkout, (order_id, payment_id), capture_id)

    retried: Any = shop.app.tasks[shop.capture_retried_checkout.name]
    meanwhile = first != "capture-first"
    captured, cancelled = _then_or_meanwhile(
        retried, "retried-checkout", capture, cancel, meanwhile
    )
    return {
        "capture": _state(world, capture_id),
        "capture_result": _keys(captured),
        "cancel": _state(world, cancel_id),
        "cancel_result": _keys(cancelled),
        "status": shop._read(order_id)["status"],
        "ledger": world.ledger(order_id),
        "requests": _requests(world, payment_id),
        "refunds": sum(1 for r in world.gateway.refunds if r["payment"] == _fake(payment_id)),
    }


def _after_refused_shipment(world: FakeStripeShop, then: str) -> dict[str, Any]:
    from example_project import shop

    order_id = world.place(f"refused-shipment-{then}")
    shop.authorize_order.apply((order_id,), task_id=f"auth-{order_id}")
    payment_id = str(shop._read(order_id)["payment_id"])
    refused = _run(shop.capture_shipment, (order_id, 1, 1500), f"ship1-{order_id}")
    settle_id, action = f"settle-{order_id}", "void" if then == "void" else "capture"

    def settle() -> Any:
        return _run(shop.settle_authorization, (order_id, action), settle_id)

    shipped = None
    if then == "in-flight":
        shipping: Any = shop.app.tasks[shop.capture_shipment.name]
        with _after_effect(shipping, "shipping", settle) as seen:
            shipped = _run(shop.capture_shipment, (order_id, 2, SHIPMENT), f"ship2-{order_id}")
        settled = seen[0] if seen else None
    else:
        settled = settle()
        shipped = _run(shop.capture_shipment, (order_id, 2, SHIPMENT), f"ship2-{order_id}")
    return {
        "refused": _keys(refused),
        "settle": _state(world, settle_id),
        "settle_result": _keys(settled),
        "shipment": _state(world, f"ship2-{order_id}"),
        "shipment_result": _keys(shipped),
        **_captured(world, order_id, payment_id),
    }


def run(data_dir: Path, database_url: str, case: str) -> dict[str, Any]:
    intents = StripeIntents()
    case, _, switch = case.partition("+")
    route, _, first = case.partition(":")
    with shop_on_fake_stripe(data_dir, database_url, intents) as world:
        if switch == "without-one-record":
            from example_project import shop
            from example_project.dispositions import Disposition, disposition_key

            # Each route as if alone: every disposition is the route's own, none yields.
            def alone(task: Any, order_id: str, payment_id: str, action: str, **_: Any) -> Any:
                return Disposition(action, disposition_key(payment_id))

            shop.dispose = alone  # type: ignore[assignment]
        if switch == "without-shipping-note":
            from example_project import dispositions

            # Shipment 2 starts unseen: a whole route deciding meanwhile finds none in flight.
            noted = dispositions.start_shipment

            def unseen(task: Any, order_id: str, shipment: int, key: str, first: Any) -> str:
                if shipment == 1:
                    return noted(task, order_id, shipment, key, first)
                return str(task.fenced_effect("shipping", lambda conn: "ship", key))

            dispositions.start_shipment = unseen
        if route == "shipment":
            return _shipment(world, intents, first)
        if route == "refused-shipment":
            return _after_refused_shipment(world, first)
        return _cancel(world, intents, first)


if __name__ == "__main__":
    print(json.dumps(run(Path(sys.argv[1]).resolve(), sys.argv[2], sys.argv[3])))
