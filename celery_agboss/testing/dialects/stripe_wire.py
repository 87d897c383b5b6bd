"""Stripe's wire format, as the fake reads and answers it: form bodies unfolded, search
queries parsed, the fake's payments and refunds as PaymentIntents and Refunds, lists
paged newest first, and errors in Stripe's shape.

Amounts travel in Stripe's units (ISK ×100, MGA ÷100: ``wire_units.STRIPE``) while the
fake keeps ISO 4217 minor units: :func:`wire_amount` reads one, and the renderers write
them back.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from celery_agboss.testing.dialects.wire_units import STRIPE
from celery_agboss.testing.gateway_server import GatewayCall, Reply
from celery_agboss.testing.gateway_types import FakeGatewayError, FakeGatewayErrorKind

_INTENT, _CHARGE = "pi_", "ch_"
_CLAUSE = re.compile(
    r"""\s*metadata\[(['"])(?P<field>.+?)\1\]"""  # metadata['field']
    r""":(['"])(?P<value>(?:\\.|(?!\3).)*)\3\s*"""  # :'value', \' escaping a quote
)
_INDEX = re.compile(r"\[([^\[\]]*)\]")
_DECLINED = "declined"  # the fake gateway's status of a declined payment
_DECLINE_MESSAGE = "Your card was declined."
_INVALID_CODE = {"refund": "charge_already_refunded", "charge": "parameter_invalid_integer"}
_REUSED = "Keys for idempotent requests can only be used with the same parameters."
_IN_FLIGHT = "There is currently another in-progress request using this idempotency key."


def stripe_error(
    status: int,
    kind: str,
    message: str,
    *,
    code: str | None = None,
    decline_code: str | None = None,
    param: str | None = None,
) -> Reply:
    """A reply in Stripe's error shape, ``{"error": {"type", "code", "message", ...}}``."""
    error: dict[str, Any] = {"type": kind, "message": message}
    for name, value in (("code", code), ("decline_code", decline_code), ("param", param)):
        if value is not None:
            error[name] = value
    return Reply(status, {"error": error})


def unfold_form(flat: Mapping[str, Any]) -> dict[str, Any]:
    """``metadata[k]=v`` and ``expand[0]=x``, as the SDK encodes them, back into objects."""
    root: dict[str, Any] = {}
    for name, value in flat.items():
        head, bracket, rest = name.partition("[")
        path = [head, *_INDEX.findall(bracket + rest)] if bracket else [head]
        node = root
        for part in path[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            node = child
        node[path[-1]] = value
    unfolded: dict[str, Any] = _lists(root)
    return unfolded


def _lists(node: Any) -> Any:
    if not isinstance(node, dict):
        return node
    items = {k: _lists(v) for k, v in node.items()}
    if items and all(k.isdigit() for k in items):
        return [items[k] for k in sorted(items, key=int)]
    return items


def _intent_id(fake_id: str) -> str:
    return _INTENT + fake_id.removeprefix(_CHARGE)


def payment_id_of(stripe_id: str) -> str | None:
    """The fake's payment id behind a PaymentIntent (or charge) id; None for other ids."""
    if stripe_id.startswith(_INTENT):
        return _CHARGE + stripe_id[len(_INTENT) :]
    return stripe_id if stripe_id.startswith(_CHARGE) else None


def render_intent(receipt: Mapping[str, Any]) -> dict[str, Any]:
    """The fake's payment as a PaymentIntent (a refunded one stays ``succeeded``, as Stripe's;
    a declined one is ``requires_payment_method``, its payment method detached and named in
    ``last_payment_error``, and stays so once cancelled)."""
    extras = receipt.get("metadata") or {}
    status = "succeeded" if receipt["status"] == "refunded" else receipt["status"]
    if status == _DECLINED or receipt.get("declined"):
        shown = "requires_payment_method" if status == _DECLINED else status
        return {
            **render_intent({**receipt, "status": shown, "declined": False}),
            "payment_method": None,
            "last_payment_error": _decline_error(extras.get("payment_method"), receipt["id"]),
        }
    currency = receipt["currency"]
    amount = STRIPE.to_wire(receipt["amount"], currency)
    return {
        "id": _intent_id(receipt["id"]),
        "object": "payment_intent",
        "amount": amount,
        "amount_capturable": amount if status == "requires_capture" else 0,
        "amount_received": STRIPE.to_wire(receipt["amount_captured"], currency),
        "capture_method": extras.get("capture_method", "automatic"),
        "created": int(receipt["created"]),
        "currency": receipt["currency"],
        "latest_charge": receipt["id"],
        "metadata": dict(extras.get("metadata") or {}),
        "payment_method": extras.get("payment_method"),
        "status": status,
        "last_payment_error": None,
    }


def render_refund(refund: Mapping[str, Any]) -> dict[str, Any]:
    extras = json.loads(refund["reference"]) if refund.get("reference") else {}
    return {
        "id": refund["id"],
        "object": "refund",
        "amount": STRIPE.to_wire(refund["amount"], refund["currency"]),
        "charge": refund["payment"],
        "created": int(refund["created"]),
        "currency": refund["currency"],
        "metadata": dict(extras.get("metadata") or {}),
        "payment_intent": _intent_id(refund["payment"]),
        "reason": extras.get("reason"),
        "status": refund["status"],
    }


def integer(body: Mapping[str, Any], name: str) -> int | None:
    """A form integer; ``ValueError`` names the field when it is not one."""
    raw = body.get(name)
    if raw is None or raw == "":
        return None
    if isinstance(raw, str) and raw.lstrip("-").isdigit():
        return int(raw)
    raise ValueError(name)


def wire_amount(value: int, currency: str, param: str) -> int | Reply:
    """A Stripe amount in ``currency`` as the fake's ISO 4217 minor units, or Stripe's 400:
    ISK in fractions of a króna (its ``invalid_charge_amount_no_decimal_compatible``), a
    three-decimal amount whose last digit is not 0 (the code here is representative)."""
    code = currency.upper()
    amount = STRIPE.from_wire(value, code)
    if amount is not None:
        return amount
    if code == "ISK":
        message = (
            "Invalid amount. Currency ISK has become effectively zero-decimal and charged "
            "amounts must be evenly divisible by 100."
        )
        return invalid(message, param, "invalid_charge_amount_no_decimal_compatible")
    return invalid(f"Invalid amount: {STRIPE.wire_issue(value, code)}.", param)


def invalid(message: str, param: str, code: str = "parameter_invalid_integer") -> Reply:
    return stripe_error(400, "invalid_request_error", message, code=code, param=param)


def missing(param: str) -> Reply:
    return invalid(f"Missing required param: {param}.", param, "parameter_missing")


def no_such(stripe_id: str) -> Reply:
    message = f"No such payment_intent: '{stripe_id}'"
    return stripe_error(404, "invalid_request_error", message, code="resource_missing")


def _decline_error(payment_method: Any, charge: Any = None) -> dict[str, Any]:
    """Stripe's ``card_error`` of a generic decline (an intent's ``last_payment_error``)."""
    error: dict[str, Any] = {
        "type": "card_error",
        "code": "card_declined",
        "decline_code": "generic_decline",
        "message": _DECLINE_MESSAGE,
    }
    if charge is not None:
        error["charge"] = charge
    if payment_method:
        error["payment_method"] = {"id": payment_method, "object": "payment_method"}
    return error


def _declined() -> Reply:
    return Reply(402, {"error": _decline_error(None)})


def charge_answer(receipt: Mapping[str, Any]) -> dict[str, Any] | Reply:
    """A create-and-confirm's answer: the PaymentIntent, or for a declined one Stripe's 402
    ``card_error`` carrying it (``error.payment_intent``), as the key saves and replays it."""
    intent = render_intent(receipt)
    if receipt["status"] != _DECLINED:
        return intent
    error = {**intent["last_payment_error"], "payment_intent": intent}
    return Reply(402, {"error": error})


def stripe_failure(exc: FakeGatewayError, operation: str, target: str) -> Reply:
    """A fake gateway failure as the error Stripe answers for it (else a 500 api_error)."""
    if exc.kind is FakeGatewayErrorKind.CONFLICT:
        return stripe_error(400, "idempotency_error", _REUSED)
    if exc.kind is FakeGatewayErrorKind.IN_PROGRESS:
        return stripe_error(409, "invalid_request_error", _IN_FLIGHT, code="idempotency_key_in_use")
    if exc.kind is FakeGatewayErrorKind.DECLINED:
        return _declined()
    if exc.kind is FakeGatewayErrorKind.NOT_FOUND:
        return no_such(target)
    if exc.kind is FakeGatewayErrorKind.INVALID_REQUEST:
        code = _INVALID_CODE.get(operation, "payment_intent_unexpected_state")
        return stripe_error(400, "invalid_request_error", str(exc), code=code)
    return stripe_error(500, "api_error", "An unknown error occurred while processing.")


def parse_query(query: str) -> list[tuple[str, str]] | None:
    """``metadata['f']:'v' AND ...`` → ``[(f, v), ...]``; None for anything else."""
    clauses = []
    for text in query.split(" AND "):
        matched = _CLAUSE.fullmatch(text)
        if matched is None:
            return None
        value = re.sub(r"\\(.)", r"\1", matched.group("value"))
        clauses.append((matched.group("field"), value))
    return clauses


def page_limit(call: GatewayCall) -> int:
    raw = call.query.get("limit") or "10"
    return max(1, min(100, int(raw))) if raw.isdigit() else 10


def newest_first(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Stripe's order; the fake lists oldest first, so a stable sort keeps ties right."""
    return sorted(objects[::-1], key=lambda o: o["created"], reverse=True)


def listed(call: GatewayCall, objects: list[dict[str, Any]], url: str) -> Reply:
    """A Stripe list, newest first, paged by ``limit`` and ``starting_after``."""
    objects = newest_first(objects)
    after = call.query.get("starting_after")
    if after:
        ids = [o["id"] for o in objects]
        objects = objects[ids.index(after) + 1 :] if after in ids else []
    limit = page_limit(call)
    more = len(objects) > limit
    return Reply(200, {"object": "list", "data": objects[:limit], "has_more": more, "url": url})


__all__ = [
    "charge_answer",
    "integer",
    "invalid",
    "listed",
    "missing",
    "newest_first",
    "no_such",
    "page_limit",
    "parse_query",
    "payment_id_of",
    "render_intent",
    "render_refund",
    "stripe_error",
    "stripe_failure",
    "unfold_form",
    "wire_amount",
]
