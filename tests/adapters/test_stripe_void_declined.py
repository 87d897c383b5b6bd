"""Stripe cancels a declined PaymentIntent, and so does the fake (a fidelity fix, no money).

A decline leaves the PaymentIntent in ``requires_payment_method``; Stripe cancels one in
that status (as in ``requires_capture``, ``requires_confirmation`` and
``requires_action``). The fake used to cancel only an authorization awaiting capture and
answered 400 for a declined one. Cancelled, it stays a declined payment: no money moved.
"""

from __future__ import annotations

from typing import Any

import pytest
import stripe

from celery_agboss.adapters.stripe import StripeAdapter
from celery_agboss.core.outbound import CallContext
from celery_agboss.testing.gateway_server import FakeGatewayServer
from celery_agboss.testing.gateway_types import GatewayRequestOutcome
from tests.adapters.conftest import AdapterOn
from tests.adapters.stripe_support import charge_request
from tests.engine.helpers import Shop

DECLINING = "pm_card_chargeDeclined"  # Stripe's documented always-declining test method


def _declined(adapter_on: AdapterOn) -> tuple[FakeGatewayServer, StripeAdapter, str]:
    """An authorization declined by the card: its PaymentIntent's id."""
    server, adapter = adapter_on("stripe")
    request: dict[str, Any] = {**charge_request("order-v1"), "source": DECLINING}
    context = CallContext("default:t:order-v1:stripe.authorize", request, 1, "stripe.authorize")
    with pytest.raises(stripe.CardError) as declined:
        adapter.authorize.send(context)
    assert declined.value.error is not None and declined.value.error.payment_intent is not None
    return server, adapter, str(declined.value.error.payment_intent["id"])


def test_a_declined_payment_intent_is_cancelled(adapter_on: AdapterOn, shop: Shop) -> None:
    server, adapter, intent_id = _declined(adapter_on)
    with shop.start("cancel") as ctx:
        voided = ctx.outbound(adapter.void, {"payment_id": intent_id})
    assert (voided["id"], voided["status"]) == (intent_id, "canceled")
    assert adapter.client.v1.payment_intents.retrieve(intent_id).status == "canceled"
    assert server.gateway.payments == [], "no money moved"
    assert [p["status"] for p in server.gateway.declined_payments] == ["canceled"]
    voids = [r.outcome for r in server.gateway.requests if r.operation == "void"]
    assert voids == [GatewayRequestOutcome.PROCESSED]


def test_a_lost_answer_of_that_cancel_is_reconciled_by_its_status(
    adapter_on: AdapterOn, shop: Shop
) -> None:
    server, adapter, intent_id = _declined(adapter_on)
    request = {"payment_id": intent_id}
    shop.lose_the_answer("cancel", adapter.void, request, gateway=server.gateway, operation="void")
    voided = shop.reconciled("cancel", adapter.void, request)
    assert (voided["id"], voided["status"]) == (intent_id, "canceled")
    assert [r.operation for r in server.gateway.requests] == ["charge", "void"]
