"""Checkout.com's decline through the adapter, against a fake that keeps it under the key.

A decline is a 201 (``approved: false``), and Checkout.com saves every 2xx under the
``Cko-Idempotency-Key``: a resend under the same key inside the key's retention gets the
same decline back, and no second authorization is attempted (docs/gateways.md,
Checkout.com, how errors are classified). The fake used to decline before the gateway
and keep nothing, so a resend was a fresh attempt in tests, not in production.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import requests

from celery_agboss.adapters.checkout import CheckoutDeclinedError
from celery_agboss.core.outbound import CallContext, Lookup, NotSent, Unknown
from celery_agboss.core.store_protocol import IntentStatus
from celery_agboss.testing.gateway_server import FakeGatewayServer
from celery_agboss.testing.gateway_types import FakeGatewayFault, GatewayRequestOutcome
from tests.adapters.checkout_support import (
    DECLINED_TOKEN,
    SECRET_KEY,
    charge_request,
)
from tests.adapters.conftest import AdapterOn
from tests.adapters.deliveries import intent_status, lose_at_the_gateway, raised_then_retry_asked
from tests.engine.helpers import Shop, business_intent_key

DECLINED = GatewayRequestOutcome.DECLINED
REPLAYED = GatewayRequestOutcome.REPLAYED


def _declined_request(reference: str) -> dict[str, Any]:
    return {**charge_request(reference), "source": DECLINED_TOKEN}


def _listed(server: FakeGatewayServer, reference: str) -> list[dict[str, Any]]:
    """``GET /payments?reference=`` as Checkout.com answers it (declined payments too)."""
    answer = requests.get(
        f"{server.url}/payments",
        params={"reference": reference, "limit": 100},
        headers={"Authorization": f"Bearer {SECRET_KEY}"},
        timeout=5,
    )
    assert answer.status_code == 200, answer.text
    data: list[dict[str, Any]] = answer.json()["data"]
    return data


def _intent_status(shop: Shop, business_key: str) -> IntentStatus:
    return intent_status(shop, business_key, "checkout.charge")


def test_a_declined_charge_retried_under_its_key_gets_the_same_decline_replayed(
    adapter_on: AdapterOn, shop: Shop
) -> None:
    server, adapter = adapter_on("checkout")
    request = _declined_request("order-d1")
    # autoretry_for=(CheckoutDeclinedError,): the same key again
    declined = raised_then_retry_asked(
        shop, "order-d1", adapter.charge, request, CheckoutDeclinedError, business_key="order:d1"
    )
    assert _intent_status(shop, "order:d1") is IntentStatus.FAILED
    with shop.start("order-d1") as retry, pytest.raises(CheckoutDeclinedError) as again:
        retry.outbound(adapter.charge, request, business_key="order:d1")

    assert again.value.details == declined.details  # the same payment, replayed
    assert again.value.details["payment_id"].startswith("pay_")
    key = business_intent_key(shop.settings, "order:d1", "checkout.charge")
    outcomes = [r.outcome for r in server.gateway.requests_for(key)]
    assert outcomes == [DECLINED, REPLAYED], "no second authorization attempt"
    assert len(server.declines) == 1, "the card was declined once"
    assert server.gateway.payments == []
    [payment] = server.gateway.declined_payments
    assert "pay_" + payment["id"].removeprefix("ch_") == declined.details["payment_id"]
    assert _intent_status(shop, "order:d1") is IntentStatus.FAILED


def test_another_card_under_a_declined_key_gets_the_decline_not_a_charge(
    adapter_on: AdapterOn,
) -> None:
    """Checkout.com does not compare a repeat's parameters (no G5): the key's first 2xx
    is the answer, whatever card the repeat carries. Another card needs another key."""
    server, adapter = adapter_on("checkout")
    key = "default:t:order-d2:checkout.charge"
    with pytest.raises(CheckoutDeclinedError) as declined:
        adapter.charge.send(CallContext(key, _declined_request("order-d2"), 1, "checkout.charge"))
    good_card = CallContext(key, charge_request("order-d2"), 2, "checkout.charge")
    with pytest.raises(CheckoutDeclinedError) as again:
        adapter.charge.send(good_card)
    assert again.value.details == declined.value.details
    assert server.gateway.payments == []
    assert [r.outcome for r in server.gateway.requests_for(key)] == [DECLINED, REPLAYED]


def test_a_declined_card_under_an_approved_key_gets_the_approval_replayed(
    adapter_on: AdapterOn,
) -> None:
    server, adapter = adapter_on("checkout")
    key = "default:t:order-d3:checkout.charge"
    paid = adapter.charge.send(CallContext(key, charge_request("order-d3"), 1, "checkout.charge"))
    declined_card = CallContext(key, _declined_request("order-d3"), 2, "checkout.charge")
    assert adapter.charge.send(declined_card) == paid
    assert server.declines == [], "the key answered: the card was never tried"
    assert len(server.gateway.payments) == 1


def test_an_injected_decline_is_kept_under_the_key_too(adapter_on: AdapterOn) -> None:
    server, adapter = adapter_on("checkout")
    key = "default:t:order-d4:checkout.charge"
    server.gateway.inject_fault(FakeGatewayFault.DECLINE, operation="charge")
    context = CallContext(key, charge_request("order-d4"), 1, "checkout.charge")
    with pytest.raises(CheckoutDeclinedError) as declined:
        adapter.charge.send(context)
    with pytest.raises(CheckoutDeclinedError) as again:
        adapter.charge.send(context)
    assert again.value.details == declined.value.details
    assert server.gateway.payments == []


def test_a_declined_payment_is_listed_and_read_as_declined(adapter_on: AdapterOn) -> None:
    server, adapter = adapter_on("checkout")
    key = "default:t:order-d5:checkout.charge"
    with pytest.raises(CheckoutDeclinedError) as declined:
        adapter.charge.send(CallContext(key, _declined_request("order-d5"), 1, "checkout.charge"))
    payment_id = declined.value.details["payment_id"]
    [listed] = _listed(server, "order-d5")
    assert (listed["id"], listed["approved"], listed["status"]) == (payment_id, False, "Declined")
    assert listed["balances"]["total_authorized"] == 0
    assert listed["balances"]["available_to_capture"] == 0
    [authorization] = adapter._actions(payment_id)
    assert authorization["type"] == "Authorization" and authorization["approved"] is False
    assert adapter.lookup(key) is None, "a declined payment is not the key's payment"


def test_a_decline_whose_answer_was_lost_is_resent_and_the_decline_replayed(
    adapter_on: AdapterOn, shop: Shop
) -> None:
    """Reconcile lists the reference: the declined payment is not counted, so ``NotSent``
    inside the key's retention; the resend under the key gets the saved decline."""
    server, adapter = adapter_on("checkout")
    request = _declined_request("order-d6")
    key = lose_at_the_gateway(shop, server, "order-d6", adapter.charge, request, "order:d6")
    assert _intent_status(shop, "order:d6") is IntentStatus.PENDING
    with shop.start("order-d6") as retry, pytest.raises(CheckoutDeclinedError):
        retry.outbound(adapter.charge, request, business_key="order:d6")
    assert [r.outcome for r in server.gateway.requests_for(key)] == [DECLINED, REPLAYED]
    assert len(server.gateway.declined_payments) == 1 and server.gateway.payments == []
    assert _intent_status(shop, "order:d6") is IntentStatus.FAILED

    # The same listing, past the key's retention: a declined payment is never taken for
    # a payment, and a resend could be a new authorization there, so an operator decides.
    call = CallContext(key, request, 2, adapter.charge.name)
    inside = Lookup(key, request, 1, None, timedelta(hours=1))
    assert adapter.charge.reconcile(call, inside) == NotSent()
    late = adapter.charge.reconcile(call, Lookup(key, request, 1, None, timedelta(hours=24)))
    assert isinstance(late, Unknown) and "order-d6" in late.reason
