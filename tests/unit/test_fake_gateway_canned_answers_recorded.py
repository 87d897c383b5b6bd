"""A send the fake answers without processing it still reaches ``FakeGateway.requests``.

A user's "sent once" test counts sends at the gateway. A reply armed with a dialect's
``answer_next`` (Stripe, Checkout.com, PayPal), and a money-moving request a dialect
refused before its gateway saw it (no API key, a malformed body), were answered by the
server alone and never recorded: code that sent a charge twice, once answered by the
canned 500, showed one request and passed its "sent once" test.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any, TypeVar

import pytest

from celery_agboss.testing import GatewayRequestOutcome
from celery_agboss.testing.dialects.checkout import CheckoutDialect
from celery_agboss.testing.dialects.paypal import PayPalDialect
from celery_agboss.testing.dialects.stripe import StripeDialect, stripe_error
from celery_agboss.testing.gateway_server import FakeGatewayServer, GatewayCall, Reply

CANNED = GatewayRequestOutcome.CANNED
PROCESSED, INVALID = GatewayRequestOutcome.PROCESSED, GatewayRequestOutcome.INVALID
D = TypeVar("D")


def _call(
    method: str, path: str, body: dict[str, Any] | None = None, **headers: str
) -> GatewayCall:
    lowered = {name.lower().replace("_", "-"): value for name, value in headers.items()}
    return GatewayCall(method, path, {}, body or {}, None, headers=lowered)


def _outcomes(server: FakeGatewayServer, key: str) -> list[GatewayRequestOutcome]:
    return [r.outcome for r in server.gateway.requests_for(key)]


def _served(dialect: D) -> Iterator[tuple[FakeGatewayServer, D]]:
    """A started server speaking ``dialect``, and the dialect to arm its answers."""
    with FakeGatewayServer(dialect=dialect) as server:
        yield server, dialect


# --- Stripe --------------------------------------------------------------------------------

STRIPE_KEY = "Bearer sk_test_123"
INTENT = {
    "amount": "1000",
    "currency": "usd",
    "payment_method": "pm_card_visa",
    "confirm": "true",
    "metadata[reference]": "o-1",
}


@pytest.fixture
def stripe() -> Iterator[tuple[FakeGatewayServer, StripeDialect]]:
    yield from _served(StripeDialect())


def _stripe(server: FakeGatewayServer, path: str, key: str, body: dict[str, Any]) -> Reply:
    return server.handle(_call("POST", path, body, Authorization=STRIPE_KEY, Idempotency_Key=key))


def test_a_stripe_charge_answered_by_answer_next_is_a_request(
    stripe: tuple[FakeGatewayServer, StripeDialect],
) -> None:
    server, dialect = stripe
    dialect.answer_next(stripe_error(500, "api_error", "boom"))
    assert _stripe(server, "/v1/payment_intents", "k-1", INTENT).status == 500
    assert _stripe(server, "/v1/payment_intents", "k-1", INTENT).status == 200  # the retry
    assert _outcomes(server, "k-1") == [CANNED, PROCESSED]
    assert [r.attempt for r in server.gateway.requests_for("k-1")] == [1, 2]
    canned = server.gateway.requests_for("k-1")[0]
    assert (canned.operation, canned.amount, canned.answered) == ("charge", 1000, True)
    assert len(server.gateway.payments) == 1


def test_a_stripe_refund_whose_canned_answer_is_dropped_is_an_unanswered_request(
    stripe: tuple[FakeGatewayServer, StripeDialect],
) -> None:
    server, dialect = stripe
    paid = _stripe(server, "/v1/payment_intents", "k-2", INTENT).payload["id"]
    dialect.answer_next(Reply(0, drop=True))
    refund = {"payment_intent": paid, "amount": "400"}
    assert _stripe(server, "/v1/refunds", "r-1", refund).drop
    [sent] = server.gateway.requests_for("r-1")
    assert (sent.outcome, sent.operation, sent.answered) == (CANNED, "refund", False)
    assert (sent.amount, sent.payment_id) == (400, server.gateway.payments[0]["id"])
    assert server.gateway.refunds == []


def test_a_stripe_request_refused_before_the_gateway_is_a_request(
    stripe: tuple[FakeGatewayServer, StripeDialect],
) -> None:
    server, _ = stripe
    unkeyed = server.handle(_call("POST", "/v1/payment_intents", INTENT, Idempotency_Key="k-3"))
    assert unkeyed.status == 401  # no API key: a send all the same
    no_currency = {k: v for k, v in INTENT.items() if k != "currency"}
    assert _stripe(server, "/v1/payment_intents", "k-3", no_currency).status == 400
    assert _outcomes(server, "k-3") == [INVALID, INVALID]
    assert server.gateway.payments == []


def test_a_stripe_read_answered_by_answer_next_is_not_a_send(
    stripe: tuple[FakeGatewayServer, StripeDialect],
) -> None:
    server, dialect = stripe
    dialect.answer_next(stripe_error(500, "api_error", "boom"))
    assert server.handle(_call("GET", "/v1/refunds", Authorization=STRIPE_KEY)).status == 500
    assert server.gateway.requests == []


# --- Checkout.com -----------------------------------------------------------------------------

CKO_KEY = "Bearer sk_sbox_123"
PAYMENT = {
    "amount": 1000,
    "currency": "USD",
    "reference": "o-1",
    "source": {"type": "token", "token": "tok_ok"},
}


@pytest.fixture
def checkout() -> Iterator[tuple[FakeGatewayServer, CheckoutDialect]]:
    yield from _served(CheckoutDialect())


def _checkout(server: FakeGatewayServer, path: str, key: str, body: dict[str, Any]) -> Reply:
    headers = {"Authorization": CKO_KEY, "Cko-Idempotency-Key": key}
    return server.handle(_call("POST", path, body, **headers))


def test_a_checkout_payment_answered_by_answer_next_is_a_request(
    checkout: tuple[FakeGatewayServer, CheckoutDialect],
) -> None:
    server, dialect = checkout
    dialect.answer_next(502, {"error_type": "bad_gateway"}, operation="payment")
    assert _checkout(server, "/payments", "k-1", PAYMENT).status == 502
    assert _checkout(server, "/payments", "k-1", PAYMENT).status == 201
    assert _outcomes(server, "k-1") == [CANNED, PROCESSED]
    assert server.gateway.requests_for("k-1")[0].amount == 1000


def test_a_checkout_capture_answered_by_answer_next_is_a_request(
    checkout: tuple[FakeGatewayServer, CheckoutDialect],
) -> None:
    server, dialect = checkout
    paid = _checkout(server, "/payments", "k-2", {**PAYMENT, "capture": False}).payload["id"]
    dialect.answer_next(422, {"error_type": "request_invalid"}, operation="capture")
    assert _checkout(server, f"/payments/{paid}/captures", "c-1", {"amount": 300}).status == 422
    [sent] = server.gateway.requests_for("c-1")
    assert (sent.outcome, sent.operation, sent.amount) == (CANNED, "capture", 300)
    assert sent.payment_id == server.gateway.requests_for("k-2")[0].object_id


def test_a_checkout_payment_without_a_secret_key_is_a_request(
    checkout: tuple[FakeGatewayServer, CheckoutDialect],
) -> None:
    server, _ = checkout
    reply = server.handle(_call("POST", "/payments", PAYMENT, Cko_Idempotency_Key="k-3"))
    assert reply.status == 401
    assert _outcomes(server, "k-3") == [INVALID]


def test_a_checkout_read_answered_by_answer_next_is_not_a_send(
    checkout: tuple[FakeGatewayServer, CheckoutDialect],
) -> None:
    server, dialect = checkout
    dialect.answer_next(500, operation="list")
    listed = server.handle(_call("GET", "/payments", Authorization=CKO_KEY))
    assert listed.status == 500 and server.gateway.requests == []


# --- PayPal -----------------------------------------------------------------------------------

VAULT = {"payment_source": {"card": {"vault_id": "vault-1"}}}
ORDER = {
    "intent": "CAPTURE",
    "purchase_units": [{"amount": {"currency_code": "USD", "value": "10.00"}, "custom_id": "o1"}],
}


@pytest.fixture
def paypal() -> Iterator[tuple[FakeGatewayServer, PayPalDialect]]:
    yield from _served(PayPalDialect())


def _bearer(server: FakeGatewayServer) -> str:
    basic = base64.b64encode(b"id:secret").decode()
    body = {"grant_type": "client_credentials"}
    reply = server.handle(_call("POST", "/v1/oauth2/token", body, Authorization=f"Basic {basic}"))
    return f"Bearer {reply.payload['access_token']}"


def _paypal(server: FakeGatewayServer, path: str, key: str, body: dict[str, Any]) -> Reply:
    headers = {"Authorization": _bearer(server), "PayPal-Request-Id": key}
    return server.handle(_call("POST", path, body, **headers))


def _capture_path_of_an_order(server: FakeGatewayServer, key: str) -> str:
    """An order created under ``key`` (no source: no money moves); its capture's path."""
    order = _paypal(server, "/v2/checkout/orders", key, ORDER).payload["id"]
    return f"/v2/checkout/orders/{order}/capture"


