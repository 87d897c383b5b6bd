"""Stripe's decline through the adapter, against a fake that does what Stripe does with it.

A card decline on a create-and-confirm leaves a PaymentIntent in
``requires_payment_method`` (with ``last_payment_error``) and answers 402 ``card_error``;
Stripe saves that 402 under the ``Idempotency-Key`` (the request started executing) and
replays it to a repeat inside 24 h. So reconcile of a decline whose answer was lost
finds that PaymentIntent and takes the ``requires_payment_method`` branch of
``StripeAdapter._reconcile_payment``: the retention rule of docs/gateways.md (inside
24 h ``NotSent``, the resend getting the decline back; age unknown or past 24 h
``Unknown``). The fake used to make no PaymentIntent and keep nothing under the key.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import stripe

from celery_agboss.adapters.stripe import StripeAdapter
from celery_agboss.core.outbound import CallContext, Lookup, NotSent, Unknown
from celery_agboss.core.store_protocol import IntentStatus
from celery_agboss.errors import OutboundCallOutcomeUnknownError, OutboundCallUnreconciledError
from celery_agboss.testing.gateway_server import DECLINED_CARD, FakeGatewayServer
from celery_agboss.testing.gateway_types import FakeGatewayFault, GatewayRequestOutcome
from tests.adapters.conftest import AdapterOn
from tests.adapters.deliveries import intent_status, lose_at_the_gateway, raised_then_retry_asked
from tests.adapters.stripe_support import charge_request
from tests.engine.helpers import Shop, business_intent_key

DECLINED = GatewayRequestOutcome.DECLINED
REPLAYED = GatewayRequestOutcome.REPLAYED
DECLINING = "pm_card_chargeDeclined"  # Stripe's documented always-declining test method


def _declined_request(reference: str, source: str = DECLINING) -> dict[str, Any]:
    return {**charge_request(reference), "source": source}


def _context(key: str, request: dict[str, Any], attempt: int = 1) -> CallContext:
    return CallContext(key, request, attempt, "stripe.charge")


def _intent_status(shop: Shop, business_key: str) -> IntentStatus:
    return intent_status(shop, business_key, "stripe.charge")


def _a_lost_decline(
    adapter_on: AdapterOn, shop: Shop, order: str
) -> tuple[FakeGatewayServer, StripeAdapter, dict[str, Any], str]:
    """A declined charge of ``order`` (``order-s5``, business key ``order:s5``) whose 402
    was lost: the server, the adapter, the request and the key Stripe keeps it under."""
    server, adapter = adapter_on("stripe")
    request = _declined_request(order)
    key = lose_at_the_gateway(shop, server, order, adapter.charge, request, order.replace("-", ":"))
    return server, adapter, request, key


@pytest.mark.parametrize("source", [DECLINING, DECLINED_CARD])
def test_a_decline_leaves_a_payment_intent_requiring_a_payment_method(
    adapter_on: AdapterOn, source: str
) -> None:
    server, adapter = adapter_on("stripe")
    key = f"default:t:order-s1-{source}:stripe.charge"
    with pytest.raises(stripe.CardError) as declined:
        adapter.charge.send(_context(key, _declined_request("order-s1", source)))
    error = declined.value
    assert (error.http_status, error.code) == (402, "card_declined")
    assert error.error is not None and error.error.payment_intent is not None
    named = error.error.payment_intent
    assert named["status"] == "requires_payment_method"
    intent = adapter.client.v1.payment_intents.retrieve(named["id"]).to_dict()
    assert intent["status"] == "requires_payment_method"
    assert intent["amount_received"] == 0 and intent["payment_method"] is None
    assert intent["last_payment_error"]["code"] == "card_declined"
    assert intent["last_payment_error"]["payment_method"]["id"] == source
    assert intent["metadata"] == {"agboss_key": key, "reference": "order-s1"}
    listed = adapter.client.v1.payment_intents.list().data
    assert [i.id for i in listed] == [named["id"]]
    assert server.gateway.payments == [], "no money moved"
    assert len(server.gateway.declined_payments) == 1
    assert adapter.charge.is_definite_failure(error) is True


def test_a_repeat_under_the_key_replays_the_402_and_attempts_nothing(adapter_on: AdapterOn) -> None:
    server, adapter = adapter_on("stripe")
    key = "default:t:order-s2:stripe.charge"
    request = _declined_request("order-s2")
    with pytest.raises(stripe.CardError) as first:
        adapter.charge.send(_context(key, request))
    with pytest.raises(stripe.CardError) as again:
        adapter.charge.send(_context(key, request, 2))
    assert again.value.json_body == first.value.json_body, "the saved 402, as it was"
    headers = again.value.headers or {}
    assert headers.get("Idempotent-Replayed") == "true"
    assert "Idempotent-Replayed" not in (first.value.headers or {})
    assert [r.outcome for r in server.gateway.requests_for(key)] == [DECLINED, REPLAYED]
    assert len(server.gateway.declined_payments) == 1

    # Another card under the declined key: Stripe compares the parameters (G5).
    with pytest.raises(stripe.IdempotencyError):
        adapter.charge.send(_context(key, charge_request("order-s2"), 3))
    assert server.gateway.payments == []


def test_an_injected_decline_is_a_saved_402_too(adapter_on: AdapterOn) -> None:
    server, adapter = adapter_on("stripe")
    key = "default:t:order-s3:stripe.charge"
    server.gateway.inject_fault(FakeGatewayFault.DECLINE, operation="charge")
    request = charge_request("order-s3")
    with pytest.raises(stripe.CardError) as first:
        adapter.charge.send(_context(key, request))
    with pytest.raises(stripe.CardError) as again:
        adapter.charge.send(_context(key, request, 2))
    assert again.value.json_body == first.value.json_body
    assert server.gateway.payments == []


def test_a_declined_charge_retried_by_its_execution_gets_the_decline_replayed(
    adapter_on: AdapterOn, shop: Shop
) -> None:
    server, adapter = adapter_on("stripe")
    request = _declined_request("order-s4")
    raised_then_retry_asked(
        shop, "order-s4", adapter.charge, request, stripe.CardError, business_key="order:s4"
    )
    assert _intent_status(shop, "order:s4") is IntentStatus.FAILED
    with shop.start("order-s4") as retry, pytest.raises(stripe.CardError):
        retry.outbound(adapter.charge, request, business_key="order:s4")
    key = business_intent_key(shop.settings, "order:s4", "stripe.charge")
    assert [r.outcome for r in server.gateway.requests_for(key)] == [DECLINED, REPLAYED]
    assert _intent_status(shop, "order:s4") is IntentStatus.FAILED


def test_a_decline_whose_answer_was_lost_reconciles_through_requires_payment_method(
    adapter_on: AdapterOn, shop: Shop
) -> None:
    server, adapter, request, key = _a_lost_decline(adapter_on, shop, "order-s5")
    assert _intent_status(shop, "order:s5") is IntentStatus.PENDING
    [declined] = server.gateway.declined_payments
    intent_id = "pi_" + declined["id"].removeprefix("ch_")

    # What reconcile answers, by the key's age (docs/gateways.md: the retention rule).
    call = _context(key, request, 2)
    inside = adapter.charge.reconcile(call, Lookup(key, request, 1, None, timedelta(hours=1)))
    assert inside == NotSent()
    for age in (None, timedelta(hours=24)):
        late = adapter.charge.reconcile(call, Lookup(key, request, 1, None, age))
        assert isinstance(late, Unknown), late
        assert f"PaymentIntent {intent_id} was declined" in late.reason  # that branch

    # The next delivery: reconcile says NotSent, the resend gets the saved 402 back.
    with shop.start("order-s5") as retry, pytest.raises(stripe.CardError) as replayed:
        retry.outbound(adapter.charge, request, business_key="order:s5")
    assert (replayed.value.headers or {}).get("Idempotent-Replayed") == "true"
    assert [r.outcome for r in server.gateway.requests_for(key)] == [DECLINED, REPLAYED]
    assert server.gateway.payments == [] and len(server.gateway.declined_payments) == 1
    assert _intent_status(shop, "order:s5") is IntentStatus.FAILED


def test_a_lost_decline_past_the_key_s_retention_waits_for_an_operator(
    adapter_on: AdapterOn, shop: Shop
) -> None:
    server, adapter, request, key = _a_lost_decline(adapter_on, shop, "order-s6")
    shop.clock.advance(timedelta(hours=24))
    with shop.start("order-s6") as late, pytest.raises(OutboundCallUnreconciledError):
        late.outbound(adapter.charge, request, business_key="order:s6")  # nothing sent
    assert [r.outcome for r in server.gateway.requests_for(key)] == [DECLINED]
    assert _intent_status(shop, "order:s6") is IntentStatus.PENDING


def test_a_retry_that_paid_past_the_key_s_retention_is_found_beside_its_decline(
    adapter_on: AdapterOn, shop: Shop
) -> None:
    """Declined, then retried by its execution 25 h later (Stripe forgot the key, so the
    retry ran afresh and paid), the retry's answer lost: the search finds two
    PaymentIntents under the key, the declined one and the payment. A declined one moved
    no money, so reconcile takes the payment instead of sending a paid order to an
    operator."""
    server, adapter = adapter_on("stripe")
    request = charge_request("order-r")
    server.gateway.inject_fault(FakeGatewayFault.DECLINE, operation="charge")
    raised_then_retry_asked(
        shop, "order-r", adapter.charge, request, stripe.CardError, business_key="order:r"
    )
    shop.clock.advance(timedelta(hours=25))
    server.gateway.inject_fault(FakeGatewayFault.ANSWER_THEN_DROP, operation="charge")
    with shop.start("order-r") as retry, pytest.raises(OutboundCallOutcomeUnknownError):
        retry.outbound(adapter.charge, request, business_key="order:r")
    [payment] = server.gateway.payments
    with shop.start("order-r") as third:
        receipt = third.outbound(adapter.charge, request, business_key="order:r")
    assert receipt["status"] == "succeeded" and receipt["latest_charge"] == payment["id"]
    assert len(server.gateway.payments) == 1 and len(server.gateway.declined_payments) == 1
    assert _intent_status(shop, "order:r") is IntentStatus.COMPLETED
