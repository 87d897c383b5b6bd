"""Checkout.com: a capture without an amount after partial captures (design: PS18).

Checkout.com captures one authorisation in parts when each part but the last says
``capture_type: "NonFinal"`` (the default, ``Final``, voids what a partial capture leaves).
A capture that names no amount then takes what is left, and the payment's actions list
it with that amount. Reconcile compares the capture found under our key with what "all
of it" was when it was made: the authorisation less the captures approved before it
(design: only the request's payment). It used to compare with the whole authorisation,
so the lost answer of a capture of the rest was ``Unknown``: the money captured, the
execution waiting for an operator, the order never marked captured. The twin
(``CHECKOUT_CAPTURE_ALL_IGNORES_EARLIER``) shows that wait.
"""

from __future__ import annotations

from typing import Any

import pytest

from celery_agboss.adapters.checkout import CheckoutAdapter, CheckoutRefusedError
from celery_agboss.core.outbound import CallContext, Completed, Unknown
from celery_agboss.core.protections import CHECKOUT_CAPTURE_ALL_IGNORES_EARLIER
from celery_agboss.errors import OutboundCallUnreconciledError
from celery_agboss.testing import sabotage
from celery_agboss.testing.gateway_server import FakeGatewayServer
from celery_agboss.testing.gateway_types import GatewayRequestOutcome
from tests.adapters.checkout_support import charge_request
from tests.adapters.conftest import AdapterOn
from tests.adapters.own_payment_support import key_for, reconcile
from tests.engine.helpers import Shop

PROCESSED, TIMED_OUT = GatewayRequestOutcome.PROCESSED, GatewayRequestOutcome.TIMED_OUT
NON_FINAL = {"capture_type": "NonFinal"}


def _part_captured(
    adapter_on: AdapterOn, shop: Shop
) -> tuple[FakeGatewayServer, CheckoutAdapter, str]:
    """1000 authorised, then 300 of it captured NonFinal (the rest stays capturable)."""
    server, adapter = adapter_on("checkout")
    with shop.start("order-r") as ctx:
        held = ctx.outbound(adapter.authorize, charge_request("order-r"), business_key="auth:r")
        part = {"payment_id": held["id"], "amount": 300, **NON_FINAL}
        ctx.outbound(adapter.capture, part, business_key="capture:r:1")
    shop.clock.advance(1)
    return server, adapter, str(held["id"])


def _captures(server: FakeGatewayServer) -> list[GatewayRequestOutcome]:
    return [r.outcome for r in server.gateway.requests if r.operation == "capture"]


def _rest(payment_id: str) -> dict[str, Any]:
    return {"payment_id": payment_id}


def _the_rest_captured_and_its_answer_lost(
    adapter_on: AdapterOn, shop: Shop
) -> tuple[FakeGatewayServer, Any, dict[str, Any]]:
    """300 captured of 1000, then "capture the rest" made at the gateway and its answer
    lost: the server, the adapter and that request."""
    server, adapter, payment_id = _part_captured(adapter_on, shop)
    rest = _rest(payment_id)
    gw = server.gateway
    shop.lose_the_answer("capture-r", adapter.capture, rest, gateway=gw, operation="capture")
    return server, adapter, rest


def test_a_lost_capture_of_the_rest_is_reconciled_as_what_was_left(
    adapter_on: AdapterOn, shop: Shop
) -> None:
    server, adapter, rest = _the_rest_captured_and_its_answer_lost(adapter_on, shop)
    gw = server.gateway
    captured = shop.reconciled("capture-r", adapter.capture, rest)
    assert (captured["type"], captured["amount"], captured["status"]) == (
        "Capture",
        700,
        "Captured",
    )
    assert [c["amount"] for c in gw.captures] == [300, 700]
    assert _captures(server) == [PROCESSED, PROCESSED], "the capture of the rest went once"
    assert gw.retrieve(gw.payments[0]["id"])["amount_captured"] == 1000


