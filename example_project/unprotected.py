"""The same shop written as plain Celery: what each scenario's "unprotected" column runs.

Every task here is what a careful Celery user writes without celery_agboss: ``acks_late``
with ``reject_on_worker_lost`` (a killed worker's message comes back), ``autoretry_for`` on
the SDK's connection errors and on a lost database, the official SDK (which gives every
POST a fresh idempotency key of its own) and writes in a transaction of their own. None of
it is wrong on its face; the scenarios show where it charges twice. Never copy it.
"""

from __future__ import annotations

import time
from typing import Any

import stripe as stripe_sdk
from sqlalchemy.exc import OperationalError

from example_project import orders
from example_project.shop import app, payment_request
from example_project.shop import stripe as adapter

RETRIED = (stripe_sdk.APIConnectionError, stripe_sdk.APIError, OperationalError)
PLAIN = {
    "bind": True,
    "acks_late": True,
    "reject_on_worker_lost": True,
    "autoretry_for": RETRIED,
    "retry_kwargs": {"max_retries": 3, "countdown": 0.5},
}


def engine() -> Any:
    from example_project.shop import agboss

    return agboss.store.engine


def read(order_id: str) -> dict[str, Any]:
    with engine().connect() as conn:
        return orders.load(conn, order_id)


def create_intent(
    order: dict[str, Any],
    *,
    capture: bool = True,
    key: str | None = None,
    metadata: dict[str, str] | None = None,
) -> Any:
    """One PaymentIntent, as the SDK sends it: under a new idempotency key every time,
    unless the caller gives its own ``key``; ``metadata`` beside the order's reference."""
    request = payment_request(order)
    return adapter.client.v1.payment_intents.create(
        params={
            "amount": request["amount"],
            "currency": request["currency"],
            "payment_method": request["source"],
            "confirm": True,
            "capture_method": "automatic" if capture else "manual",
            "automatic_payment_methods": {"enabled": True, "allow_redirects": "never"},
            "metadata": {"reference": order["id"], **(metadata or {})},
        },
        options={} if key is None else {"idempotency_key": key},
    )


def refund_intent(payment_id: str) -> Any:
    return adapter.client.v1.refunds.create(params={"payment_intent": payment_id})


@app.task(name="plain.charge_order", **PLAIN)
def plain_charge_order(self: Any, order_id: str) -> str:
    intent = create_intent(read(order_id))
    with engine().begin() as conn:
        orders.mark_paid(conn, order_id, intent.id)
    plain_send_receipt.delay(order_id)
    return str(intent.id)


@app.task(name="plain.charge_order_keyed", **PLAIN)
def plain_charge_order_keyed(self: Any, order_id: str) -> str:
    """A careful plain charge: one idempotency key per order, kept across retries and
    redeliveries. It rests on the gateway's key alone: two senders of it at once get
    the gateway's in-flight answer (design: PS23), and once the gateway forgot the key (24 h at
    Stripe) a redelivery is a new charge (design: PS17)."""
    intent = create_intent(read(order_id), key=f"order:{order_id}")
    with engine().begin() as conn:
        orders.mark_paid(conn, order_id, intent.id)
    return str(intent.id)


@app.task(name="plain.send_receipt", **PLAIN)
def plain_send_receipt(self: Any, order_id: str) -> None:
    with engine().begin() as conn:
        orders.note(conn, order_id, "receipt")


@app.task(name="plain.redrive_stuck_orders", bind=True)
def plain_redrive_stuck_orders(self: Any, order_ids: list[str]) -> list[str]:
    """What a plain app runs on a schedule to finish orders whose worker vanished: the
    orders still not paid are charged again."""
    again = []
    for order_id in order_ids:
        if read(order_id)["status"] == "new":
            plain_charge_order.delay(order_id)
            again.append(order_id)
    return again


@app.task(name="plain.redrive_old_orders", bind=True)
def plain_redrive_old_orders(self: Any, order_ids: list[str], older_than: float) -> list[str]:
    """The same job judging "stuck" by this host's clock: an order unpaid for longer
    than ``older_than`` seconds is charged again."""
    again = []
    for order_id in order_ids:
        order = read(order_id)
        if order["status"] == "new" and time.time() - order["placed_at"] > older_than:
            plain_charge_order.delay(order_id)
            again.append(order_id)
    return again


@app.task(name="plain.place_order", **PLAIN)
def plain_place_order(self: Any, order_id: str) -> str:
    """Charge, reserve; out of stock refunds in the except: plain code's saga."""
    order = read(order_id)
    intent = create_intent(order)
    try:
        with engine().begin() as conn:
            orders.reserve(conn, order_id, order["sku"])
            orders.mark_paid(conn, order_id, intent.id)
    except orders.OutOfStock:
        refund = refund_intent(intent.id)
        with engine().begin() as conn:
            orders.move(conn, order_id, "refunded")
            orders.note(conn, order_id, "refunded", refund.id)
        raise
    return str(intent.id)


@app.task(name="plain.refund_order", **PLAIN)
def plain_refund_order(self: Any, order_id: str) -> str:
    refund = refund_intent(read(order_id)["payment_id"])
    with engine().begin() as conn:
        orders.move(conn, order_id, "refunded")
        orders.note(conn, order_id, "refunded", refund.id)
    return str(refund.id)


@app.task(name="plain.handle_stripe_event", **PLAIN)
def plain_handle_stripe_event(self: Any, message: dict[str, Any]) -> str:
    """Each event's payload applied as it comes."""
    data = (message.get("payload") or {}).get("data", {}).get("object", {})
    order_id = (data.get("metadata") or {}).get("reference")
    kind = str(message.get("type"))
    status = {"payment_intent.succeeded": "paid", "charge.refunded": "refunded"}.get(kind)
    with engine().begin() as conn:
        orders.note(conn, order_id, f"webhook:{kind}", message.get("event_id"))
        if status is not None:
            conn.execute(
                orders.orders.update().where(orders.orders.c.id == order_id).values(status=status)
            )
    return kind
