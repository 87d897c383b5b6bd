"""A webhook, once its signature passed: a ``WebhookEvent`` that names itself.

``verify_stripe``, ``verify_checkout``, ``verify_adyen`` (and ``verify_webhook``, which
picks one by name) check the signature over the raw body first and parse it only then,
so a refused webhook is never read, published or recorded. Call them where the HTTP
request arrives, not in a task: a Stripe-style timestamp is checked against a tolerance
of minutes, and a task retried later than that would refuse its own genuine event.

Each event's id is what the gateway sends again with a redelivery, so
``event.business_key`` (``event:<gateway>:<event id>``) is the same for every copy,
on any worker; ``celery_agboss.webhooks.record_event`` applies it under that key.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from celery_agboss.core import sabotage
from celery_agboss.core.keys import validate_business_key
from celery_agboss.core.protections import ADYEN_FIELDS_UNCHECKED
from celery_agboss.errors import AGBossError, ConfigurationError, InvalidBusinessKeyError
from celery_agboss.webhooks.signatures import (
    CHECKOUT_SIGNATURE_HEADER,
    DEFAULT_TOLERANCE_SECONDS,
    STRIPE_SIGNATURE_HEADER,
    check_adyen_item,
    check_checkout_signature,
    check_stripe_signature,
)

STRIPE = "stripe"
CHECKOUT = "checkout"
ADYEN = "adyen"
GATEWAYS = (STRIPE, CHECKOUT, ADYEN)


class WebhookPayloadError(AGBossError):
    """The webhook's signature passed but its body is not an event this intake can read;
    nothing was recorded."""

    gateway: str = ""
    reason: str = ""


@dataclass(frozen=True)
class WebhookEvent:
    """One gateway event: who sent it, its id, its type, the object it is about.

    ``payload`` is the event as the gateway sent it: a hint of what happened, not the
    object's state now: events arrive late and out of order (design: PS16).
    """

    gateway: str
    event_id: str
    type: str
    object_id: str | None
    payload: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def business_key(self) -> str:
        """``event:<gateway>:<event id>``: the same for every delivery of this event."""
        return f"event:{self.gateway}:{self.event_id}"

    def identity(self) -> dict[str, Any]:
        """What must be the same in every copy of the event (its fingerprint)."""
        return {
            "gateway": self.gateway,
            "event_id": self.event_id,
            "type": self.type,
            "object_id": self.object_id,
        }

    def to_message(self) -> dict[str, Any]:
        """JSON for a Celery message (``from_message`` reads it back)."""
        return {**self.identity(), "payload": self.payload}

    @classmethod
    def from_message(cls, data: Mapping[str, Any]) -> WebhookEvent:
        object_id = data.get("object_id")
        return cls(
            gateway=str(data["gateway"]),
            event_id=str(data["event_id"]),
            type=str(data["type"]),
            object_id=None if object_id is None else str(object_id),
            payload=dict(data.get("payload") or {}),
        )


def _refuse(gateway: str, reason: str, detail: str) -> WebhookPayloadError:
    return WebhookPayloadError(
        f"{gateway} webhook refused ({reason}): {detail}; nothing was recorded",
        gateway=gateway,
        reason=reason,
    )


def _json_object(gateway: str, body: bytes) -> dict[str, Any]:
    try:
        parsed = json.loads(bytes(body).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        # RecursionError: nesting deeper than the parser goes (an unsigned Adyen body is
        # parsed before its items' signatures can be checked).
        raise _refuse(gateway, "not-json", "the body is not UTF-8 JSON") from None
    if not isinstance(parsed, dict):
        raise _refuse(gateway, "not-an-object", "the body is not a JSON object")
    return parsed


def _text(gateway: str, value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise _refuse(gateway, "missing-field", f"the event has no {what}")
    return value


def _event(
    gateway: str, event_id: str, type_: str, object_id: Any, payload: dict[str, Any]
) -> WebhookEvent:
    event = WebhookEvent(
        gateway=gateway,
        event_id=event_id,
        type=type_,
        object_id=object_id if isinstance(object_id, str) and object_id else None,
        payload=payload,
    )
    try:
        validate_business_key(event.business_key)
    except InvalidBusinessKeyError as exc:
        raise _refuse(
            gateway, "bad-event-id", f"its id cannot key the event ({exc.rule})"
        ) from None
    return event


def verify_stripe(
    body: bytes,
    signature_header: str | None,
    secret: str | bytes,
    *,
    tolerance: float = DEFAULT_TOLERANCE_SECONDS,
    now: float | None = None,
) -> WebhookEvent:
    """Check ``Stripe-Signature`` over the raw body, then read the event
    (``id``, ``type``, ``data.object.id``)."""
    check_stripe_signature(body, signature_header, secret, tolerance=tolerance, now=now)
    return _json_event(STRIPE, body, "data", "object")


def verify_checkout(body: bytes, signature_header: str | None, secret: str | bytes) -> WebhookEvent:
    """Check ``Cko-Signature`` over the raw body, then read the event
    (``id``, ``type``, ``data.id``)."""
    check_checkout_signature(body, signature_header, secret)
    return _json_event(CHECKOUT, body, "data")


def _json_event(gateway: str, body: bytes, *object_path: str) -> WebhookEvent:
    """The event of a JSON body (Stripe's, Checkout's): its ``id`` and ``type``, and the
    ``id`` of the object found by following ``object_path`` from the top."""
    parsed = _json_object(gateway, body)
    obj: Any = parsed
    for step in object_path:
        obj = obj.get(step) if isinstance(obj, dict) else None
    return _event(
        gateway,
        _text(gateway, parsed.get("id"), "id"),
        _text(gateway, parsed.get("type"), "type"),
        obj.get("id") if isinstance(obj, dict) else None,
        parsed,
    )


def _adyen_items(parsed: dict[str, Any]) -> list[dict[str, Any]]:
    wrapped = parsed.get("notificationItems")
    if not isinstance(wrapped, list) or not wrapped:
        raise _refuse(ADYEN, "missing-field", "the body has no notificationItems")
    items = []
    for entry in wrapped:
        item = entry.get("NotificationRequestItem") if isinstance(entry, dict) else None
        if not isinstance(item, dict):
            raise _refuse(ADYEN, "missing-field", "an item has no NotificationRequestItem")
        items.append(item)
    return items


def _merchant_accounts(accounts: str | Iterable[str]) -> frozenset[str]:
    """The configured merchant account codes; none configured is the application's error."""
    names = [accounts] if isinstance(accounts, str) else list(accounts)
    if not names or not all(isinstance(name, str) and name.strip() for name in names):
        raise ConfigurationError(
            "verify_adyen needs merchant_accounts: the Adyen merchant account code(s) this "
            "endpoint receives notifications for (as in the Customer Area), e.g. "
            "merchant_accounts=['ShopAccount']",
            gateway=ADYEN,
        )
    return frozenset(names)


