"""PayPal's wire format, as the fake answers it: error bodies in PayPal's shape,
amounts as its decimal strings, timestamps as its ISO 8601 (UTC, seconds).

PayPal is named only to identify its public API. The fake keeps money as the
``FakeGateway`` does, in ISO 4217 minor units (150000 is 1,500.00 HUF, as Stripe counts
it); PayPal's wire writes HUF, JPY and TWD in whole units ("This currency does not
support decimals"), so 150000 HUF minor units travel as "1500".
"""

from __future__ import annotations

import re
import uuid
from datetime import datetime, timezone
from decimal import Decimal, InvalidOperation
from typing import Any

from celery_agboss.testing.gateway_server import Reply
from celery_agboss.testing.gateway_types import FakeGatewayErrorKind

WHOLE_UNIT_CURRENCIES = frozenset({"HUF", "JPY", "TWD"})
"""PayPal's currencies without decimals: their ``value`` is a whole number, and a decimal
one is refused (``DECIMALS_NOT_SUPPORTED``)."""
_ISO_EXPONENT = {"JPY": 0}
"""ISO 4217's minor-unit exponent of PayPal's currencies where it is not 2 (HUF and TWD
have 2: the fake's amounts count their hundredths)."""
_WHOLE = re.compile(r"[0-9]+")
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


def _exponent(currency: str) -> int:
    return _ISO_EXPONENT.get(currency.upper(), 2)


def _places(currency: str) -> int:
    """How many decimals PayPal writes for ``currency``."""
    return 0 if currency.upper() in WHOLE_UNIT_CURRENCIES else _exponent(currency)


def to_value(amount: int, currency: str) -> str:
    """Minor units as PayPal's decimal string: "10.00" for 1000 USD, "1500" for 150000 HUF
    (PayPal's whole forints), "1000" for 1000 JPY. An amount PayPal could not write (a
    fraction of a forint: the dialect never makes one) is written exactly, never rounded."""
    value = Decimal(amount).scaleb(-_exponent(currency))
    shown = value.quantize(Decimal(1).scaleb(-_places(currency)))
    return str(shown if shown == value else value)


def from_value(value: object, currency: str) -> int | None:
    """PayPal's decimal string as minor units (×100 for HUF and TWD); None when PayPal
    would refuse it (see :func:`value_issue`) or it is not a positive amount."""
    text = str(value)
    if value_issue(text, currency) is not None:
        return None
    minor = Decimal(text).scaleb(_exponent(currency))
    if not minor.is_finite() or minor != minor.to_integral_value() or minor <= 0:
        return None
    return int(minor)


def value_issue(value: object, currency: str) -> str | None:
    """The issue PayPal names for a ``value`` it cannot take in ``currency``: decimals in a
    whole-unit currency, more decimals than the currency has, or no number at all."""
    text = str(value)
    try:
        number = Decimal(text)
    except InvalidOperation:
        return "INVALID_PARAMETER_VALUE"
    if currency.upper() in WHOLE_UNIT_CURRENCIES and not _WHOLE.fullmatch(text):
        return "DECIMALS_NOT_SUPPORTED"
    exponent = number.as_tuple().exponent
    if not isinstance(exponent, int) or -exponent > _places(currency):
        return "DECIMAL_PRECISION" if isinstance(exponent, int) else "INVALID_PARAMETER_VALUE"
    return None


def iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


__all__ = [
    "KIND_ERRORS",
    "NOTHING_PROCESSED",
    "WHOLE_UNIT_CURRENCIES",
    "from_value",
    "iso",
    "not_found",
    "paypal_error",
    "to_value",
    "value_issue",
]
