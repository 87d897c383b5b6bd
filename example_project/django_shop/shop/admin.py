"""Orders in the admin, read-only: they change through the checkout and the charge task."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from shop.models import Order


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "amount",
        "currency",
        "status",
        "payment_id",
        "times_marked_paid",
        "created_at",
        "paid_at",
    ]
    list_filter = ["status"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
