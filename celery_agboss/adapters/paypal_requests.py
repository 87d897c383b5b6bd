"""What the PayPal adapter sends and reads: a request's fields checked, money in PayPal's
decimal strings, an order's or a payment's result, and the body that pays an order.

Kept apart from the adapter's calls (``adapters.paypal``) so that what a request and an
answer look like is read in one place; the calls decide what to send and when.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from celery_agboss.adapters.common import require_sdk

require_sdk("paypalserversdk", pip_extra="paypal", gateway="PayPal")

from paypalserversdk.models.card_request import CardRequest
from paypalserversdk.models.order_authorize_request import OrderAuthorizeRequest
from paypalserversdk.models.order_authorize_request_payment_source import (
    OrderAuthorizeRequestPaymentSource,
)
from paypalserversdk.models.order_capture_request import OrderCaptureRequest
from paypalserversdk.models.order_capture_request_payment_source import (
    OrderCaptureRequestPaymentSource,
)
from paypalserversdk.models.paypal_wallet import PaypalWallet

from celery_agboss.adapters.common import (
    PaymentFacts,
    RequestChecks,
    linked_id,
    refuse_another_requests_answer,
)
from celery_agboss.adapters.minor_units import GatewayUnits, iso_exponent, to_gateway


class PayPalRequestError(ValueError):
    """A request the adapter refuses before anything is sent (names the field)."""


checks = RequestChecks(PayPalRequestError)


class PayPalDeclinedError(Exception):
    """PayPal answered a payment (an order's capture or authorization, a capture of an
    authorization, a refund) with a status that says no money moved: definite."""


CARD_DATA = ("payment_source", "card")
"""What the policy of every call masks by default: PayPal's own fields for a card's
number, expiry, security code and holder name (``payment_source.card``), should a
request carry them. The adapter pays with a vault id (``source``) only, and refuses a
request that carries either (nothing sent); masking keeps them out of the store too."""

WHOLE_UNIT_CURRENCIES = frozenset({"HUF", "JPY", "TWD"})
"""PayPal's currencies without decimals: "Decimal amounts cause an error" (its currency
codes reference). HUF and TWD have two decimals in ISO 4217, JPY none."""
PAYPAL_UNITS = GatewayUnits("PayPal", dict.fromkeys(WHOLE_UNIT_CURRENCIES, 0), PayPalRequestError)
"""How PayPal writes amounts where it differs from ISO 4217: its whole-unit currencies."""
REFUSED_STATUSES = frozenset({"DECLINED", "FAILED", "DENIED", "CANCELLED"})
"""A payment's status in a 2xx that says no money moved (PayPal's enums): a capture
DECLINED ("The funds could not be captured") or FAILED, an authorization DENIED, a refund
FAILED ("could not be processed") or CANCELLED. PENDING is none of them: the money may
still move, so it is the call's result, whose ``status`` shows it is not final yet."""


def decimal_value(amount: int, currency: str) -> str:
    """``amount`` (ISO 4217 minor units, as on every gateway) as PayPal's ``value``: 1000
    USD is "10.00", 150000 HUF is "1500" (PayPal's whole forints), 1000 JPY is "1000".
    An amount PayPal cannot write (HUF or TWD not a multiple of 100) is refused: rounding
    it would charge another amount than the request's."""
    code = currency.upper()
    units = to_gateway(amount, code, PAYPAL_UNITS)
    return str(Decimal(units).scaleb(-PAYPAL_UNITS.exponent(code)))


def minor_units(money: Mapping[str, Any]) -> int:
    """PayPal's ``value`` back in ISO 4217 minor units (×100 for HUF and TWD): the inverse
    of :func:`decimal_value`, so send and reconcile compare like with like."""
    code = str(money["currency_code"]).upper()
    number = Decimal(str(money["value"])).scaleb(iso_exponent(code))
    if not number.is_finite() or number != number.to_integral_value():
        raise ValueError(f"PayPal's {money['value']!r} {code} is not whole minor units")
    return int(number)


def keyed(request_id: str, **options: Any) -> dict[str, Any]:
    """An SDK call's options: always the key, always the full resource in the answer."""
    return {**options, "paypal_request_id": request_id, "prefer": "return=representation"}


def body_of(response: Any) -> dict[str, Any]:
    text = getattr(response, "text", "") or ""
    found = json.loads(text) if text.strip() else {}
    return found if isinstance(found, dict) else {}


@dataclass(frozen=True)
class WantedPayment:
    amount: int
    currency: str  # upper case, as PayPal writes it
    reference: str
    source: str
    source_kind: str


def field_of(request: Mapping[str, Any], name: str, kind: type, *, required: bool = True) -> Any:
    value = request.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, kind) or isinstance(value, bool) or value in ("", 0):
        raise PayPalRequestError(f"request field {name!r} must be a non-empty {kind.__name__}")
    return value


def final_capture(request: Any) -> bool:
    """A capture's ``final_capture``: the request's bool, else True when it names no
    ``amount`` (the whole authorization) and False when it names one (the rest stays
    capturable)."""
    request = checks.mapping(request)
    final = request.get("final_capture")
    if final is None:
        return request.get("amount") is None
    if not isinstance(final, bool):
        raise PayPalRequestError("request field 'final_capture' must be a bool")
    return final


