"""PayPal's wire format, as the fake answers it: error bodies in PayPal's shape,
amounts as its decimal strings, timestamps as its ISO 8601 (UTC, seconds).
"""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from decimal import Decimal, InvalidOperation
from typing import Any

from celery_agboss.testing.gateway_server import Reply
from celery_agboss.testing.gateway_types import FakeGatewayErrorKind

ZERO_DECIMAL_CURRENCIES = frozenset({"HUF", "JPY", "TWD"})
_NAMES = {
    400: "INVALID_REQUEST",
    401: "AUTHENTICATION_FAILURE",
    403: "NOT_AUTHORIZED",
    404: "RESOURCE_NOT_FOUND",
    409: "RESOURCE_CONFLICT",
    422: "UNPROCESSABLE_ENTITY",
    429: "RATE_LIMIT_REACHED",
    503: "SERVICE_UNAVAILABLE",
}
_ERRORS_PAGE = "https://developer.paypal.com/api/rest/reference/orders/v2/errors/"


def paypal_error(status: int, issue: str | None = None, description: str = "") -> Reply:
    """A PayPal error reply: the name PayPal gives the status, and the issue as a detail."""
    name = _NAMES.get(status, "INTERNAL_SERVER_ERROR")
    body: dict[str, Any] = {
        "name": name,
        "message": description or name.replace("_", " ").capitalize(),
        "debug_id": uuid.uuid4().hex[:13],
        "links": [{"href": _ERRORS_PAGE, "rel": "information_link", "method": "GET"}],
    }
    if issue is not None:
        body["details"] = [{"issue": issue, "description": description or issue}]
    return Reply(status, body)


KIND_ERRORS: dict[FakeGatewayErrorKind, tuple[int, str | None, str]] = {
    FakeGatewayErrorKind.DECLINED: (422, "INSTRUMENT_DECLINED", "The instrument was declined."),
    FakeGatewayErrorKind.IN_PROGRESS: (409, "PREVIOUS_REQUEST_IN_PROGRESS", "In progress."),
    FakeGatewayErrorKind.CONFLICT: (422, "DUPLICATE_REQUEST_ID", "Request id already used."),
    FakeGatewayErrorKind.NOT_FOUND: (404, "INVALID_RESOURCE_ID", "No such resource."),
}
NOTHING_PROCESSED = (503, None, "Service unavailable; nothing was processed.")


def not_found() -> Reply:
    return paypal_error(404, "INVALID_RESOURCE_ID", "Specified resource ID does not exist.")


def to_value(amount: int, currency: str) -> str:
    """Minor units as PayPal's decimal string ("10.00"; "1000" for a zero-decimal currency)."""
    if currency.upper() in ZERO_DECIMAL_CURRENCIES:
        return str(amount)
    return f"{Decimal(amount) / 100:.2f}"


def from_value(value: object, currency: str) -> int | None:
    """PayPal's decimal string as minor units; None when it is not a positive amount."""
    try:
        number = Decimal(str(value))
    except InvalidOperation:
        return None
    minor = number if currency.upper() in ZERO_DECIMAL_CURRENCIES else number * 100
    if not minor.is_finite() or minor != minor.to_integral_value() or minor <= 0:
        return None
    return int(minor)


def iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


__all__ = [
    "KIND_ERRORS",
    "NOTHING_PROCESSED",
    "ZERO_DECIMAL_CURRENCIES",
    "from_value",
    "iso",
    "not_found",
    "paypal_error",
    "to_value",
]
