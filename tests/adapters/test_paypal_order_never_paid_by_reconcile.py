"""PayPal's reconcile never pays (design: sweep reconciles): the order is created without
its payment source, which goes in the capture's (authorize's) body.

PayPal may complete an order created with a vaulted source in that one call, and the
fake does as PayPal may. Reconcile finds a charge's order by replaying its create-order;
when the first attempt never reached PayPal, that replay creates the order. Created with
the source, it would be paid by the reconcile itself: by the sweep, which never sends
money, or by a cancelled checkout's reconcile. Each twin
(``PAYPAL_ORDER_CREATED_WITH_SOURCE``) creates the order with the source and counts the
payment the reconcile made at the fake gateway.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from paypalserversdk.exceptions.error_exception import ErrorException

from celery_agboss.adapters.paypal import (
    MAX_REQUEST_ID_LENGTH,
    PayPalAdapter,
    issues_of,
    order_request_id,
)
from celery_agboss.core.keys import fit_key
from celery_agboss.core.lease import acquire
from celery_agboss.core.outbound import (
    CallContext,
    Completed,
    Lookup,
    NotSent,
    OutboundCall,
    Outcome,
)
from celery_agboss.core.protections import PAYPAL_ORDER_CREATED_WITH_SOURCE
from celery_agboss.core.stranded import StrandedOutcome, reconcile_stranded
from celery_agboss.core.transitions import policy_of
from celery_agboss.testing import sabotage
from celery_agboss.testing.fault_arming import OUTBOUND_BEFORE_SEND, arm_raise
from celery_agboss.testing.gateway_server import FakeGatewayServer
from tests.adapters.conftest import ServeFn
from tests.adapters.paypal_support import adapter_for, charge_request, dialect_of
from tests.engine.helpers import Crash, Shop, step_intent_key

KINDS = ["charge", "authorize"]
PAID_STATUS = {"charge": "succeeded", "authorize": "requires_capture"}


def _paypal(served: ServeFn) -> tuple[FakeGatewayServer, PayPalAdapter]:
    server = served("paypal")
    return server, adapter_for(server.url)


def _reconcile_never_sent(call: OutboundCall, order: str) -> Any:
    """``call``'s reconcile of a request whose first attempt never reached PayPal, handed
    the request as the store keeps it."""
    key = f"default:b:{order}:{call.name}"
    stored = policy_of(call).mask_request(charge_request(order))
    lookup = Lookup(key, stored, 1, None, timedelta(minutes=5))
    return call.reconcile(CallContext(key, stored, 1, call.name), lookup)


# --- reconcile itself ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_reconcile_of_a_charge_never_sent_pays_nothing(served: ServeFn, kind: str) -> None:
    server, adapter = _paypal(served)
    answer = _reconcile_never_sent(getattr(adapter, kind), "order-7")
    assert answer == NotSent(), answer
    assert server.gateway.payments == [], "reconcile made a payment"
    [order] = dialect_of(server).orders
    assert (order.source, order.payment_id) == (None, None), "an unpaid order, no source"


@pytest.mark.parametrize("kind", KINDS)
def test_twin_an_order_created_with_its_source_is_paid_by_the_reconcile(
    served: ServeFn, kind: str
) -> None:
    server, adapter = _paypal(served)
    with sabotage(PAYPAL_ORDER_CREATED_WITH_SOURCE):
        answer = _reconcile_never_sent(getattr(adapter, kind), "order-7")
    assert isinstance(answer, Completed), answer
    [paid] = server.gateway.payments
    assert paid["status"] == PAID_STATUS[kind], "paid by the create-order reconcile replayed"
    assert dialect_of(server).orders[0].paid_at_creation


# --- the sweep, after a crash right after the claim -----------------------------------------


def _crashed_after_the_claim(shop: Shop, call: OutboundCall) -> str:
    """``task-1`` claimed the charge and died before sending anything; its lease expired."""
    dead = shop.start("task-1")
    arm_raise(OUTBOUND_BEFORE_SEND, Crash, only={"holder": dead.lease_ref.holder})
    with pytest.raises(Crash):
        dead.outbound(call, charge_request("order-1"))
    shop.expire_leases()
    return step_intent_key(shop.settings, "task-1", call.name)


def _sweep(shop: Shop, key: str) -> StrandedOutcome:
    sweeper = acquire(shop.store, "agboss-sweep-test", ttl_ms=10_000)
    assert sweeper is not None
    try:
        return reconcile_stranded(shop.store, shop.settings, key, sweeper_lease=sweeper, by="sweep")
    finally:
        shop.store.release_lease(sweeper.ref)


def test_the_sweep_s_reconcile_of_a_charge_never_sent_pays_nothing(
    served: ServeFn, shop: Shop
) -> None:
    server, adapter = _paypal(served)
    key = _crashed_after_the_claim(shop, adapter.charge)
    assert _sweep(shop, key) is StrandedOutcome.NOT_SENT_CONFIRMED
    assert server.gateway.payments == [], "the sweep never sends money"
    with shop.start("task-1") as redriven:  # the execution's own delivery sends it
        receipt = redriven.outbound(adapter.charge, charge_request("order-1"))
        assert redriven.last_outcome is Outcome.SENT
    assert [p["id"] for p in server.gateway.payments] == [receipt["id"]]
    assert len(dialect_of(server).orders) == 1, "the resend found the sweep's unpaid order"


def test_twin_the_sweep_s_reconcile_pays_a_charge_never_sent(served: ServeFn, shop: Shop) -> None:
    server, adapter = _paypal(served)
    key = _crashed_after_the_claim(shop, adapter.charge)
    with sabotage(PAYPAL_ORDER_CREATED_WITH_SOURCE):
        assert _sweep(shop, key) is StrandedOutcome.COMPLETED
    [paid] = server.gateway.payments
    sent = fit_key(key, MAX_REQUEST_ID_LENGTH)
    assert paid["idempotency_key"] == order_request_id(sent), "paid by the sweep's create"


# --- a normal charge -------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_vaulted_charge_is_paid_once_by_its_own_keyed_request(
    served: ServeFn, shop: Shop, kind: str
) -> None:
    """The order is created unpaid; the capture (authorize) carries the source and the
    call's key, and pays it once."""
    server, adapter = _paypal(served)
    call: OutboundCall = getattr(adapter, kind)
    with shop.start("task-1") as ctx:
        receipt = ctx.outbound(call, charge_request("order-1"))
    sent = fit_key(step_intent_key(shop.settings, "task-1", call.name), MAX_REQUEST_ID_LENGTH)
    [paid] = server.gateway.payments
    assert (paid["idempotency_key"], paid["status"]) == (sent, PAID_STATUS[kind])
    [order] = dialect_of(server).orders
    assert not order.paid_at_creation and order.payment_key == sent
    assert receipt["order_id"] == order.id and receipt["amount"] == 1000


