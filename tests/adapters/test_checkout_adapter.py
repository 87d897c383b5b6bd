"""The Checkout.com adapter through the official SDK against the fake's checkout dialect:
the checklist at the documented level, the payment scenarios (design: PS1, PS17, PS19) counted
at the gateway, and the key the gateway saw on every money-moving request."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest

from celery_agboss.adapters.checkout import (
    KEY_METADATA_FIELD,
    CheckoutAdapter,
    CheckoutDeclinedError,
)
from celery_agboss.core.keys import fit_key
from celery_agboss.core.outbound import CallContext, Completed, Lookup, NotSent, Outcome, Unknown
from celery_agboss.core.protections import EVERY_ERROR_DEFINITE
from celery_agboss.core.store_protocol import IntentStatus
from celery_agboss.errors import OutboundCallUnreconciledError
from celery_agboss.testing import sabotage
from celery_agboss.testing.checklist import GatewayCheckStatus
from celery_agboss.testing.clock import VirtualClock
from celery_agboss.testing.dialects.checkout import checkout_id
from celery_agboss.testing.gateway_server import FakeGatewayServer
from celery_agboss.testing.gateway_types import FakeGatewayFault, GatewayRequestOutcome
from tests.adapters.checkout_support import DECLINED_TOKEN, adapter_for, charge_request
from tests.adapters.conftest import (
    AdapterOn,
    ServeFn,
    checklist_shows,
    refund_from_every_path,
)
from tests.adapters.deliveries import raised_then_retry_asked
from tests.engine.helpers import DAY, Shop, business_intent_key

RETENTION = 86400  # Checkout.com's documented default: 24 h
DOCUMENTED = {  # what Checkout.com's docs promise, requirement by requirement
    "G1": GatewayCheckStatus.PASSED,  # Cko-Idempotency-Key
    "G2": GatewayCheckStatus.PASSED,  # GET /payments?reference=
    "G3": GatewayCheckStatus.PASSED,  # 24 h
    "G4": GatewayCheckStatus.PASSED,  # the first 2xx answer replayed
    "G5": GatewayCheckStatus.FAILED,  # not documented for payments
}
PROCESSED = GatewayRequestOutcome.PROCESSED


def _charges(server: FakeGatewayServer) -> list[GatewayRequestOutcome]:
    return [r.outcome for r in server.gateway.requests if r.operation == "charge"]


def _charge_answer_lost(
    adapter_on: AdapterOn, shop: Shop, order: str
) -> tuple[FakeGatewayServer, CheckoutAdapter]:
    """The order's charge made at Checkout.com, its answer lost: the delivery saw ``unknown``."""
    server, adapter = adapter_on("checkout")
    shop.lose_the_answer(order, adapter.charge, charge_request(order), gateway=server.gateway)
    return server, adapter


def test_the_checklist_through_the_sdk_finds_what_checkout_documents(
    served: ServeFn, db_clock: VirtualClock
) -> None:
    checklist_shows(adapter_for(served("checkout").url), db_clock, RETENTION, DOCUMENTED)


def test_ps1_an_answer_lost_after_the_charge_is_reconciled_by_reference(
    adapter_on: AdapterOn, shop: Shop
) -> None:
    server, adapter = _charge_answer_lost(adapter_on, shop, "order-1")
    receipt = shop.reconciled("order-1", adapter.charge, charge_request("order-1"))
    assert [checkout_id(p["id"]) for p in server.gateway.payments] == [receipt["id"]]
    assert receipt["status"] == "Captured" and receipt["reference"] == "order-1"
    assert _charges(server) == [PROCESSED], "no second charge reached the gateway"


def test_ps17_a_retry_after_the_key_expired_finds_the_payment_instead_of_paying_again(
    adapter_on: AdapterOn, shop: Shop
) -> None:
    server, adapter = _charge_answer_lost(adapter_on, shop, "order-17")
    shop.clock.advance(DAY + timedelta(minutes=1))
    server.gateway.forget_keys()  # Checkout.com's 24 h passed
    receipt = shop.reconciled("order-17", adapter.charge, charge_request("order-17"))
    assert [checkout_id(p["id"]) for p in server.gateway.payments] == [receipt["id"]]
    assert _charges(server) == [PROCESSED]