def verify_adyen(
    body: bytes, hmac_key_hex: str | Sequence[str], *, merchant_accounts: str | Iterable[str]
) -> list[WebhookEvent]:
    """Check every notification item's HMAC, then read each as an event; one bad item
    refuses the whole body (a request partly forged is not trusted in part).

    ``hmac_key_hex`` is the key, or a list of keys while one is rotated (new and
    previous: Adyen may sign with the previous one for a while); an item signed by any
    of them passes.

    An item whose signed fields hold a ``:`` (Adyen does not escape them in the signed
    text), or a payment's item whose references are not Adyen's 16 letters and digits,
    is refused before its signature is believed; one for a merchant account not in
    ``merchant_accounts`` is refused after it (an HMAC key can cover every account of a
    company). Other notifications (``REPORT_AVAILABLE``: a file name as pspReference)
    are handed over like a payment's.

    Adyen's items carry no event id: an item is named by what makes it one event,
    ``<pspReference>:<eventCode>:<success>`` (a refusal then a success of the same
    payment are two events), about ``originalReference`` (the payment a modification
    is about) or else ``pspReference``.
    """
    accounts = _merchant_accounts(merchant_accounts)
    items = _adyen_items(_json_object(ADYEN, body))
    for item in items:
        check_adyen_item(item, hmac_key_hex)
    if not sabotage.active(ADYEN_FIELDS_UNCHECKED):
        for item in items:
            account = item.get("merchantAccountCode")
            if not isinstance(account, str) or account not in accounts:  # [] is unhashable
                raise _refuse(
                    ADYEN,
                    "merchant-account",
                    f"merchantAccountCode {account!r} is not one this endpoint receives "
                    f"({', '.join(sorted(accounts))})",
                )
    events = []
    for item in items:
        psp = _text(ADYEN, item.get("pspReference"), "pspReference")
        code = _text(ADYEN, item.get("eventCode"), "eventCode")
        success = str(item.get("success", "")).lower()
        events.append(
            _event(
                ADYEN,
                f"{psp}:{code}:{success}",
                code,
                item.get("originalReference") or psp,
                item,
            )
        )
    return events


def _header(headers: Mapping[str, str], name: str) -> str | None:
    wanted = name.lower()
    for key, value in headers.items():
        if key.lower() == wanted:
            return value
    return None


def verify_webhook(
    gateway: str,
    body: bytes,
    headers: Mapping[str, str],
    secret: str | bytes | Sequence[str],
    *,
    tolerance: float = DEFAULT_TOLERANCE_SECONDS,
    now: float | None = None,
    merchant_accounts: str | Iterable[str] = (),
) -> list[WebhookEvent]:
    """One endpoint for every gateway: the events of a verified webhook (Stripe and
    Checkout.com send one, Adyen one or more; Adyen's need ``merchant_accounts``, and
    take a list of keys while one is rotated). Header names are matched
    case-insensitively."""
    if gateway not in GATEWAYS:
        raise ValueError(f"unknown webhook gateway {gateway!r}; one of {', '.join(GATEWAYS)}")
    if gateway == ADYEN:
        key = secret.decode("ascii", "replace") if isinstance(secret, bytes) else secret
        return verify_adyen(body, key, merchant_accounts=merchant_accounts)
    if not isinstance(secret, str | bytes):
        raise ConfigurationError(
            f"the {gateway} webhook secret must be one string: only Adyen's verifier takes a "
            "list of keys (Stripe signs with every secret while one is rolled)",
            gateway=gateway,
        )
    if gateway == STRIPE:
        header = _header(headers, STRIPE_SIGNATURE_HEADER)
        return [verify_stripe(body, header, secret, tolerance=tolerance, now=now)]
    return [verify_checkout(body, _header(headers, CHECKOUT_SIGNATURE_HEADER), secret)]


__all__ = [
    "ADYEN",
    "CHECKOUT",
    "GATEWAYS",
    "STRIPE",
    "WebhookEvent",
    "WebhookPayloadError",
    "verify_adyen",
    "verify_checkout",
    "verify_stripe",
    "verify_webhook",
]
