"""Checkout.com's wire shapes for the fake's checkout dialect: ids, times, error bodies
and a payment's status as Checkout.com names them. Checkout.com is named only to
identify its public API; this fake is not affiliated with or endorsed by it."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from typing import Any

_PAYMENT_PREFIX, _FAKE_PAYMENT_PREFIX = "pay_", "ch_"
_DECLINED = "declined"  # the fake gateway's status of a declined payment


def request_id() -> str:
    return uuid.uuid4().hex[:13].upper()


def iso_time(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def checkout_id(fake_id: str) -> str:
    """The Checkout-looking id of a fake payment (``ch_x`` → ``pay_x``)."""
    return _PAYMENT_PREFIX + fake_id.removeprefix(_FAKE_PAYMENT_PREFIX)


def fake_id(payment_id: str) -> str:
    return _FAKE_PAYMENT_PREFIX + payment_id.removeprefix(_PAYMENT_PREFIX)


def action_id(request_id: str, suffix: str = "") -> str:
    return "act_" + request_id.removeprefix("req_") + suffix


def error_body(error_type: str, *codes: str) -> dict[str, Any]:
    """A body in Checkout.com's error shape."""
    return {"request_id": request_id(), "error_type": error_type, "error_codes": list(codes)}


def status_of(payment: dict[str, Any]) -> str:
    status = payment["status"]
    if status == _DECLINED:
        return "Declined"
    if status == "requires_capture":
        return "Authorized"
    if status == "canceled":
        return "Voided"
    if status == "refunded":
        return "Refunded"
    if payment["amount_refunded"]:
        return "Partially Refunded"
    return "Captured" if payment["amount_captured"] >= payment["amount"] else "Partially Captured"


__all__ = [
    "action_id",
    "checkout_id",
    "error_body",
    "fake_id",
    "iso_time",
    "request_id",
    "status_of",
]
