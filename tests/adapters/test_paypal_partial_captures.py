"""Several partial captures of one PayPal authorization, each its own key (design: PS18).

PayPal closes an authorization on a capture with ``final_capture: true``; the adapter
sends it only when the request asks, or when it captures the whole (no ``amount``). A
partial capture leaves the rest capturable, so 300 then 700 of 1000 are two captures,
one request each. The adapter used to send every capture final: the second got 422
``AUTHORIZATION_ALREADY_CAPTURED``, unknown, replayed and resent until an operator, and
the merchant never got the remainder. The fake models what PayPal does: captures add up
to at most the authorization, and a final one closes it.
"""

from __future__ import annotations

from typing import Any

import pytest
from paypalserversdk.exceptions.error_exception import ErrorException

from celery_agboss.adapters.paypal import PayPalAdapter, PayPalRequestError, issues_of
from celery_agboss.adapters.paypal_requests import body_of
from celery_agboss.core.outbound import CallContext, Outcome
from celery_agboss.testing.gateway_server import FakeGatewayServer
from celery_agboss.testing.gateway_types import GatewayRequestOutcome
from tests.adapters.conftest import AdapterOn
from tests.adapters.paypal_support import charge_request
from tests.engine.helpers import Shop

PROCESSED, REPLAYED = GatewayRequestOutcome.PROCESSED, GatewayRequestOutcome.REPLAYED


def _authorized(adapter_on: AdapterOn, shop: Shop) -> tuple[FakeGatewayServer, PayPalAdapter, str]:
    server, adapter = adapter_on("paypal")
    with shop.start("t-auth") as ctx:
        auth = ctx.outbound(adapter.authorize, charge_request("order-ps18b"), business_key="a:1")
    return server, adapter, str(auth["id"])


def _capture(shop: Shop, adapter: PayPalAdapter, auth: str, n: int, **request: Any) -> Any:
    with shop.start(f"t-cap{n}") as ctx:
        return ctx.outbound(
            adapter.capture, {"payment_id": auth, **request}, business_key=f"capture:{auth}:{n}"
        )


def _send(adapter: PayPalAdapter, auth: str, n: int, **request: Any) -> Any:
    """One capture straight through the adapter (no engine): what PayPal answered."""
    call = CallContext(f"default:t:cap-{n}:paypal.capture", {"payment_id": auth, **request}, 1, "")
    return adapter.capture.send(call)


def _captures(server: FakeGatewayServer) -> list[Any]:
    return [r.outcome for r in server.gateway.requests if r.operation == "capture"]


def _authorization_status(adapter: PayPalAdapter, auth: str) -> Any:
    read = adapter.client.payments.get_authorized_payment({"authorization_id": auth})
    return body_of(read)["status"]


def test_two_partial_captures_of_one_authorization_are_both_captured(
    adapter_on: AdapterOn, shop: Shop
) -> None:
    server, adapter, auth = _authorized(adapter_on, shop)
    first = _capture(shop, adapter, auth, 1, amount=300)
    assert _authorization_status(adapter, auth) == "PARTIALLY_CAPTURED"
    second = _capture(shop, adapter, auth, 2, amount=700)
    assert (first["amount"], second["amount"]) == (300, 700)
    assert first["authorization_id"] == second["authorization_id"] == auth
    assert first["id"] != second["id"], "two captures, each its own"
    assert _captures(server) == [PROCESSED, PROCESSED], "one request each"
    parts = server.gateway.captures
    assert [(c["amount"], c["final"]) for c in parts] == [(300, False), (700, False)]
    assert server.gateway.retrieve(auth)["amount_captured"] == 1000
    assert _authorization_status(adapter, auth) == "CAPTURED"


