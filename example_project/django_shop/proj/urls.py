"""The shop's checkout and order pages, and the admin."""

from __future__ import annotations

from django.contrib import admin
from django.urls import path
from shop import views

urlpatterns = [
    path("checkout/", views.checkout, name="checkout"),
    path("orders/<int:order_id>/", views.order, name="order"),
    path("admin/", admin.site.urls),
]
