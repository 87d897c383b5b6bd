"""The shop's own table: an order, charged once and marked paid once."""

from __future__ import annotations

from django.db import models


class Order(models.Model):
    """An order. ``checkout_token`` is the token the checkout form carries (rendered into
    it, or the client's cart id): unique, so a double submit or a proxy's retry of one
    form finds this order instead of placing, and charging, a second one.
    ``times_marked_paid`` counts every committed "mark paid", so the admin shows the
    guarantee: 1 once paid, whatever happened to the workers; 2 would be a write made
    twice."""

    PENDING = "pending"
    PAID = "paid"
    STATUSES = [(PENDING, "pending"), (PAID, "paid")]

    checkout_token = models.CharField(
        max_length=64,
        unique=True,
        help_text="the checkout form's token: the same form posted again is this order again",
    )
    amount = models.PositiveIntegerField(help_text="in the currency's minor unit (cents)")
    currency = models.CharField(max_length=3, default="eur")
    status = models.CharField(max_length=16, choices=STATUSES, default=PENDING)
    charge_task_id = models.CharField(max_length=64, blank=True)
    payment_id = models.CharField(max_length=64, blank=True, help_text="Stripe's PaymentIntent")
    times_marked_paid = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    paid_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"order {self.pk} ({self.status})"
