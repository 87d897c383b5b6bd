"""The fake Checkout.com lists a void as what it released: what the captures left.

Checkout.com voids a partially captured payment's remaining funds ("Void a payment":
a void on a partially captured payment releases the remaining funds). After NonFinal
captures, the fake listed the void's action with the whole authorisation, so code that
reads the actions (a reconcile, a report) was told the money captured was released too.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from celery_agboss.testing.gateway_server import FakeGatewayServer, GatewayCall, Reply

HEADERS = {"authorization": "Bearer sk_sbox_123"}
PAYMENT = {
    "amount": 10000,
    "currency": "USD",
    "reference": "o-1",
    "capture": False,
    "source": {"type": "token", "token": "tok_ok"},
}


@pytest.fixture
def server() -> Iterator[FakeGatewayServer]:
    with FakeGatewayServer(dialect="checkout") as started:
        yield started


def _send(server: FakeGatewayServer, method: str, path: str, **sent: Any) -> Reply:
    key = sent.pop("key", None)
    headers = {**HEADERS, **({"cko-idempotency-key": key} if key else {})}
    return server.handle(GatewayCall(method, path, {}, sent, None, headers=headers))


def _voided_after(server: FakeGatewayServer, *captures: int) -> tuple[dict[str, Any], Reply]:
    paid = _send(server, "POST", "/payments", key="p-1", **PAYMENT).payload["id"]
    for n, amount in enumerate(captures):
        part = {"amount": amount, "capture_type": "NonFinal"}
        captured = _send(server, "POST", f"/payments/{paid}/captures", key=f"c-{n}", **part)
        assert captured.status == 202
    assert _send(server, "POST", f"/payments/{paid}/voids", key="v-1").status == 202
    actions = _send(server, "GET", f"/payments/{paid}/actions")
    [void] = [a for a in actions.payload if a["type"] == "Void"]
    return void, _send(server, "GET", f"/payments/{paid}")


def test_a_void_after_nonfinal_captures_is_listed_with_what_it_released(
    server: FakeGatewayServer,
) -> None:
    void, payment = _voided_after(server, 3000, 1500)
    assert void["amount"] == 5500, "10000 authorised, 4500 captured: 5500 released"
    assert payment.payload["balances"]["total_voided"] == 5500
    assert payment.payload["balances"]["total_captured"] == 4500


def test_a_void_of_an_authorisation_never_captured_releases_all_of_it(
    server: FakeGatewayServer,
) -> None:
    void, payment = _voided_after(server)
    assert void["amount"] == 10000 == payment.payload["balances"]["total_voided"]
