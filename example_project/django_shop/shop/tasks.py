"""The charge: a ``PaymentTask`` that charges through the Stripe adapter, then marks the
order paid through the ORM in a fenced effect.

A redelivery (a killed or frozen worker, a broker's second copy) runs the body again
from the top: the charge is replayed from the store, or reconciled with Stripe when its
answer was lost, never sent blindly again; the ORM write commits once, with the fence.
Stripe is named only to identify its public API; no affiliation or endorsement.
"""

from __future__ import annotations

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
