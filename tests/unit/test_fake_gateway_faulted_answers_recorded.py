"""A faulted or dropped answer is recorded as what the fake did with the request.

``answered`` says whether the caller got an answer: a refusal or an injected failure
that reached the caller was recorded unanswered (as if dropped), and a processed charge
whose answer the server held past its timeout and then dropped was recorded answered.
The base ``/charge`` and Adyen's endpoints answered some sends by themselves (a
malformed body, a capture or refund in another currency than its payment's, "received"
and applied to nothing) and never recorded them.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from celery_agboss.testing import (
    FakeGateway,
    FakeGatewayError,
    FakeGatewayErrorKind,
    FakeGatewayFault,
    GatewayRequestOutcome,
    VirtualClock,
)
from celery_agboss.testing.dialects.adyen import AdyenDialect
from celery_agboss.testing.gateway_server import FakeGatewayServer, GatewayCall, Reply

PROCESSED, REPLAYED = GatewayRequestOutcome.PROCESSED, GatewayRequestOutcome.REPLAYED
INVALID = GatewayRequestOutcome.INVALID


def _call(
    method: str, path: str, body: dict[str, Any] | None = None, **headers: str
) -> GatewayCall:
    lowered = {name.lower().replace("_", "-"): value for name, value in headers.items()}
    return GatewayCall(method, path, {}, body or {}, None, headers=lowered)


# --- the base fake -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "kind", "outcome"),
    [
        (
            FakeGatewayFault.FAIL_BEFORE_PROCESSING,
            FakeGatewayErrorKind.NOT_PROCESSED,
            GatewayRequestOutcome.NOT_PROCESSED,
        ),
        (FakeGatewayFault.DECLINE, FakeGatewayErrorKind.DECLINED, GatewayRequestOutcome.DECLINED),
    ],
)
def test_an_injected_failure_that_reached_the_caller_is_recorded_answered(
    fault: FakeGatewayFault, kind: FakeGatewayErrorKind, outcome: GatewayRequestOutcome
) -> None:
    gateway = FakeGateway(VirtualClock())
    gateway.inject_fault(fault)
    with pytest.raises(FakeGatewayError) as failed:
        gateway.charge(1000, "k-1")
    assert failed.value.kind is kind
    [sent] = gateway.requests
    assert (sent.outcome, sent.fault, sent.answered) == (outcome, fault, True)


def test_a_refusal_of_a_key_in_flight_is_recorded_answered() -> None:
    gateway = FakeGateway(VirtualClock())
    first = threading.Thread(target=gateway.charge, args=(1000, "k-2"))
    with gateway.hold(before_processing=True, timeout=10) as hold:
        first.start()
        hold.wait_reached()  # the key's first send is still being processed
        with pytest.raises(FakeGatewayError) as refused:
            gateway.charge(1000, "k-2")
    first.join(10)
    assert refused.value.kind is FakeGatewayErrorKind.IN_PROGRESS
    refusal = gateway.requests_for("k-2")[1]
    assert (refusal.outcome, refusal.answered) == (GatewayRequestOutcome.IN_PROGRESS, True)


def test_a_refused_capture_is_recorded_answered() -> None:
    gateway = FakeGateway(VirtualClock())
    paid = gateway.charge(1000, "k-3")["id"]  # captured at once: nothing left to capture
    with pytest.raises(FakeGatewayError):
        gateway.capture(paid, "c-3")
    [sent] = gateway.requests_for("c-3")
    assert (sent.outcome, sent.answered) == (INVALID, True)


# --- the base server ---------------------------------------------------------------------


def test_a_charge_whose_held_answer_timed_out_is_recorded_unanswered() -> None:
    server = FakeGatewayServer(dialect=None)
    held = server.hold_next_answer(timeout=0.01)
    reply = server.handle(_call("POST", "/charge", {"amount": 500, "idempotency_key": "k-4"}))
    assert reply.drop and held.reached
    [sent] = server.gateway.requests_for("k-4")
    assert (sent.outcome, sent.answered) == (PROCESSED, False)
    assert len(server.gateway.payments) == 1, "made: only its answer was lost"


def test_a_malformed_charge_on_the_base_endpoint_is_a_request() -> None:
    server = FakeGatewayServer(dialect=None)
    reply = server.handle(_call("POST", "/charge", {"amount": "ten", "idempotency_key": "k-5"}))
    assert reply.status == 400
    [sent] = server.gateway.requests_for("k-5")
    assert (sent.operation, sent.outcome, sent.answered) == ("charge", INVALID, True)


def test_a_lookup_is_not_a_send() -> None:
    server = FakeGatewayServer(dialect=None)
    assert server.handle(GatewayCall("GET", "/lookup", {"key": "k"}, {}, None)).status == 200
    assert server.gateway.requests == []


# --- Adyen ------------------------------------------------------------------------------------

ADYEN = {"X-API-Key": "test-key"}
MERCHANT = "Shop"


def _adyen(server: FakeGatewayServer, path: str, key: str, body: dict[str, Any]) -> Reply:
    call = _call("POST", f"/v72{path}", {"merchantAccount": MERCHANT, **body}, **ADYEN)
    headers = {**call.headers, "idempotency-key": key}
    return server.handle(GatewayCall("POST", call.path, {}, call.body, None, headers=headers))


def _adyen_payment(server: FakeGatewayServer) -> Reply:
    body = {
        "amount": {"value": 1000, "currency": "USD"},
        "reference": "o-1",
        "paymentMethod": {"type": "scheme", "number": "4111111111111111"},
        "captureDelayHours": 0,
    }
    return _adyen(server, "/payments", "p-1", body)


def test_an_adyen_refund_in_another_currency_is_a_request_each_time() -> None:
    dialect = AdyenDialect()
    server = FakeGatewayServer(dialect=dialect)
    psp = _adyen_payment(server).payload["pspReference"]
    refund = {"amount": {"value": 400, "currency": "EUR"}, "reference": "r"}
    first = _adyen(server, f"/payments/{psp}/refunds", "r-1", refund)
    again = _adyen(server, f"/payments/{psp}/refunds", "r-1", refund)  # the user's resend
    assert (first.status, again.status) == (201, 201)
    assert first.payload == again.payload and len(dialect.failed_modifications) == 1
    sent = server.gateway.requests_for("r-1")
    assert [r.outcome for r in sent] == [INVALID, REPLAYED]
    assert [r.operation for r in sent] == ["refund", "refund"]
    assert sent[0].payment_id == server.gateway.payments[0]["id"]
    assert server.gateway.refunds == []


def test_an_adyen_payment_refused_before_the_gateway_is_a_request() -> None:
    server = FakeGatewayServer(dialect=AdyenDialect())
    body = {"amount": {"value": 1000, "currency": "USD"}, "reference": "o-2"}
    reply = _adyen(server, "/payments", "p-2", body)  # no paymentMethod: Adyen's 422
    assert reply.status == 422
    assert [r.outcome for r in server.gateway.requests_for("p-2")] == [INVALID]


def test_an_adyen_payment_whose_held_answer_timed_out_is_recorded_unanswered() -> None:
    server = FakeGatewayServer(dialect=AdyenDialect())
    server.hold_next_answer(timeout=0.01)
    assert _adyen_payment(server).drop  # made; the answer was held, then lost
    [sent] = server.gateway.requests_for("p-1")
    assert (sent.outcome, sent.answered) == (PROCESSED, False)
