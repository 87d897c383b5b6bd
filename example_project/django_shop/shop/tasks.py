"""The charge: a ``PaymentTask`` that charges through the Stripe adapter, then marks the
order paid through the ORM in a fenced effect, once Stripe says it took the money.

A redelivery (a killed or frozen worker, a broker's second copy) runs the body again
from the top: the charge is replayed from the store, or reconciled with Stripe when its
answer was lost, never sent blindly again; the ORM write commits once, with the fence.
Stripe is named only to identify its public API; no affiliation or endorsement.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.db.models import F
from django.utils import timezone
from proj.celery import app

from celery_agboss import AGBoss, PaymentTask
from celery_agboss.adapters.stripe import StripeAdapter
from shop.models import Order

stripe = StripeAdapter(settings.STRIPE_API_KEY, base_url=settings.STRIPE_API_BASE)
for call in stripe.calls:
    AGBoss.of(app).register(call)

TEST_CARD = "pm_card_visa"
"""Stripe's test card; a real checkout passes the PaymentMethod its page collected."""

log = logging.getLogger(__name__)


def paid_in_full(result: Mapping[str, Any], order: Order) -> bool:
    """Whether Stripe took the order's money: the PaymentIntent ``succeeded`` with at least
    the order's amount received in its currency (the adapter's result, ISO 4217 minor
    units). Stripe answers a create-and-confirm with HTTP 200 at ``requires_action``
    (3-D Secure) or ``processing`` too, having taken nothing yet: an order marked paid on
    that ships goods nobody paid for. (example_project/shop.py's ``paid_in_full``.)"""
    received = result.get("amount_received")
    return (
        result.get("status") == "succeeded"
        and str(result.get("currency") or "").lower() == order.currency.lower()
        and isinstance(received, int)
        and received >= order.amount
    )


@app.task(base=PaymentTask, bind=True)
def charge_order(self: PaymentTask, order_id: int) -> dict[str, Any]:
    order = Order.objects.get(pk=order_id)  # a plain read: harmless to repeat
    receipt = self.outbound(
        stripe.charge,
        {
            "amount": order.amount,
            "currency": order.currency,
            "reference": f"order-{order_id}",
            "source": TEST_CARD,
        },
        business_key=f"order:{order_id}",
    )
    if not paid_in_full(receipt, order):
        log.warning(
            "order %s: Stripe's PaymentIntent %s is %s, not paid; the order stays pending. "
            "Mark it paid when Stripe's payment_intent.succeeded webhook for it arrives "
            "(example_project/shop.py's handle_stripe_event shows one), never before.",
            order_id,
            receipt["id"],
            receipt.get("status"),
        )
        return {"order": order_id, "payment": receipt["id"], "not_paid": receipt.get("status")}

    def mark_paid(_conn: Any) -> dict[str, Any]:
        # Django's own connection, no argument: this commits with the fence, or not at all.
        Order.objects.filter(pk=order_id).update(
            status=Order.PAID,
            payment_id=receipt["id"],
            paid_at=timezone.now(),
            times_marked_paid=F("times_marked_paid") + 1,
        )
        return {"order": order_id}

    self.fenced_effect("mark-paid", mark_paid, business_key=f"order:{order_id}")
    return {"order": order_id, "payment": receipt["id"]}
