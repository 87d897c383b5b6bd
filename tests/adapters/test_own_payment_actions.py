"""Per adapter (design: only the request's payment), for the calls that act on a payment:
a capture or refund the gateway shows under this request's key is taken for it only
when it is this request's.

The case, as in tests/adapters/test_own_payment.py for the charge: another deployment
on the same account (the same tenant) captured or refunded 1000 of the payment first,
under the very key this one sends for its own capture or refund of 2500. Stripe and
Checkout.com read the payment's capture or refund back (by the payment id, then by the
key in the action's metadata) and compare its amount with the stored request; Adyen has
no read, so the resend's replayed answer is compared. Each twin switches the comparison
off (``adapter-adopts-any-payment``) and shows the harm: their 1000 taken for our 2500.

A second group: a payment or action of the same amount that carries another call's key
is not taken either. There the key is matched before anything is compared (Stripe's
search and refund filter, Checkout.com's reference listing and action filter), so
``ADOPTS_ANY_PAYMENT`` does not reach it and those tests have no twin.
"""

from __future__ import annotations

import importlib
from datetime import timedelta
from typing import Any

import pytest

from celery_agboss.adapters.common import AnotherRequestsAnswerError
from celery_agboss.core.keys import fit_key
from celery_agboss.core.outbound import (
    CallContext,
    Completed,
    Lookup,
    NotSent,
    OutboundCall,
    ReconcileAnswer,
    Unknown,
)
from celery_agboss.core.protections import ADOPTS_ANY_PAYMENT
from celery_agboss.core.transitions import policy_of
from celery_agboss.testing import sabotage
from celery_agboss.testing.gateway_server import FakeGatewayServer
from tests.adapters.conftest import ServeFn
from tests.adapters.stripe_support import dialect_of as stripe_dialect
from tests.engine.helpers import Shop, business_intent_key

THEIRS, OURS = 1000, 2500
ORDER = "order-42"
BUSINESS_KEY = "order:42"
RECENT = timedelta(minutes=1)
THEIR_AMOUNT = f"amount {THEIRS}, not {OURS}"


def _support(gateway: str) -> Any:
    return importlib.import_module(f"tests.adapters.{gateway}_support")


def _served(served: ServeFn, gateway: str) -> tuple[FakeGatewayServer, Any]:
    server = served(gateway)
    if gateway == "stripe":
        stripe_dialect(server).search_lag = 0.0  # a consistent search: the answer is what it finds
    return server, _support(gateway).adapter_for(server.url)


def _key(shop: Shop, call: OutboundCall, business_key: str = BUSINESS_KEY) -> str:
    """The key this shop's ``outbound(call, …, business_key=business_key)`` sends."""
    raw = business_intent_key(shop.settings, business_key, call.name)
    return fit_key(raw, call.max_key_length)


def _send(call: OutboundCall, key: str, request: Any, attempt: int = 1) -> Any:
    return call.send(CallContext(key, request, attempt, call.name))


def _reconcile(call: OutboundCall, key: str, request: Any) -> ReconcileAnswer:
    """``call``'s reconcile of ``request`` under ``key``, handed the request as stored."""
    stored = policy_of(call).mask_request(request)
    return call.reconcile(
        CallContext(key, request, 1, call.name), Lookup(key, stored, 1, None, RECENT)
    )


def _payment(gateway: str, adapter: Any, *, captured: bool) -> str:
    """Order 42's payment of 2500 (captured, or only authorised), made before either
    shop acts on it; its id."""
    call = adapter.charge if captured else adapter.authorize
    made = _send(call, f"setup-{call.name}", _support(gateway).charge_request(ORDER, OURS))
    return str(made["id"])


def _action(gateway: str, payment_id: str, amount: int | None) -> dict[str, Any]:
    """A capture's or refund's request (a void's: no amount); Adyen takes the currency too."""
    request: dict[str, Any] = {"payment_id": payment_id}
    if amount is not None:
        request["amount"] = amount
        if gateway == "adyen":
            request["currency"] = "usd"
    return request


def _action_id(gateway: str, result: dict[str, Any]) -> Any:
    """Which capture or refund a result is: Checkout.com's action, else the result's id."""
    return result["action_id"] if gateway == "checkout" else result["id"]


def _moved(gateway: str, kind: str, result: dict[str, Any]) -> Any:
    """How much a capture's or refund's result says moved (a Stripe capture answers the
    PaymentIntent: what it received)."""
    field = "amount_received" if (gateway, kind) == ("stripe", "capture") else "amount"
    return result[field]


# --- another amount under our key ----------------------------------------------------------

ACTIONS = [
    ("stripe", "capture"),
    ("stripe", "refund"),
    ("checkout", "capture"),
    ("checkout", "refund"),
    ("adyen", "refund"),
]