def test_a_paypal_capture_answered_by_answer_next_is_a_request(
    paypal: tuple[FakeGatewayServer, PayPalDialect],
) -> None:
    server, dialect = paypal
    capture = _capture_path_of_an_order(server, "ord-1")
    dialect.answer_next(500, path="/capture")
    assert _paypal(server, capture, "cap-1", VAULT).status == 500
    assert _paypal(server, capture, "cap-1", VAULT).status == 201  # the retry
    assert _outcomes(server, "cap-1") == [CANNED, PROCESSED]
    assert server.gateway.requests_for("cap-1")[0].amount == 1000
    assert _outcomes(server, "ord-1") == [], "an order without a source moves no money"


def test_a_paypal_token_answered_by_answer_next_is_not_a_send(
    paypal: tuple[FakeGatewayServer, PayPalDialect],
) -> None:
    server, dialect = paypal
    dialect.answer_next(401, path="/v1/oauth2/token")
    basic = base64.b64encode(b"id:secret").decode()
    body = {"grant_type": "client_credentials"}
    reply = server.handle(_call("POST", "/v1/oauth2/token", body, Authorization=f"Basic {basic}"))
    assert reply.status == 401 and server.gateway.requests == []


def test_a_paypal_capture_without_a_token_is_a_request(
    paypal: tuple[FakeGatewayServer, PayPalDialect],
) -> None:
    server, _ = paypal
    capture = _capture_path_of_an_order(server, "ord-2")
    reply = server.handle(_call("POST", capture, VAULT, PayPal_Request_Id="cap-2"))
    assert reply.status == 401
    assert _outcomes(server, "cap-2") == [INVALID]
