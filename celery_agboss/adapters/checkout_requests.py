"""What the Checkout.com adapter refuses, raises and returns, below its calls: its errors,
the request's checks, the key it writes into metadata, amounts in Checkout.com's units
(``CHECKOUT_UNITS``), and what a capture or refund of "all of it" took, its actions
ordered by time. Checkout.com is named only to identify its public API.

Apart from ``celery_agboss.adapters.checkout`` (which re-exports the public names) so
that the adapter's module holds its calls and its reconcile rules.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from celery_agboss.adapters.common import RequestChecks, left_before
from celery_agboss.adapters.minor_units import GatewayUnits, from_gateway
from celery_agboss.core import sabotage
from celery_agboss.core.keys import fit_key
from celery_agboss.core.protections import (
    CHECKOUT_CAPTURE_ALL_IGNORES_EARLIER,
    CHECKOUT_REFUND_ALL_IGNORES_LATER_CAPTURES,
    CHECKOUT_TIMES_COMPARED_AS_TEXT,
)

KEY_METADATA_FIELD = "agboss_idempotency_key"
"""The metadata field of every payment and action sent: the key (its digest past 255)."""
_METADATA_VALUE_LIMIT = 255


class CheckoutAdapterError(Exception):
    """What the adapter raises itself; ``details`` are JSON, so a stored failure can be
    raised again as it was (an SDK exception cannot: it is built from an HTTP response)."""

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.details = dict(details or {})

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.details))


class CheckoutRequestError(CheckoutAdapterError, ValueError):
    """A malformed request dict, refused before anything was sent: definite."""


request_checks = RequestChecks(CheckoutRequestError)
"""The request dict's fields, checked before anything is sent (``CheckoutRequestError``)."""

CHECKOUT_UNITS = GatewayUnits(
    "Checkout.com",
    {"CLP": 2, "UYI": 2, "CLF": 2, "UYW": 2},
    CheckoutRequestError,
    tens_in_three_decimals=True,
)
"""How Checkout.com writes amounts where it differs from ISO 4217 (its "Format the amount
value" page): the full amount for BIF DJF GNF ISK JPY KMF KRW PYG RWF UGX VUV VND XAF
XOF XPF (ISO 4217: no decimals too), ÷1000 with the last digit 0 for BHD IQD JOD KWD
LYD OMR TND, and ÷100 for every other currency: so CLP and UYI (ISO 4217: none) and
CLF and UYW (ISO 4217: four) are written with two decimals."""


def iso_amount(amount: Any, currency: Any) -> int | None:
    """An amount Checkout.com wrote back in ISO 4217 minor units (``CHECKOUT_UNITS``)."""
    return from_gateway(amount, currency, CHECKOUT_UNITS)


def payment_result(payment: Mapping[str, Any]) -> dict[str, Any]:
    """What charge and authorize return, from a 201 or a listed payment alike: its amount
    in ISO 4217 minor units, as the request's."""
    fields = ("id", "status", "reference", "approved")
    return {
        **{field: payment.get(field) for field in fields},
        "amount": iso_amount(payment.get("amount"), payment.get("currency")),
        "currency": str(payment.get("currency") or "").lower(),
    }


class CheckoutDeclinedError(CheckoutAdapterError):
    """A 201 with ``approved: false`` (the SDK returns it as a success), or a capture,
    refund or void the payment lists ``approved: false`` (accepted with a 202, then
    declined): no money moved, definite. ``details``: ``payment_id``, ``response_code``,
    ``response_summary``; for an action also ``action_id`` and ``type``."""


class CheckoutRefusedError(CheckoutAdapterError):
    """Checkout.com refused the request (400, 401, 403, 404, 422): nothing processed,
    definite. Its ``__cause__`` is the SDK's ``CheckoutApiException``; ``details``:
    ``status``, ``error_type``, ``error_codes``, ``request_id``."""

    @property
    def status(self) -> Any:
        return self.details.get("status")


class CheckoutNoAnswerError(CheckoutAdapterError):
    """No complete answer: the connection failed or timed out, or an accepted action could
    not be read back. It may have been processed: unknown, reconcile decides."""


# --- what the adapter writes into a request ----------------------------------------------


def source_of(value: Any) -> dict[str, Any]:
    """A token (``tok_…``), a stored source (``src_…``) or a source object as the API takes."""
    if isinstance(value, str) and value.startswith(("tok_", "src_")):
        kind = "token" if value.startswith("tok_") else "id"
        return {"type": kind, kind: value}
    if isinstance(value, Mapping) and isinstance(value.get("type"), str):
        return dict(value)
    raise CheckoutRequestError("source is required: 'tok_…', 'src_…' or a dict with 'type'")


def key_mark(idempotency_key: str) -> str:
    return fit_key(idempotency_key, _METADATA_VALUE_LIMIT)


