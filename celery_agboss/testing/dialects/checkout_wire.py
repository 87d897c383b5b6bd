"""Checkout.com's wire shapes for the fake's checkout dialect: ids, times, error bodies,
a payment's status and balances and an action as Checkout.com writes them. Checkout.com
is named only to identify its public API; this fake is not affiliated with or endorsed
by it."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from typing import Any

from celery_agboss.testing.dialects.wire_units import CHECKOUT

_PAYMENT_PREFIX, _FAKE_PAYMENT_PREFIX = "pay_", "ch_"
_DECLINED = "declined"  # the fake gateway's status of a declined payment


def request_id() -> str:
    return uuid.uuid4().hex[:13].upper()


def iso_time(epoch: float) -> str:
    """UTC with ``Z``, its fraction of a second without trailing zeros and none at all on
    a whole second (``…:12Z``, ``…:12.5Z``, ``…:12.236641Z``), as Checkout.com's own
    times come in more than one precision: text that does not sort as time."""
    written = datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")
    return written.rstrip("0").rstrip(".") + "Z"


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
    if status == "requires_capture":  # parts captured NonFinal leave it open
        return "Partially Captured" if payment["amount_captured"] else "Authorized"
    if status == "canceled":
        return "Voided"
    if status == "refunded":
        return "Refunded"
    if payment["amount_refunded"]:
        return "Partially Refunded"
    return "Captured" if payment["amount_captured"] >= payment["amount"] else "Partially Captured"


def balances(payment: dict[str, Any]) -> dict[str, int]:
    """A payment's ``balances`` in Checkout.com's units: an open authorisation has what
    its captures left to capture (or void), and what was captured is refundable."""
    status, currency = payment["status"], payment["currency"]
    amount, captured, refunded = (
        CHECKOUT.to_wire(payment[field], currency)
        for field in ("amount", "amount_captured", "amount_refunded")
    )
    left = amount - captured if status == "requires_capture" else 0
    return {
        "total_authorized": amount if status != _DECLINED else 0,
        "total_voided": amount - captured if status == "canceled" else 0,
        "available_to_void": left,
        "total_captured": captured,
        "available_to_capture": left,
        "total_refunded": refunded,
        "available_to_refund": captured - refunded,
    }


def action_body(
    request_id: str,
    kind: str,
    amount: int | None,
    details: dict[str, Any],
    at: float,
    currency: str,
) -> dict[str, Any]:
    """An approved action as ``GET /payments/{id}/actions`` lists it (``details``: the
    reference and metadata its request carried)."""
    return {
        "id": action_id(request_id),
        "type": kind,
        "processed_on": iso_time(at),
        "amount": None if amount is None else CHECKOUT.to_wire(amount, currency),
        "approved": True,
        "response_code": "10000",
        "response_summary": "Approved",
        "reference": details.get("reference"),
        "metadata": dict(details.get("metadata") or {}),
    }


__all__ = [
    "action_body",
    "action_id",
    "balances",
    "checkout_id",
    "error_body",
    "fake_id",
    "iso_time",
    "request_id",
    "status_of",
]
