"""A capture of an authorization, or a refund, that PayPal answers 2xx but did not do.

PayPal's Payments v2 answers a capture 201 with its ``status``: COMPLETED, DECLINED ("The
funds could not be captured"), FAILED ("There was an error while capturing payment"),
PENDING, ...; a refund with CANCELLED ("The refund was cancelled"), FAILED ("The refund
could not be processed"), PENDING or COMPLETED (its SDK's CaptureStatus and RefundStatus).
The adapter used to check the status of an order's capture only: a DECLINED capture or a
FAILED refund came back as a result, the intent was COMPLETED (the merchant ships for
money never captured, or tells a customer a refund was made), and a retry under the
business key replayed it. Now both raise ``PayPalDeclinedError`` (definite), on a send
and on a reconcile's resend (PayPal's answer under the key), by the order path's one rule
(``REFUSED_STATUSES``); PENDING stays the result, its ``status`` showing it is not final.
The fake answers these statuses (``PayPalDialect.status_next``); money is counted there.
"""

from __future__ import annotations

from typing import Any

import pytest

from celery_agboss.adapters.paypal import PayPalAdapter, PayPalDeclinedError
from celery_agboss.core.store_protocol import IntentStatus
from celery_agboss.testing.gateway_server import FakeGatewayServer
from celery_agboss.testing.gateway_types import GatewayRequestOutcome
from tests.adapters.conftest import AdapterOn, ServeFn
from tests.adapters.deliveries import intent_status, lose_at_the_gateway, raised_then_retry_asked
from tests.adapters.paypal_support import charge_request, dialect_of
from tests.engine.helpers import Shop, business_intent_key

DECLINED = GatewayRequestOutcome.DECLINED
PROCESSED = GatewayRequestOutcome.PROCESSED
REPLAYED = GatewayRequestOutcome.REPLAYED


def _paid(
    adapter_on: AdapterOn, shop: Shop, order: str, *, capture: bool
) -> tuple[FakeGatewayServer, PayPalAdapter, str]:
    """An order of 1000 paid through the engine: captured (its capture's id) or only
    authorized (its authorization's id)."""
    server, adapter = adapter_on("paypal")
    call = adapter.charge if capture else adapter.authorize
    with shop.start(f"pay-{order}") as ctx:
        paid = ctx.outbound(call, charge_request(order), business_key=f"order:{order}")
    return server, adapter, str(paid["id"])


def _outcomes(shop: Shop, server: FakeGatewayServer, business_key: str, kind: str) -> list[Any]:
    key = business_intent_key(shop.settings, business_key, kind)
    return [r.outcome for r in server.gateway.requests_for(key)]


def _no_money_moved(server: FakeGatewayServer, payment_id: str, kind: str) -> None:
    """Counted at the fake: nothing captured of the authorization, nothing refunded."""
    if kind == "capture":
        assert server.gateway.captures == []
        payment = server.gateway.retrieve(payment_id)
        assert (payment["status"], payment["amount_captured"]) == ("requires_capture", 0)
    else:
        assert server.gateway.refunds == []
        assert server.gateway.retrieve(payment_id)["amount_refunded"] == 0


