"""PayPal's capture (or authorize) of an order no payer approved: 422 ORDER_NOT_APPROVED.

PayPal refuses it before anything moves: the payer has not approved the order and the
request names no payment source. The adapter takes that as definite (the intent FAILED,
never ``Unknown`` and resent in a loop, never ``Completed``), and a reconcile of such
an order finds it open and unpaid (``NotSent``). The fake answered the refusal (and an
authorize of a CAPTURE order, ACTION_DOES_NOT_MATCH_INTENT) on its own, without
recording it: a test counting the sends at ``FakeGateway.requests`` missed one. Both are
recorded now, nothing processed and no key kept, so the payer's later approval (a
request with the source) pays the order under the same key.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from paypalserversdk.exceptions.error_exception import ErrorException

from celery_agboss.adapters import paypal as paypal_adapter
from celery_agboss.adapters.paypal import PayPalAdapter, issues_of, order_request_id
from celery_agboss.adapters.paypal_requests import body_of
from celery_agboss.core.outbound import CallContext, Lookup, NotSent
from celery_agboss.core.store_protocol import IntentStatus
from celery_agboss.testing.gateway_server import FakeGatewayServer
from celery_agboss.testing.gateway_types import GatewayRequestOutcome
from tests.adapters.conftest import AdapterOn, ServeFn
from tests.adapters.deliveries import intent_status
from tests.adapters.paypal_support import VAULT_ID, adapter_for, charge_request, dialect_of
from tests.engine.helpers import Shop, business_intent_key

INVALID, PROCESSED = GatewayRequestOutcome.INVALID, GatewayRequestOutcome.PROCESSED
CARD = {"payment_source": {"card": {"vault_id": VAULT_ID}}}


def _unapproved_order(
    adapter_on: AdapterOn, intent: str = "CAPTURE"
) -> tuple[FakeGatewayServer, Any]:
    """An order created as a checkout page creates one: no payment source, not approved."""
    server, adapter = adapter_on("paypal")
    body = {
        "intent": intent,
        "purchase_units": [{"amount": {"currency_code": "USD", "value": "10.00"}}],
    }
    made = adapter.client.orders.create_order({"body": body, "paypal_request_id": "order-k"})
    return server, (adapter, body_of(made)["id"])


def _charges(server: FakeGatewayServer) -> list[tuple[str | None, GatewayRequestOutcome]]:
    return [(r.idempotency_key, r.outcome) for r in server.gateway.requests]


def test_a_capture_of_an_unapproved_order_is_refused_counted_and_charges_nothing(
    adapter_on: AdapterOn,
) -> None:
    server, (adapter, order_id) = _unapproved_order(adapter_on)
    orders: Any = adapter.client.orders
    with pytest.raises(ErrorException) as refused:
        orders.capture_order({"id": order_id, "paypal_request_id": "cap-k"})
    assert (refused.value.response_code, issues_of(refused.value)) == (422, {"ORDER_NOT_APPROVED"})
    assert _charges(server) == [("cap-k", INVALID)], "the refused capture reached the gateway"
    assert server.gateway.payments == []
    # The refusal is not kept under the key: the same key with the source pays the order.
    paid = orders.capture_order({"id": order_id, "paypal_request_id": "cap-k", "body": CARD})
    assert body_of(paid)["status"] == "COMPLETED"
    assert _charges(server) == [("cap-k", INVALID), ("cap-k", PROCESSED)]
    assert len(server.gateway.payments) == 1


def test_an_authorize_of_a_capture_order_is_refused_and_counted(adapter_on: AdapterOn) -> None:
    server, (adapter, order_id) = _unapproved_order(adapter_on)
    orders: Any = adapter.client.orders
    with pytest.raises(ErrorException) as refused:
        orders.authorize_order({"id": order_id, "paypal_request_id": "auth-k", "body": CARD})
    assert issues_of(refused.value) == {"ACTION_DOES_NOT_MATCH_INTENT"}
    assert _charges(server) == [("auth-k", INVALID)]
    assert server.gateway.payments == []


def test_a_charge_paypal_refuses_as_not_approved_fails_once_and_its_order_stays_unpaid(
    served: ServeFn, shop: Shop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The capture goes without a source PayPal will take (as if the payer had still to
    approve): the delivery fails definitely, one send at the gateway, no payment; a
    reconcile of the same charge finds the order open and unpaid, ``NotSent``."""
    server = served("paypal")
    adapter: PayPalAdapter = adapter_for(server.url)
    monkeypatch.setattr(paypal_adapter, "paying_body", lambda wanted, capture: None)
    request = charge_request("order-na")
    with shop.start("order-na") as ctx, pytest.raises(ErrorException) as refused:
        ctx.outbound(adapter.charge, request, business_key="order:na")
    assert issues_of(refused.value) == {"ORDER_NOT_APPROVED"}
    assert adapter.charge.is_definite_failure(refused.value) is True
    assert intent_status(shop, "order:na", adapter.charge.name) is IntentStatus.FAILED
    key = business_intent_key(shop.settings, "order:na", adapter.charge.name)
    assert _charges(server) == [(key, INVALID)], "one capture sent, refused"
    assert server.gateway.payments == []
    [order] = dialect_of(server).orders
    assert order.request_id == order_request_id(key) and order.payment_id is None
    lookup = Lookup(key, request, 1, None, timedelta(minutes=1))
    answer = adapter.charge.reconcile(CallContext(key, request, 1, adapter.charge.name), lookup)
    assert answer == NotSent(), "an open order that nothing paid"
    assert server.gateway.payments == [] and len(dialect_of(server).orders) == 1