def payment_request(request: Any) -> WantedPayment:
    """charge/authorize: ``{"amount", "currency", "reference", "source"[, "source_kind"]}``."""
    request = checks.mapping(request)
    carried = sorted(name for name in CARD_DATA if name in request)
    if carried:
        raise PayPalRequestError(
            f"request fields {carried} are card details: this adapter pays with a vaulted "
            "source ('source', a vault id) only"
        )
    amount = field_of(request, "amount", int)
    currency = str(field_of(request, "currency", str)).upper()
    reference, source = field_of(request, "reference", str), field_of(request, "source", str)
    kind = request.get("source_kind", "card")
    if amount <= 0 or len(currency) != 3 or not currency.isalpha():
        raise PayPalRequestError("request field 'amount' must be > 0 and 'currency' ISO 4217")
    decimal_value(amount, currency)  # refused here, before anything is sent
    if len(reference) > 127:
        raise PayPalRequestError("request field 'reference' is over PayPal's 127 characters")
    if kind not in ("card", "paypal"):
        raise PayPalRequestError("request field 'source_kind' must be 'card' or 'paypal'")
    return WantedPayment(amount, currency, reference, source, kind)


def order_result(order: Mapping[str, Any], capture: bool) -> dict[str, Any] | None:
    """The charge's (or authorization's) result from an order; None when it has none yet."""
    units = order.get("purchase_units") or [{}]
    found = (units[0].get("payments") or {}).get("captures" if capture else "authorizations")
    if not found:
        return None
    item = refused_or(found[-1], f"order {order.get('id')}")
    money = item.get("amount") or units[0]["amount"]
    return {
        "id": item["id"],
        "order_id": order["id"],
        "status": item["status"],
        "amount": minor_units(money),
        "currency": str(money["currency_code"]).lower(),
        "reference": units[0].get("custom_id"),
    }


def refused_or(item: Mapping[str, Any], what: str, advice: str = "") -> Mapping[str, Any]:
    """``item`` (a capture, an authorization, a refund), unless its status is one of
    ``REFUSED_STATUSES``: then :class:`PayPalDeclinedError` naming ``what``, the status,
    PayPal's ``status_details.reason`` and ``advice`` (what to do)."""
    status = item.get("status")
    if status not in REFUSED_STATUSES:
        return item
    details = item.get("status_details")
    reason = details.get("reason") if isinstance(details, Mapping) else None
    why = f" ({reason})" if reason else ""
    raise PayPalDeclinedError(f"PayPal answered {what} {status}{why}: no money moved{advice}")


def wanted_facts(payment: WantedPayment) -> PaymentFacts:
    """What tells the request's order from another (PayPal keeps no key of ours to read)."""
    return PaymentFacts(payment.amount, payment.currency, payment.reference)


def order_facts(order: Mapping[str, Any]) -> PaymentFacts:
    """An order's first purchase unit: its amount, currency and ``custom_id``."""
    unit = (order.get("purchase_units") or [{}])[0]
    money = unit.get("amount") or {}
    try:
        amount: int | None = minor_units(money)
    except (KeyError, ArithmeticError, ValueError):
        amount = None
    return PaymentFacts(amount, money.get("currency_code"), unit.get("custom_id"))


def result_facts(result: Mapping[str, Any]) -> PaymentFacts:
    return PaymentFacts(result.get("amount"), result.get("currency"), result.get("reference"))


def own_answer(
    body: dict[str, Any], payment_id: str, amount: int | None, *, up: bool = True
) -> Any:
    """``body`` unless it answers another request made first under our key (a repeat is
    answered with what the key's first request made): of another authorization or capture
    (its ``up`` link; a void's own id) or amount (design: only the request's payment)."""
    answered = linked_id(body.get("links"), "up") if up else body.get("id")
    moved = minor_units(body["amount"]) if "amount" in body else None
    found = PaymentFacts(moved, payment=answered or payment_id)
    wanted = PaymentFacts(amount, payment=payment_id)
    refuse_another_requests_answer(f"PayPal's {body.get('id')}", wanted, found)
    return body


def vaulted(wanted: WantedPayment) -> dict[str, Any]:
    """The vaulted source as a payment source's one field (``card`` or ``paypal``)."""
    if wanted.source_kind == "paypal":
        return {"paypal": PaypalWallet(vault_id=wanted.source)}
    return {"card": CardRequest(vault_id=wanted.source)}


def paying_body(wanted: WantedPayment, capture: bool) -> Any:
    """The capture's (authorize's) body: the vaulted source pays the order here, in the
    request keyed by our own key, never at the order's creation."""
    if capture:
        return OrderCaptureRequest(
            payment_source=OrderCaptureRequestPaymentSource(**vaulted(wanted))
        )
    return OrderAuthorizeRequest(
        payment_source=OrderAuthorizeRequestPaymentSource(**vaulted(wanted))
    )


def payment_result(body: Mapping[str, Any], **extra: Any) -> dict[str, Any]:
    money = body["amount"]
    amount, currency = minor_units(money), str(money["currency_code"]).lower()
    return dict(id=body["id"], status=body["status"], amount=amount, currency=currency, **extra)


__all__ = [
    "CARD_DATA",
    "PayPalDeclinedError",
    "PayPalRequestError",
    "WantedPayment",
    "body_of",
    "checks",
    "decimal_value",
    "field_of",
    "final_capture",
    "keyed",
    "minor_units",
    "order_facts",
    "order_result",
    "own_answer",
    "paying_body",
    "payment_request",
    "payment_result",
    "refused_or",
    "result_facts",
    "vaulted",
    "wanted_facts",
]
