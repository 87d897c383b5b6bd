"""Every send reaches ``FakeGateway.requests``, even one the fake (or a dialect) answered
without processing it: a user's "sent once" test must fail when their code sends twice.

A repeat of a PayPal capture under its key, a capture of an order already paid or being
paid, a repeat of a create that paid with a vaulted source, and a declined card on the
base ``/charge`` or PayPal's orders were answered by the server alone and never showed
in ``requests``.
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from celery_agboss.testing import FakeGateway, GatewayRequestOutcome
from celery_agboss.testing.gateway_server import (
    DECLINED_CARD,
    FakeGatewayServer,
    GatewayCall,
    Reply,
)

PROCESSED, REPLAYED = GatewayRequestOutcome.PROCESSED, GatewayRequestOutcome.REPLAYED
VAULT = {"payment_source": {"card": {"vault_id": "vault-1"}}}


@pytest.fixture
def paypal() -> Iterator[FakeGatewayServer]:
    """A PayPal server, started: its bodies carry links to its URL."""
    with FakeGatewayServer(dialect="paypal") as server:
        yield server


def _call(
    method: str, path: str, body: dict[str, Any] | None = None, **headers: str
) -> GatewayCall:
    return GatewayCall(
        method, path, {}, body or {}, None, headers={k.lower(): v for k, v in headers.items()}
    )


def _bearer(server: FakeGatewayServer) -> str:
    basic = base64.b64encode(b"id:secret").decode()
    body = {"grant_type": "client_credentials"}
    reply = server.handle(_call("POST", "/v1/oauth2/token", body, Authorization=f"Basic {basic}"))
    assert reply.status == 200, reply
    return f"Bearer {reply.payload['access_token']}"


def _order(source: dict[str, Any] | None = None) -> dict[str, Any]:
    unit = {"amount": {"currency_code": "USD", "value": "10.00"}, "custom_id": "o1"}
    return {"intent": "CAPTURE", "purchase_units": [unit], **(source or {})}


def _paypal(server: FakeGatewayServer, path: str, key: str, body: dict[str, Any]) -> Reply:
    headers = {"Authorization": _bearer(server), "PayPal-Request-Id": key}
    return server.handle(_call("POST", path, body, **headers))


def _created(server: FakeGatewayServer) -> str:
    created = _paypal(server, "/v2/checkout/orders", "ord-1", _order())
    assert created.status == 201, created
    return f"/v2/checkout/orders/{created.payload['id']}/capture"


def _outcomes(gateway: FakeGateway, key: str) -> list[GatewayRequestOutcome]:
    return [r.outcome for r in gateway.requests_for(key)]


def test_a_repeated_paypal_capture_under_its_key_is_a_request_that_paid_nothing(
    paypal: FakeGatewayServer,
) -> None:
    server = paypal
    capture = _created(server)
    first = _paypal(server, capture, "cap-1", VAULT)
    second = _paypal(server, capture, "cap-1", VAULT)  # the user's duplicate send
    assert (first.status, second.status) == (201, 200)
    assert second.payload["id"] == first.payload["id"]
    assert len(server.gateway.payments) == 1, "the key deduplicated it, as PayPal does"
    assert _outcomes(server.gateway, "cap-1") == [PROCESSED, REPLAYED]
    assert server.gateway.requests_for("cap-1")[1].object_id == server.gateway.payments[0]["id"]


def test_a_capture_of_an_order_already_paid_is_refused_and_recorded(
    paypal: FakeGatewayServer,
) -> None:
    server = paypal
    capture = _created(server)
    assert _paypal(server, capture, "cap-1", VAULT).status == 201
    again = _paypal(server, capture, "cap-2", VAULT)  # another key: PayPal refuses it
    assert again.status == 422
    assert again.payload["details"][0]["issue"] == "ORDER_ALREADY_CAPTURED"
    assert _outcomes(server.gateway, "cap-2") == [GatewayRequestOutcome.INVALID]
    assert len(server.gateway.payments) == 1


def test_a_capture_of_an_order_being_paid_is_refused_and_recorded(
    paypal: FakeGatewayServer,
) -> None:
    server = paypal
    capture = _created(server)
    bearer = _bearer(server)
    hold = server.gateway.hold(before_processing=True, timeout=10)
    replies: list[Reply] = []
    headers = {"Authorization": bearer, "PayPal-Request-Id": "cap-1"}
    first = threading.Thread(
        target=lambda: replies.append(server.handle(_call("POST", capture, VAULT, **headers)))
    )
    first.start()
    try:
        hold.wait_reached()
        busy = _paypal(server, capture, "cap-2", VAULT)
    finally:
        hold.release()
        first.join(10)
    assert busy.status == 409
    assert busy.payload["details"][0]["issue"] == "PREVIOUS_REQUEST_IN_PROGRESS"
    assert _outcomes(server.gateway, "cap-2") == [GatewayRequestOutcome.IN_PROGRESS]
    assert [r.status for r in replies] == [201] and len(server.gateway.payments) == 1


def test_a_repeated_create_that_paid_with_a_vaulted_source_is_a_request_too(
    paypal: FakeGatewayServer,
) -> None:
    server = paypal
    first = _paypal(server, "/v2/checkout/orders", "ord-v", _order(VAULT))
    second = _paypal(server, "/v2/checkout/orders", "ord-v", _order(VAULT))
    assert (first.status, second.status) == (201, 200)
    assert second.payload["id"] == first.payload["id"]
    assert second.payload["status"] == "COMPLETED"
    assert len(server.gateway.payments) == 1
    assert _outcomes(server.gateway, "ord-v") == [PROCESSED, REPLAYED]


def test_a_declined_card_on_the_base_charge_endpoint_is_a_request_each_time() -> None:
    server = FakeGatewayServer(dialect=None)
    body = {"amount": 500, "idempotency_key": "k-dec", "card": DECLINED_CARD}
    for _ in range(3):  # the user's code retries a definite decline three times
        reply = server.handle(_call("POST", "/charge", body))
        assert (reply.status, reply.payload["error"]) == (402, "DECLINED")
    assert len(server.declines) == 3 and server.gateway.payments == []
    assert _outcomes(server.gateway, "k-dec") == [GatewayRequestOutcome.DECLINED] * 3


def test_a_declined_paypal_instrument_is_a_request(paypal: FakeGatewayServer) -> None:
    server = paypal
    capture = _created(server)
    declined = {"payment_source": {"card": {"vault_id": DECLINED_CARD}}}
    reply = _paypal(server, capture, "cap-d", declined)
    assert reply.status == 422
    assert reply.payload["details"][0]["issue"] == "INSTRUMENT_DECLINED"
    assert len(server.declines) == 1 and server.gateway.payments == []
    assert _outcomes(server.gateway, "cap-d") == [GatewayRequestOutcome.DECLINED]
