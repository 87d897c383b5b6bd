"""Payment flows around the checkout, as plain Celery: the twins a few scenarios need.

The shop's own tasks (``example_project.shop``) cover these flows already: an approval
is a pause answered once (``approve_large_order``), 3-D Secure is a pause the return page
or the webhook answers (``checkout_3ds``), a retry reconciles before it sends
(``charge_order``). What is here is how the same flows are written without
celery_agboss, with the habits of ``example_project.unprotected`` (``acks_late``,
``reject_on_worker_lost``, ``autoretry_for``): the "unprotected" column of PS11, PS17
and PS21 runs them. Never copy them.
"""

from __future__ import annotations

from typing import Any

from example_project import orders
from example_project.shop import app
from example_project.shop import stripe as adapter
from example_project.unprotected import PLAIN, create_intent, engine, plain_charge_order, read


@app.task(name="plain.approve_large_order", **PLAIN)
def plain_approve_large_order(self: Any, order_id: str, by: str) -> str:
    """An approver pressed "approve": the approval stored, and the charge it allows
    published. Two approvers at once publish two charges (design: PS11)."""
    with engine().begin() as conn:
        orders.note(conn, order_id, "approved", by)
    return str(plain_charge_order.delay(order_id).id)


@app.task(name="plain.checkout_3ds", **PLAIN)
def plain_checkout_3ds(self: Any, order_id: str) -> str:
    """The payment form's submit: a PaymentIntent authorised for the customer to
    authenticate. A second submit authorises a second one (design: PS21)."""
    intent = create_intent(read(order_id), capture=False)
    with engine().begin() as conn:
        orders.move(conn, order_id, "authorized", intent.id)
    return str(intent.id)


@app.task(name="plain.finish_3ds", **PLAIN)
def plain_finish_3ds(self: Any, order_id: str, payment_id: str | None = None) -> str:
    """The customer authenticated (the return page, or the webhook naming its
    PaymentIntent): capture it and mark the order paid, on every report (design: PS21)."""
    payment_id = payment_id or read(order_id)["payment_id"]
    intent = adapter.client.v1.payment_intents.capture(payment_id)
    with engine().begin() as conn:
        orders.mark_paid(conn, order_id, intent.id)
    return str(intent.id)
