"""What the Stripe adapter sends: a request's fields checked before anything reaches
Stripe, and the metadata fields the adapter sets on what it makes.

Kept apart from the adapter's calls (``adapters.stripe``), as PayPal's are
(``adapters.paypal_requests``): what a request may hold is read in one place.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from celery_agboss.adapters.common import RequestChecks
from celery_agboss.adapters.minor_units import GatewayUnits

KEY_METADATA = "agboss_key"
"""The metadata field a charge, an authorisation and a refund carry the key in."""

REFERENCE_METADATA = "reference"
"""The metadata field a charge carries the request's ``reference`` (the order) in."""

RESERVED_METADATA = frozenset({KEY_METADATA, REFERENCE_METADATA})
PAYMENT_FIELDS = frozenset(
    {"amount", "currency", "reference", "source", "metadata", "description", "customer"}
)


class InvalidStripeRequestError(ValueError):
    """The request dict cannot be sent (it names the field): nothing reached Stripe."""


@dataclass(frozen=True)
class WantedPayment:
    amount: int
    currency: str
    reference: str
    source: str
    metadata: dict[str, str] = field(default_factory=dict)
    description: str | None = None
    customer: str | None = None


def refusal(message: str) -> InvalidStripeRequestError:
    return InvalidStripeRequestError(f"Stripe request refused, nothing sent: {message}")


checks = RequestChecks(refusal)

STRIPE_UNITS = GatewayUnits("Stripe", {"ISK": 2, "MGA": 0}, refusal, tens_in_three_decimals=True)
"""How Stripe writes amounts where it differs from ISO 4217 (its supported-currencies
page, and its support page "Deprecation of fractional ISK charges and refunds"): ISK
with two decimals ("an ISK amount of 100 will continue to represent 1 króna", in
multiples of 100), MGA among its zero-decimal currencies (ISO 4217: two decimals), and
its three-decimal currencies (BHD, JOD, KWD, OMR, TND) with the last digit 0."""


def refuse_unknown_fields(request: Mapping[str, Any], allowed: frozenset[str], what: str) -> None:
    extra = sorted(str(name) for name in request if name not in allowed)
    if extra:
        raise refusal(f"{what} does not take {', '.join(extra)} (it takes {sorted(allowed)})")


def positive_int(request: Mapping[str, Any], name: str, *, optional: bool = False) -> int | None:
    value = request.get(name)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise refusal(f"{name} must be a positive int in minor units, not {value!r}")
    return value


def text_field(request: Mapping[str, Any], name: str, *, limit: int, optional: bool = False) -> Any:
    value = request.get(name)
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value or len(value) > limit:
        raise refusal(f"{name} must be a non-empty str of at most {limit} characters")
    return value


def payment_request(request: Any) -> WantedPayment:
    request = checks.mapping(request, "charge")
    refuse_unknown_fields(request, PAYMENT_FIELDS, "a charge")
    amount = positive_int(request, "amount")
    currency = text_field(request, "currency", limit=3)
    if len(currency) != 3 or not currency.isalpha():
        raise refusal(f"currency must be a three-letter ISO code, not {currency!r}")
    metadata = request.get("metadata") or {}
    if not isinstance(metadata, Mapping) or not all(
        isinstance(k, str) and 0 < len(k) <= 40 and isinstance(v, str) and len(v) <= 500
        for k, v in metadata.items()
    ):
        raise refusal("metadata must map str keys (≤ 40 characters) to str values (≤ 500)")
    if RESERVED_METADATA & set(metadata):
        raise refusal(f"metadata must not set {sorted(RESERVED_METADATA)}: the adapter sets them")
    assert amount is not None
    return WantedPayment(
        amount=amount,
        currency=currency.lower(),
        reference=text_field(request, "reference", limit=500),
        source=text_field(request, "source", limit=255),
        metadata=dict(metadata),
        description=text_field(request, "description", limit=1000, optional=True),
        customer=text_field(request, "customer", limit=255, optional=True),
    )


def payment_id_request(
    request: Any, what: str, allowed: frozenset[str]
) -> tuple[str, Mapping[str, Any]]:
    request = checks.mapping(request, what)
    refuse_unknown_fields(request, allowed, f"a {what}")
    return text_field(request, "payment_id", limit=255), request


def id_of(value: Any) -> str | None:
    """An id field, whether Stripe answered it as an id or as an expanded object."""
    if value is None or isinstance(value, str):
        return value
    found = value.get("id") if isinstance(value, Mapping) else None
    return str(found) if found is not None else None


__all__ = [
    "KEY_METADATA",
    "REFERENCE_METADATA",
    "STRIPE_UNITS",
    "InvalidStripeRequestError",
    "id_of",
    "payment_id_request",
    "payment_request",
    "positive_int",
    "text_field",
]
