from __future__ import annotations

from django.db import models


class Order(models.Model):
    """``times_paid`` counts every committed "mark paid": once is right, twice a bug."""

    reference = models.CharField(max_length=64, primary_key=True)
    times_paid = models.IntegerField(default=0)

    class Meta:
        app_label = "orders"