@pytest.mark.parametrize("kind", KINDS)
def test_an_order_paid_at_its_creation_is_taken_without_a_second_payment(
    served: ServeFn, shop: Shop, kind: str
) -> None:
    """The branch for an order the create answers already paid (an order made by an
    adapter that still sent its source): its payment is the result, nothing is sent."""
    server, adapter = _paypal(served)
    call: OutboundCall = getattr(adapter, kind)
    with sabotage(PAYPAL_ORDER_CREATED_WITH_SOURCE), shop.start("task-1") as ctx:
        receipt = ctx.outbound(call, charge_request("order-1"))
    [paid] = server.gateway.payments
    assert paid["status"] == PAID_STATUS[kind] and dialect_of(server).orders[0].paid_at_creation
    assert receipt["id"] in (paid["id"], "cap_" + paid["id"].removeprefix("ch_"))
    assert len(server.gateway.requests) == 1, "no capture or authorize after the create"


def test_an_order_created_without_a_source_is_not_paid_by_a_capture_without_one(
    served: ServeFn,
) -> None:
    """The fake as PayPal: an order no payer approved and no request pays stays unpaid."""
    server, adapter = _paypal(served)
    _reconcile_never_sent(adapter.charge, "order-3")
    [order] = dialect_of(server).orders
    with pytest.raises(ErrorException) as refused:
        adapter.client.orders.capture_order({"id": order.id, "paypal_request_id": "k-1"})
    assert refused.value.response_code == 422
    assert issues_of(refused.value) == {"ORDER_NOT_APPROVED"}
    assert server.gateway.payments == []