def metadata_with_key(request: Mapping[str, Any], idempotency_key: str) -> dict[str, Any]:
    given = request.get("metadata") or {}
    if not isinstance(given, Mapping) or KEY_METADATA_FIELD in given:
        raise CheckoutRequestError(f"metadata must be a dict without {KEY_METADATA_FIELD!r}")
    return {**given, KEY_METADATA_FIELD: key_mark(idempotency_key)}


def marked_key(item: Mapping[str, Any]) -> Any:
    metadata = item.get("metadata")
    return metadata.get(KEY_METADATA_FIELD) if isinstance(metadata, dict) else None


# --- what "all of it" took ------------------------------------------------------------------

_ISO_TIME = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?"
    r"(?:(Z)|([+-])(\d{2}):(\d{2}))",
    re.IGNORECASE,
)
_AT = "processed_at"  # an action's processed_on read as a time (None: unreadable)


def processed_at(value: Any) -> datetime | None:
    """An action's ``processed_on`` as an aware time, whatever its precision (none, up to
    nine digits) and whether it ends ``Z`` or ``+00:00``; None for anything else (no
    offset, not ISO 8601), which orders nothing: as text, ``…:00Z`` sorts after
    ``…:00.5Z``. Digits past the microsecond are dropped (two times they alone part read
    as one, "made at the same time", which leaves the order untold)."""
    found = _ISO_TIME.fullmatch(value) if isinstance(value, str) else None
    if found is None:
        return None
    year, month, day, hour, minute, second = (int(part) for part in found.groups()[:6])
    fraction, zulu, sign, hours, minutes = found.groups()[6:]
    try:
        offset = timezone.utc
        if not zulu:
            shift = timedelta(hours=int(hours), minutes=int(minutes))
            offset = timezone(shift if sign == "+" else -shift)
        micro = int((fraction or "").ljust(6, "0")[:6])
        return datetime(year, month, day, hour, minute, second, micro, tzinfo=offset)
    except ValueError:  # a month, day, hour or offset out of range
        return None


def left_when_made(
    kind: str, payment: Mapping[str, Any], action: Any, actions: list[Any]
) -> int | str:
    """What a capture or refund without an amount (``action``, one of the payment's
    ``actions``) took: what was left when it was made of the authorisation, less the
    captures approved before it (parts captured ``NonFinal``), or of what was captured by
    then (not the captures after it), less the refunds before it; a reason instead when
    that cannot be told. Amounts in ISO 4217 minor units, as the request's; order by
    ``processed_on`` read as times."""
    currency, as_text = payment.get("currency"), sabotage.active(CHECKOUT_TIMES_COMPARED_AS_TEXT)
    read = {
        id(a): {
            **a,
            "amount": iso_amount(a.get("amount"), currency),
            _AT: a.get("processed_on") if as_text else processed_at(a.get("processed_on")),
        }
        for a in actions
    }
    own = read.get(id(action), action)
    approved = [read[id(a)] for a in actions if a.get("approved") is not False]
    if kind == "capture":
        total = payment.get("amount")
        earlier = [a for a in approved if a.get("type") == "Capture"]
        if sabotage.active(CHECKOUT_CAPTURE_ALL_IGNORES_EARLIER):
            earlier = []
        return left_before(iso_amount(total, currency), own, earlier, _AT)
    captures = [a for a in approved if a.get("type") == "Capture"]
    if sabotage.active(CHECKOUT_REFUND_ALL_IGNORES_LATER_CAPTURES):
        captures = []
    total = iso_amount((payment.get("balances") or {}).get("total_captured"), currency)
    captured = _captured_when_made(total, own, captures)
    if isinstance(captured, str):
        return captured
    earlier = [a for a in approved if a.get("type") == "Refund"]
    return left_before(captured, own, earlier, _AT)


def _captured_when_made(
    total: int | None, own: Mapping[str, Any], captures: Sequence[Mapping[str, Any]]
) -> int | str | None:
    """What was captured when the refund ``own`` was made: ``total`` (captured now) less
    the ``captures`` approved after it, as an authorisation captured in parts stays open to
    them; the refund could not take what they took. A capture at the same time as ours, or
    with a time or amount that cannot be read, leaves it untold: a reason."""
    if total is None:
        return total  # ``left_before`` says why
    at, later = own.get(_AT), 0
    for capture in captures:
        when, amount = capture.get(_AT), capture.get("amount")
        if at is None or when is None:
            return "its amount could not be checked (a capture's time cannot be read)"
        if when == at:
            return "its amount could not be checked (a capture was made at the same time)"
        if when < at:
            continue
        if isinstance(amount, bool) or not isinstance(amount, int):
            return f"its amount could not be checked (a later capture's amount is {amount!r})"
        later += amount
    return total - later


__all__ = [
    "CHECKOUT_UNITS",
    "KEY_METADATA_FIELD",
    "CheckoutAdapterError",
    "CheckoutDeclinedError",
    "CheckoutNoAnswerError",
    "CheckoutRefusedError",
    "CheckoutRequestError",
    "iso_amount",
    "key_mark",
    "left_when_made",
    "marked_key",
    "metadata_with_key",
    "payment_result",
    "processed_at",
    "request_checks",
    "source_of",
]