@pytest.mark.parametrize(
    ("kind", "shown"),
    [("capture", "DECLINED"), ("capture", "FAILED"), ("refund", "FAILED"), ("refund", "CANCELLED")],
)
def test_a_capture_or_refund_paypal_answers_without_moving_money_is_a_definite_failure(
    adapter_on: AdapterOn, shop: Shop, kind: str, shown: str
) -> None:
    """Definite, never COMPLETED; a retry under the business key gets PayPal's same answer
    replayed under the same key (no money moves), so it fails the same way."""
    server, adapter, payment_id = _paid(adapter_on, shop, kind, capture=kind == "refund")
    dialect_of(server).status_next(kind, shown)
    call, business_key = getattr(adapter, kind), f"{kind}:{payment_id}"
    request = {"payment_id": payment_id}
    refused = raised_then_retry_asked(
        shop, f"t-{kind}", call, request, PayPalDeclinedError, business_key=business_key
    )

    assert f" {shown}: no money moved" in str(refused)
    assert "under a new business key" in str(refused)
    assert call.is_definite_failure(refused) is True
    assert intent_status(shop, business_key, f"paypal.{kind}") is IntentStatus.FAILED
    assert _outcomes(shop, server, business_key, f"paypal.{kind}") == [DECLINED]
    _no_money_moved(server, payment_id, kind)

    with shop.start(f"t-{kind}") as retry, pytest.raises(PayPalDeclinedError) as again:
        retry.outbound(call, request, business_key=business_key)
    assert str(again.value) == str(refused), "the same answer, replayed under the key"
    assert _outcomes(shop, server, business_key, f"paypal.{kind}") == [DECLINED, REPLAYED]
    assert intent_status(shop, business_key, f"paypal.{kind}") is IntentStatus.FAILED
    _no_money_moved(server, payment_id, kind)

    with shop.start(f"t-{kind}-new-key") as ctx:  # what the error says to do
        done = ctx.outbound(call, {"payment_id": payment_id}, business_key=f"{kind}:again")
    assert done["status"] in ("COMPLETED", "REFUNDED") and done["amount"] == 1000


@pytest.mark.parametrize(("kind", "shown"), [("capture", "DECLINED"), ("refund", "FAILED")])
def test_one_whose_answer_was_lost_is_not_reconciled_as_completed(
    adapter_on: AdapterOn, shop: Shop, kind: str, shown: str
) -> None:
    """Reconcile replays the key (PayPal has no read by it): the replay's answer is
    PayPal's under the key, so the refused status is definite there too, not Completed
    and not an unproven refusal left pending."""
    server, adapter, payment_id = _paid(adapter_on, shop, f"lost-{kind}", capture=kind == "refund")
    dialect_of(server).status_next(kind, shown)
    call, business_key = getattr(adapter, kind), f"{kind}:{payment_id}"
    request = {"payment_id": payment_id}
    lose_at_the_gateway(shop, server, f"t-{kind}", call, request, business_key)
    assert intent_status(shop, business_key, f"paypal.{kind}") is IntentStatus.PENDING

    with shop.start(f"t-{kind}") as retry, pytest.raises(PayPalDeclinedError) as refused:
        retry.outbound(call, request, business_key=business_key)

    assert f" {shown}: no money moved" in str(refused.value)
    assert intent_status(shop, business_key, f"paypal.{kind}") is IntentStatus.FAILED
    assert _outcomes(shop, server, business_key, f"paypal.{kind}") == [DECLINED, REPLAYED]
    _no_money_moved(server, payment_id, kind)


@pytest.mark.parametrize("kind", ["capture", "refund"])
def test_a_pending_capture_or_refund_is_the_result_with_its_status(
    adapter_on: AdapterOn, shop: Shop, kind: str
) -> None:
    """PENDING is not a refusal (the money may still move), as for an order's capture:
    the result, whose ``status`` tells the task it is not final yet."""
    server, adapter, payment_id = _paid(
        adapter_on, shop, f"pending-{kind}", capture=kind == "refund"
    )
    dialect_of(server).status_next(kind, "PENDING")
    call, business_key = getattr(adapter, kind), f"{kind}:{payment_id}"
    with shop.start(f"t-{kind}") as ctx:
        done = ctx.outbound(call, {"payment_id": payment_id}, business_key=business_key)

    assert (done["status"], done["amount"]) == ("PENDING", 1000)
    assert intent_status(shop, business_key, f"paypal.{kind}") is IntentStatus.COMPLETED
    assert _outcomes(shop, server, business_key, f"paypal.{kind}") == [PROCESSED]
    made = server.gateway.captures if kind == "capture" else server.gateway.refunds
    assert [m["amount"] for m in made] == [1000]


def test_the_fake_refuses_a_status_paypal_does_not_answer(served: ServeFn) -> None:
    dialect = dialect_of(served("paypal"))
    with pytest.raises(ValueError, match="cannot be answered"):
        dialect.status_next("refund", "DECLINED")
    with pytest.raises(ValueError, match="cannot be answered"):
        dialect.status_next("void", "FAILED")