def test_ps17_nothing_found_after_the_key_expired_is_left_to_an_operator(
    adapter_on: AdapterOn, shop: Shop
) -> None:
    server, adapter = adapter_on("checkout")
    server.gateway.hold(before_processing=True, timeout=0.05)  # dropped, never processed
    shop.unknown("order-17b", adapter.charge, charge_request("order-17b"))
    shop.clock.advance(DAY + timedelta(minutes=1))
    server.gateway.forget_keys()
    with shop.start("order-17b") as retry, pytest.raises(OutboundCallUnreconciledError):
        retry.outbound(adapter.charge, charge_request("order-17b"))
    assert server.gateway.payments == []
    assert len(server.gateway.requests) == 1, "nothing was resent"


def test_sabotage_twin_a_lost_answer_taken_for_a_failure_pays_twice_past_the_key(
    adapter_on: AdapterOn, shop: Shop
) -> None:
    server, adapter = adapter_on("checkout")
    server.gateway.inject_fault(FakeGatewayFault.ANSWER_THEN_DROP)
    with sabotage(EVERY_ERROR_DEFINITE):
        request = charge_request("order-17")
        # the body's autoretry_for=(Exception,):
        raised_then_retry_asked(shop, "order-17", adapter.charge, request, Exception)
        shop.clock.advance(DAY + timedelta(minutes=1))
        server.gateway.forget_keys()
        with shop.start("order-17") as retry:
            retry.outbound(adapter.charge, charge_request("order-17"))
    assert len(server.gateway.payments) == 2
    assert _charges(server) == [PROCESSED, PROCESSED]


def test_ps19_a_refund_whose_answer_was_lost_refunds_once_from_every_path(
    adapter_on: AdapterOn, shop: Shop
) -> None:
    server, adapter = adapter_on("checkout")
    with shop.start("order-19") as ctx:
        payment = ctx.outbound(adapter.charge, charge_request("order-19"))
    refund = {"payment_id": payment["id"], "amount": 300}
    business_key = f"refund:{payment['id']}:1"
    refunded, outcome = refund_from_every_path(shop, server, adapter.refund, refund, business_key)
    assert outcome is Outcome.RECONCILED
    assert len(server.gateway.refunds) == 1
    assert refunded["type"] == "Refund" and refunded["amount"] == 300
    assert refunded["status"] == "Partially Refunded" and refunded["currency"] == "usd"


def test_every_money_moving_request_carries_the_intent_s_key(
    adapter_on: AdapterOn, shop: Shop
) -> None:
    server, adapter = adapter_on("checkout")
    long_order = "order:" + "x" * 300  # a key past the metadata's 255 characters
    with shop.start("keys") as ctx:
        paid = ctx.outbound(adapter.charge, charge_request("k1"), business_key=long_order)
        held = ctx.outbound(adapter.authorize, charge_request("k2"), business_key="order:k2")
        ctx.outbound(adapter.capture, {"payment_id": held["id"]}, business_key="capture:k2")
        ctx.outbound(adapter.refund, {"payment_id": paid["id"]}, business_key="refund:k1")
        other = ctx.outbound(adapter.authorize, charge_request("k3"), business_key="order:k3")
        ctx.outbound(adapter.void, {"payment_id": other["id"]}, business_key="void:k3")
    calls = [
        (long_order, "charge"),
        ("order:k2", "authorize"),
        ("capture:k2", "capture"),
        ("refund:k1", "refund"),
        ("order:k3", "authorize"),
        ("void:k3", "void"),
    ]
    keys = [business_intent_key(shop.settings, bk, f"checkout.{op}") for bk, op in calls]
    assert [r.idempotency_key for r in server.gateway.requests] == keys
    assert len(keys[0]) > 255, "the header carries the whole key: no limit is documented"
    marks = [p["metadata"]["metadata"][KEY_METADATA_FIELD] for p in server.gateway.payments]
    assert marks == [fit_key(keys[0], 255), keys[1], keys[4]]
    assert [p["status"] for p in server.gateway.payments] == ["refunded", "succeeded", "canceled"]
    assert {seen.pid for seen in server.charges_seen} == {os.getpid()}  # the support's header