def test_a_capture_of_the_rest_that_never_arrived_is_sent_once_more(
    adapter_on: AdapterOn, shop: Shop
) -> None:
    """Nothing under the key: ``NotSent`` inside its retention, and the resend captures."""
    server, adapter, payment_id = _part_captured(adapter_on, shop)
    server.gateway.hold(before_processing=True, operation="capture", timeout=0.05)
    shop.unknown("capture-r", adapter.capture, _rest(payment_id))
    with shop.start("capture-r") as retry:
        captured = retry.outbound(adapter.capture, _rest(payment_id))
    assert captured["amount"] == 700
    assert _captures(server) == [PROCESSED, TIMED_OUT, PROCESSED]
    assert [c["amount"] for c in server.gateway.captures] == [300, 700]


def test_another_capture_of_the_rest_under_our_key_is_not_taken_for_ours(
    adapter_on: AdapterOn, shop: Shop
) -> None:
    """A part under our key that left something capturable is not "all of it"."""
    server, adapter, payment_id = _part_captured(adapter_on, shop)
    key = key_for(shop, adapter.capture, "capture:r:2")
    call = CallContext(key, {"payment_id": payment_id, "amount": 200, **NON_FINAL}, 1, "x")
    adapter.capture.send(call)
    answer = reconcile(adapter.capture, key, _rest(payment_id))
    assert isinstance(answer, Unknown) and "amount 200, not 700" in answer.reason, answer
    assert [c["amount"] for c in server.gateway.captures] == [300, 200]


def test_twin_without_the_earlier_captures_a_made_capture_waits_for_an_operator(
    adapter_on: AdapterOn, shop: Shop
) -> None:
    server, adapter, rest = _the_rest_captured_and_its_answer_lost(adapter_on, shop)
    gw = server.gateway
    with (
        sabotage(CHECKOUT_CAPTURE_ALL_IGNORES_EARLIER),
        shop.start("capture-r") as retry,
        pytest.raises(OutboundCallUnreconciledError),
    ):
        retry.outbound(adapter.capture, rest)
    assert [c["amount"] for c in gw.captures] == [300, 700], "the rest was captured"
    assert _captures(server) == [PROCESSED, PROCESSED]


def test_the_fake_captures_in_parts_only_when_a_part_is_non_final(adapter_on: AdapterOn) -> None:
    """The fake as Checkout.com: a partial capture is ``Final`` unless it says otherwise,
    and a final one voids the rest; a NonFinal one leaves it capturable, and the payment
    reads ``Partially Captured`` with what is left available."""
    _, adapter = adapter_on("checkout")
    paid = [
        adapter.authorize.send(CallContext(f"a-{n}", charge_request(f"o-{n}"), 1, "x"))["id"]
        for n in (1, 2)
    ]
    first = {"payment_id": paid[0], "amount": 300}
    assert adapter.capture.send(CallContext("c-1", first, 1, "x"))["status"] == "Partially Captured"
    with pytest.raises(CheckoutRefusedError) as refused:
        adapter.capture.send(CallContext("c-2", _rest(paid[0]), 1, "x"))
    assert refused.value.details["status"] == 422, "a final partial capture voids the rest"
    second = {**first, "payment_id": paid[1], **NON_FINAL}
    adapter.capture.send(CallContext("c-3", second, 1, "x"))
    details = adapter._details(paid[1])
    assert details["status"] == "Partially Captured"
    assert details["balances"]["available_to_capture"] == 700
    assert details["balances"]["total_captured"] == 300
    rest = adapter.capture.send(CallContext("c-4", _rest(paid[1]), 1, "x"))
    assert (rest["amount"], rest["status"]) == (700, "Captured")
    listed = [a["amount"] for a in adapter._actions(paid[1]) if a["type"] == "Capture"]
    assert listed == [700, 300], "each capture listed with what it took, newest first"
    found = reconcile(adapter.capture, "c-4", _rest(paid[1]))
    assert isinstance(found, Completed) and found.result == rest
