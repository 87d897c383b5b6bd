"""A capture, refund or void Checkout.com declines is never recorded as done.

Checkout.com accepts an action with a 202 and may decline it afterwards: the payment's
actions list it ``approved: false`` with a decline ``response_code``, and no money moves
(its ``payment_refund_declined``, ``payment_capture_declined`` and
``payment_void_declined`` events). The adapter used to drop ``approved``: such a refund
came back as a result, and the intent read COMPLETED while nothing was refunded. Send
now raises ``CheckoutDeclinedError`` (definite), and reconcile answers ``Unknown``
naming the decline (reconcile has no definite failure to answer), never ``Completed``.
The fake declines an action as Checkout.com does (``CheckoutDialect.decline_next``):
the 202 is kept under the key, and the money is counted at the fake.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from celery_agboss.adapters.checkout import CheckoutAdapter, CheckoutDeclinedError
from celery_agboss.core.outbound import CallContext, Completed, Lookup, Unknown
from celery_agboss.core.store_protocol import IntentRecord, IntentStatus
from celery_agboss.errors import OutboundCallUnreconciledError
from celery_agboss.testing.dialects.checkout import checkout_id
from celery_agboss.testing.gateway_server import FakeGatewayServer
from celery_agboss.testing.gateway_types import GatewayRequestOutcome
from tests.adapters.checkout_support import charge_request, dialect_of
from tests.adapters.conftest import AdapterOn
from tests.adapters.deliveries import lose_at_the_gateway, raised_then_retry_asked
from tests.engine.helpers import Shop, business_intent_key

DECLINED = GatewayRequestOutcome.DECLINED
PROCESSED = GatewayRequestOutcome.PROCESSED
REPLAYED = GatewayRequestOutcome.REPLAYED


def _paid(
    adapter_on: AdapterOn, shop: Shop, order: str, *, capture: bool = True
) -> tuple[FakeGatewayServer, CheckoutAdapter, str]:
    """A payment of 1000 made (captured, or only authorised) through the adapter."""
    server, adapter = adapter_on("checkout")
    call = adapter.charge if capture else adapter.authorize
    with shop.start(f"pay-{order}") as ctx:
        payment = ctx.outbound(call, charge_request(order), business_key=f"order:{order}")
    return server, adapter, payment["id"]


def _a_refund_declined_next(
    adapter_on: AdapterOn, shop: Shop, order: str
) -> tuple[FakeGatewayServer, CheckoutAdapter, str, dict[str, Any], str]:
    """The order's payment of 1000 captured and the fake set to decline its next refund:
    the server, the adapter, the payment, a refund of 300 of it and that refund's
    business key."""
    server, adapter, payment_id = _paid(adapter_on, shop, order)
    dialect_of(server).decline_next("refund")
    refund = {"payment_id": payment_id, "amount": 300}
    return server, adapter, payment_id, refund, f"refund:{payment_id}"


def _payment_at_the_fake(server: FakeGatewayServer, payment_id: str) -> dict[str, Any]:
    [payment] = [p for p in server.gateway.payments if checkout_id(p["id"]) == payment_id]
    return payment


def _intent(shop: Shop, business_key: str, name: str) -> IntentRecord:
    intent = shop.store.read_intent(business_intent_key(shop.settings, business_key, name))
    assert intent is not None
    return intent


def test_a_refund_the_gateway_declines_is_a_definite_failure_not_completed(
    adapter_on: AdapterOn, shop: Shop
) -> None:
    server, adapter, payment_id, refund, business_key = _a_refund_declined_next(
        adapter_on, shop, "r1"
    )
    with shop.start("refund-r1") as ctx, pytest.raises(CheckoutDeclinedError) as declined:
        ctx.outbound(adapter.refund, refund, business_key=business_key)

    details = declined.value.details
    assert details["payment_id"] == payment_id and details["type"] == "Refund"
    assert (details["approved"], details["response_code"]) == (False, "20005")
    assert adapter.refund.is_definite_failure(declined.value) is True
    assert _intent(shop, business_key, "checkout.refund").status is IntentStatus.FAILED
    # Counted at the fake: the refund was declined there and no money went back.
    key = business_intent_key(shop.settings, business_key, "checkout.refund")
    assert [r.outcome for r in server.gateway.requests_for(key)] == [DECLINED]
    assert server.gateway.refunds == []
    assert _payment_at_the_fake(server, payment_id)["amount_refunded"] == 0
    [listed] = [a for a in adapter._actions(payment_id) if a["type"] == "Refund"]
    assert (listed["id"], listed["approved"]) == (details["action_id"], False)


def test_a_declined_refund_retried_under_its_key_gets_the_decline_replayed(
    adapter_on: AdapterOn, shop: Shop
) -> None:
    """Checkout.com keeps the 202 under the key: a resend is answered the same declined
    action, never refunded afresh inside the key's retention."""
    server, adapter, _, refund, business_key = _a_refund_declined_next(adapter_on, shop, "r2")
    # autoretry_for=(CheckoutDeclinedError,): the same key again
    declined = raised_then_retry_asked(
        shop, "refund-r2", adapter.refund, refund, CheckoutDeclinedError, business_key=business_key
    )
    with shop.start("refund-r2") as retry, pytest.raises(CheckoutDeclinedError) as again:
        retry.outbound(adapter.refund, refund, business_key=business_key)

    assert again.value.details == declined.details  # the same action, replayed
    key = business_intent_key(shop.settings, business_key, "checkout.refund")
    assert [r.outcome for r in server.gateway.requests_for(key)] == [DECLINED, REPLAYED]
    assert server.gateway.refunds == []