def test_a_declined_card_is_a_definite_failure_and_moves_no_money(
    adapter_on: AdapterOn, shop: Shop
) -> None:
    server, adapter = adapter_on("checkout")
    declined = {**charge_request("order-d"), "source": DECLINED_TOKEN}
    with shop.start("order-d") as ctx, pytest.raises(CheckoutDeclinedError) as caught:
        ctx.outbound(adapter.charge, declined, business_key="order:d")
    assert caught.value.details["response_code"] == "20005"
    intent = shop.store.read_intent(
        business_intent_key(shop.settings, "order:d", "checkout.charge")
    )
    assert intent is not None and intent.status is IntentStatus.FAILED
    assert server.gateway.payments == []


def _lookup(key: str, request: dict[str, object], age: timedelta | None) -> Lookup:
    return Lookup(key, request, 1, None, age)


def test_reconcile_answers_not_sent_only_inside_the_key_s_retention(served: ServeFn) -> None:
    adapter = adapter_for(served("checkout").url, key_retention=timedelta(hours=6))
    call = CallContext("k-absent", {}, 1, adapter.charge.name)
    request = charge_request("order-absent")
    inside = _lookup("k-absent", request, timedelta(hours=5))
    assert adapter.charge.reconcile(call, inside) == NotSent()
    for age in (None, timedelta(hours=6)):
        answer = adapter.charge.reconcile(call, _lookup("k-absent", request, age))
        assert isinstance(answer, Unknown) and "order-absent" in answer.reason


def test_reconcile_matches_reference_amount_currency_and_the_key_in_metadata(
    adapter_on: AdapterOn,
) -> None:
    server, adapter = adapter_on("checkout")
    call = CallContext("k-mine", {}, 1, adapter.charge.name)
    age = timedelta(minutes=1)
    adapter.charge.send(CallContext("k-other", charge_request("order-m"), 1, "x"))
    adapter.charge.send(CallContext("k-cheap", charge_request("order-m", amount=5), 1, "x"))
    mine = _lookup("k-mine", charge_request("order-m"), age)
    assert adapter.charge.reconcile(call, mine) == NotSent(), "another key's payment is not ours"
    made = adapter.charge.send(CallContext("k-mine", charge_request("order-m"), 1, "x"))
    assert adapter.charge.reconcile(call, mine) == Completed(made)
    for key in ("walk-in-1", "walk-in-2"):  # payments of the order made without our key
        server.gateway.charge(1000, key, reference="order-n", metadata={}, source={})
    answer = adapter.charge.reconcile(call, _lookup("k-mine", charge_request("order-n"), age))
    assert isinstance(answer, Unknown)
    assert all(checkout_id(p["id"]) in answer.reason for p in server.gateway.payments[-2:])


def test_authorize_capture_and_void_return_the_payment_s_state(adapter_on: AdapterOn) -> None:
    server, adapter = adapter_on("checkout")
    held = adapter.authorize.send(CallContext("a-1", charge_request("order-a"), 1, "x"))
    assert held["status"] == "Authorized" and server.gateway.payments[0]["amount_captured"] == 0
    captured = adapter.capture.send(CallContext("c-1", {"payment_id": held["id"]}, 1, "x"))
    assert captured["status"] == "Captured" and captured["amount"] == 1000
    again = adapter.capture.send(CallContext("c-1", {"payment_id": held["id"]}, 1, "x"))
    assert again == captured, "the key replayed the capture"
    other = adapter.authorize.send(CallContext("a-2", charge_request("order-b"), 1, "x"))
    voided = adapter.void.send(CallContext("v-2", {"payment_id": other["id"]}, 1, "x"))
    assert voided["status"] == "Voided" and voided["type"] == "Void"
    found = adapter.void.reconcile(
        CallContext("v-2", {}, 1, "x"),
        _lookup("v-2", {"payment_id": other["id"]}, timedelta(seconds=1)),
    )
    assert found == Completed(voided)