def _the_other_shop_acts(
    gateway: str, kind: str, adapter: Any, key: str
) -> tuple[str, dict[str, Any]]:
    """Shop A's capture or refund of 1000 of order 42's payment, under the key shop B
    sends for its own of 2500: the payment's id, and shop A's result."""
    payment_id = _payment(gateway, adapter, captured=kind == "refund")
    theirs: dict[str, Any] = _send(
        getattr(adapter, kind), key, _action(gateway, payment_id, THEIRS)
    )
    return payment_id, theirs


def _held(server: FakeGatewayServer, kind: str) -> int:
    """What the gateway holds of the kind: refunds made, or the amount captured."""
    if kind == "refund":
        return len(server.gateway.refunds)
    return int(server.gateway.payments[0]["amount_captured"])


@pytest.mark.parametrize(("gateway", "kind"), ACTIONS)
def test_a_capture_or_refund_of_another_amount_under_our_key_is_not_taken(
    gateway: str, kind: str, served: ServeFn, shop: Shop
) -> None:
    """Reconcile names the amount and leaves it to an operator; Adyen, with no read,
    refuses the resend's replayed answer. Nothing more is captured or refunded."""
    server, adapter = _served(served, gateway)
    call = getattr(adapter, kind)
    key = _key(shop, call)
    payment_id, _ = _the_other_shop_acts(gateway, kind, adapter, key)
    held = _held(server, kind)
    ours = _action(gateway, payment_id, OURS)
    answer = _reconcile(call, key, ours)
    if gateway == "adyen":
        assert answer == NotSent(), answer
        with pytest.raises(AnotherRequestsAnswerError, match=THEIR_AMOUNT):
            _send(call, key, ours, 2)
    else:
        assert isinstance(answer, Unknown), answer
        assert THEIR_AMOUNT in answer.reason, answer.reason
    assert _held(server, kind) == held


@pytest.mark.parametrize(("gateway", "kind"), ACTIONS)
def test_twin_without_the_comparison_their_capture_or_refund_is_taken_for_ours(
    gateway: str, kind: str, served: ServeFn, shop: Shop
) -> None:
    server, adapter = _served(served, gateway)
    call = getattr(adapter, kind)
    key = _key(shop, call)
    payment_id, theirs = _the_other_shop_acts(gateway, kind, adapter, key)
    held = _held(server, kind)
    ours = _action(gateway, payment_id, OURS)
    with sabotage(ADOPTS_ANY_PAYMENT):
        answer = _reconcile(call, key, ours)
        taken = _send(call, key, ours, 2) if answer == NotSent() else answer.result
    assert isinstance(answer, NotSent if gateway == "adyen" else Completed), answer
    assert _action_id(gateway, taken) == _action_id(gateway, theirs)  # "done" with theirs ...
    assert _moved(gateway, kind, taken) == THEIRS
    assert _held(server, kind) == held  # ... and our 2500 never moved


# --- another call's key: never found for ours (no twin: the key is matched first) ------------


@pytest.mark.parametrize("gateway", ["stripe", "checkout"])
def test_a_payment_of_the_same_request_under_another_call_s_key_is_not_taken(
    gateway: str, served: ServeFn, shop: Shop
) -> None:
    """Same amount, currency and order, but made under another call's key (its metadata
    carries that key): reconcile shows nothing of ours (Stripe searches our key,
    Checkout.com drops a listed payment marked with another key) and never adopts it."""
    server, adapter = _served(served, gateway)
    request = _support(gateway).charge_request(ORDER, OURS)
    _send(adapter.charge, _key(shop, adapter.charge, "order:42:another-call"), request)
    answer = _reconcile(adapter.charge, _key(shop, adapter.charge), request)
    assert answer == NotSent(), answer
    assert len(server.gateway.payments) == 1


KEYED_ACTIONS = [
    ("stripe", "refund"),
    ("checkout", "capture"),
    ("checkout", "refund"),
    ("checkout", "void"),
]


@pytest.mark.parametrize(("gateway", "kind"), KEYED_ACTIONS)
def test_an_action_on_our_payment_under_another_call_s_key_is_not_taken(
    gateway: str, kind: str, served: ServeFn, shop: Shop
) -> None:
    """The very capture, refund or void we ask for (same payment, same amount), made
    under another call's key: the action's metadata names that key, so reconcile finds
    nothing of ours."""
    _, adapter = _served(served, gateway)
    call = getattr(adapter, kind)
    payment_id = _payment(gateway, adapter, captured=kind == "refund")
    amount = None if kind == "void" else (THEIRS if kind == "refund" else OURS)
    request = _action(gateway, payment_id, amount)
    _send(call, _key(shop, call, "order:42:another-call"), request)
    answer = _reconcile(call, _key(shop, call), request)
    assert answer == NotSent(), answer