def test_a_declined_refund_whose_answer_was_lost_is_not_reconciled_as_completed(
    adapter_on: AdapterOn, shop: Shop
) -> None:
    server, adapter, payment_id, refund, business_key = _a_refund_declined_next(
        adapter_on, shop, "r3"
    )
    key = lose_at_the_gateway(shop, server, "refund-r3", adapter.refund, refund, business_key)
    assert _intent(shop, business_key, "checkout.refund").status is IntentStatus.PENDING

    with shop.start("refund-r3") as retry, pytest.raises(OutboundCallUnreconciledError):
        retry.outbound(adapter.refund, refund, business_key=business_key)

    intent = _intent(shop, business_key, "checkout.refund")
    assert intent.status is IntentStatus.PENDING and intent.needs_operator
    assert intent.operator_reason is not None and "declined" in intent.operator_reason
    assert [r.outcome for r in server.gateway.requests_for(key)] == [DECLINED], "nothing resent"
    assert server.gateway.refunds == []
    assert _payment_at_the_fake(server, payment_id)["amount_refunded"] == 0


@pytest.mark.parametrize("kind", ["capture", "void"])
def test_a_declined_capture_or_void_is_neither_sent_nor_reconciled_as_done(
    adapter_on: AdapterOn, shop: Shop, kind: str
) -> None:
    server, adapter, payment_id = _paid(adapter_on, shop, f"{kind}-1", capture=False)
    dialect_of(server).decline_next(kind)
    call: Any = getattr(adapter, kind)
    key, request = f"default:t:{kind}-1:checkout.{kind}", {"payment_id": payment_id}
    with pytest.raises(CheckoutDeclinedError) as declined:
        call.send(CallContext(key, request, 1, call.name))
    assert call.is_definite_failure(declined.value) is True

    answer = call.reconcile(
        CallContext(key, request, 1, call.name), Lookup(key, request, 1, None, timedelta(0))
    )
    assert isinstance(answer, Unknown) and "declined" in answer.reason
    payment = _payment_at_the_fake(server, payment_id)
    assert (payment["status"], payment["amount_captured"]) == ("requires_capture", 0)


def test_reconcile_takes_the_approved_refund_under_a_key_over_a_declined_one(
    adapter_on: AdapterOn, shop: Shop
) -> None:
    """Past the key's retention a resend is a new refund under the same key: the
    declined one moved no money, so the approved one is the call's."""
    server, adapter, payment_id = _paid(adapter_on, shop, "r4")
    dialect_of(server).decline_next("refund")
    key, request = "default:t:r4:checkout.refund", {"payment_id": payment_id, "amount": 300}
    with pytest.raises(CheckoutDeclinedError):
        adapter.refund.send(CallContext(key, request, 1, adapter.refund.name))
    server.gateway.forget_keys()
    refunded = adapter.refund.send(CallContext(key, request, 2, adapter.refund.name))
    assert refunded["approved"] is True and refunded["response_code"] == "10000"

    lookup = Lookup(key, request, 2, None, timedelta(0))
    answer = adapter.refund.reconcile(CallContext(key, request, 2, adapter.refund.name), lookup)
    assert answer == Completed(refunded)
    assert [r["amount"] for r in server.gateway.refunds] == [300]
    assert [r.outcome for r in server.gateway.requests_for(key)] == [DECLINED, PROCESSED]