def test_final_capture_true_on_a_partial_closes_the_authorization(
    adapter_on: AdapterOn, shop: Shop
) -> None:
    server, adapter, auth = _authorized(adapter_on, shop)
    _capture(shop, adapter, auth, 1, amount=300)
    closing = _capture(shop, adapter, auth, 2, amount=200, final_capture=True)
    assert closing["amount"] == 200
    with pytest.raises(ErrorException) as refused:
        _send(adapter, auth, 3, amount=100)
    assert refused.value.response_code == 422
    assert issues_of(refused.value) == {"AUTHORIZATION_ALREADY_CAPTURED"}
    assert [c["final"] for c in server.gateway.captures] == [False, True]
    assert server.gateway.retrieve(auth)["amount_captured"] == 500, "the rest released"


def test_a_capture_without_an_amount_takes_what_is_left_and_closes_it(
    adapter_on: AdapterOn, shop: Shop
) -> None:
    server, adapter, auth = _authorized(adapter_on, shop)
    _capture(shop, adapter, auth, 1, amount=300)
    rest = _capture(shop, adapter, auth, 2)
    assert rest["amount"] == 700
    assert [(c["amount"], c["final"]) for c in server.gateway.captures] == [
        (300, False),
        (700, True),
    ]
    with pytest.raises(ErrorException) as refused:
        _send(adapter, auth, 3, amount=1)
    assert issues_of(refused.value) == {"AUTHORIZATION_ALREADY_CAPTURED"}


def test_a_capture_past_what_is_left_is_refused_and_nothing_is_captured(
    adapter_on: AdapterOn, shop: Shop
) -> None:
    server, adapter, auth = _authorized(adapter_on, shop)
    _capture(shop, adapter, auth, 1, amount=300)
    with pytest.raises(ErrorException) as refused:
        _send(adapter, auth, 2, amount=800)
    assert issues_of(refused.value) == {"MAX_CAPTURE_AMOUNT_EXCEEDED"}
    assert adapter.capture.is_definite_failure(refused.value) is True
    assert [c["amount"] for c in server.gateway.captures] == [300]
    assert server.gateway.retrieve(auth)["status"] == "requires_capture", "still open"


def test_a_lost_answer_of_the_second_partial_capture_is_replayed_once(
    adapter_on: AdapterOn, shop: Shop
) -> None:
    server, adapter, auth = _authorized(adapter_on, shop)
    _capture(shop, adapter, auth, 1, amount=300)
    request, key = {"payment_id": auth, "amount": 700}, f"capture:{auth}:2"
    shop.lose_the_answer(
        "t-cap2", adapter.capture, request, gateway=server.gateway, operation="capture",
        business_key=key,
    )  # fmt: skip
    with shop.start("t-cap2") as retry:
        second = retry.outbound(adapter.capture, request, business_key=key)
        assert retry.last_outcome is Outcome.SENT  # NotSent: PayPal replays the key
    assert second["amount"] == 700, "the key's own capture, not the first one"
    assert second["id"] == server.gateway.captures[1]["id"]
    assert _captures(server) == [PROCESSED, PROCESSED, REPLAYED]
    assert server.gateway.retrieve(auth)["amount_captured"] == 1000


def test_a_partial_capture_is_refunded_on_its_own(adapter_on: AdapterOn, shop: Shop) -> None:
    server, adapter, auth = _authorized(adapter_on, shop)
    first = _capture(shop, adapter, auth, 1, amount=300)
    _capture(shop, adapter, auth, 2, amount=700)
    with shop.start("t-refund") as ctx:
        refund = ctx.outbound(adapter.refund, {"payment_id": first["id"], "amount": None})
    assert (refund["amount"], refund["capture_id"]) == (300, first["id"])
    assert [r["amount"] for r in server.gateway.refunds] == [300], "that capture, not 1000"


def test_a_final_capture_that_is_not_a_bool_is_refused_before_anything_is_sent(
    adapter_on: AdapterOn, shop: Shop
) -> None:
    server, adapter, auth = _authorized(adapter_on, shop)
    with pytest.raises(PayPalRequestError, match="final_capture"):
        _send(adapter, auth, 1, amount=300, final_capture="yes")
    assert _captures(server) == []
