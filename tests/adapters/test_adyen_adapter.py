"""The Adyen adapter through the official SDK against the fake's Adyen dialect.

Adyen has no payment lookup, so everything rests on its key (design: G1) and its 7-day
window (design: G3): a lost answer is resent under the same key inside the window and Adyen
answers the first response; past the window reconcile answers unknown, and only the
sabotaged twin (every error definite) shows the second payment that would follow.
"""

from __future__ import annotations

from datetime import timedelta

import requests

from celery_agboss.adapters.adyen import KEY_RETENTION, MAX_KEY_LENGTH, AdyenAdapter
from celery_agboss.core.keys import fit_key
from celery_agboss.core.outbound import CallContext, Lookup, NotSent, Outcome, Unknown
from celery_agboss.core.protections import EVERY_ERROR_DEFINITE
from celery_agboss.errors import OutboundCallOutcomeUnknownError
from celery_agboss.testing import sabotage
from celery_agboss.testing.checklist import GatewayCheckStatus
from celery_agboss.testing.clock import VirtualClock
from celery_agboss.testing.dialects.adyen import psp_reference_of
from celery_agboss.testing.gateway_server import FakeGatewayServer
from celery_agboss.testing.gateway_types import FakeGatewayFault, GatewayRequestOutcome
from tests.adapters.adyen_support import a_refund_of_a_charged_order, adapter_for, charge_request
from tests.adapters.conftest import (
    AdapterOn,
    ServeFn,
    checklist_shows,
    refund_from_every_path,
    resend_waits_for_an_operator,
)
from tests.adapters.deliveries import raised_then_retry_asked
from tests.engine.helpers import Shop, business_intent_key, step_intent_key

PASSED, FAILED = GatewayCheckStatus.PASSED, GatewayCheckStatus.FAILED
DOCUMENTED_LEVEL = {"G1": PASSED, "G2": FAILED, "G3": PASSED, "G4": PASSED, "G5": FAILED}
"""What Adyen documents: a key, no lookup, 7 days kept, the first response, no conflict."""
WEEK = KEY_RETENTION.total_seconds()


def test_the_checklist_through_the_sdk_reports_adyen_s_documented_level(
    served: ServeFn, db_clock: VirtualClock
) -> None:
    adapter = adapter_for(served("adyen").url)
    report = checklist_shows(adapter, db_clock, WEEK, DOCUMENTED_LEVEL)
    assert "no payment lookup" in report.result("G2").evidence


def test_ps1_a_lost_answer_is_resent_under_its_key_and_adyen_replays_it(
    served: ServeFn, shop: Shop
) -> None:
    server = served("adyen")
    adapter, gateway = adapter_for(server.url), server.gateway
    request = charge_request("order-1")
    gateway.inject_fault(FakeGatewayFault.ANSWER_THEN_DROP)
    shop.unknown("task-1", adapter.charge, request)
    with shop.start("task-1") as second:
        receipt = second.outbound(adapter.charge, request)
        assert second.last_outcome is Outcome.SENT  # NotSent: the key replayed, not a lookup
    assert [psp_reference_of(p["id"]) for p in gateway.payments] == [receipt["id"]]
    assert [r.outcome for r in gateway.requests] == [
        GatewayRequestOutcome.PROCESSED,
        GatewayRequestOutcome.REPLAYED,
    ]
    key = step_intent_key(shop.settings, "task-1", "adyen.charge")
    assert {r.idempotency_key for r in gateway.requests} == {key}


def _answer_lost_then_key_forgotten(
    server: FakeGatewayServer, shop: Shop, lost: type[BaseException]
) -> AdyenAdapter:
    """A charge whose answer is lost, and the body asks for a retry (``autoretry_for``);
    then a week and an hour pass and Adyen forgets the key."""
    adapter = adapter_for(server.url)
    server.gateway.inject_fault(FakeGatewayFault.ANSWER_THEN_DROP)
    raised_then_retry_asked(shop, "task-17", adapter.charge, charge_request("order-17"), lost)
    shop.clock.advance(WEEK + 3600)
    server.gateway.forget_keys()
    return adapter


def test_ps17_past_the_key_s_window_reconcile_answers_unknown_and_nothing_is_sent(
    served: ServeFn, shop: Shop
) -> None:
    server = served("adyen")
    adapter = _answer_lost_then_key_forgotten(server, shop, OutboundCallOutcomeUnknownError)
    request = charge_request("order-17")
    reason = resend_waits_for_an_operator(shop, adapter.charge, request, "task-17", "adyen.charge")
    assert "Adyen has no payment lookup" in reason
    assert len(server.gateway.payments) == 1
    assert len(server.gateway.requests) == 1, "nothing was resent"


def test_ps17_twin_every_error_definite_charges_twice_once_the_key_is_forgotten(
    served: ServeFn, shop: Shop
) -> None:
    server = served("adyen")
    with sabotage(EVERY_ERROR_DEFINITE):
        # The lost answer is called a definite failure, re-raised as the SDK raised it.
        adapter = _answer_lost_then_key_forgotten(server, shop, requests.ConnectionError)
        with shop.start("task-17") as second:
            receipt = second.outbound(adapter.charge, charge_request("order-17"))
    payments = server.gateway.payments
    assert len(payments) == 2, "the resend of a 'failed' charge was a new payment"
    assert receipt["id"] == psp_reference_of(payments[1]["id"])


def test_ps19_a_refund_whose_answer_was_lost_refunds_once_from_every_path(
    adapter_on: AdapterOn, shop: Shop
) -> None:
    server, adapter = adapter_on("adyen")
    payment, refund, business_key = a_refund_of_a_charged_order(shop, adapter, "order-19")
    receipt, _ = refund_from_every_path(shop, server, adapter.refund, refund, business_key)
    assert receipt["status"] == "received" and receipt["payment_id"] == payment
    assert [psp_reference_of(r["id"]) for r in server.gateway.refunds] == [receipt["id"]]
    refunds = [r for r in server.gateway.requests if r.operation == "refund"]
    assert [r.outcome for r in refunds] == [
        GatewayRequestOutcome.PROCESSED,
        GatewayRequestOutcome.REPLAYED,
    ]
    key = fit_key(business_intent_key(shop.settings, business_key, "adyen.refund"), 64)
    assert {r.idempotency_key for r in refunds} == {key}


def test_every_money_moving_request_carries_the_intent_s_key_digested_past_64(
    served: ServeFn, shop: Shop
) -> None:
    server = served("adyen")
    adapter, gateway = adapter_for(server.url), server.gateway
    execution = "checkout-" + "7" * 60  # the step key is over Adyen's 64 characters
    with shop.start(execution) as ctx:
        authorised = ctx.outbound(adapter.authorize, charge_request("order-7", 900))
        assert authorised["capture"] == "manual"
        payment = authorised["id"]
        ctx.outbound(adapter.capture, {"payment_id": payment, "amount": 900, "currency": "usd"})
        ctx.outbound(adapter.refund, {"payment_id": payment, "amount": 100, "currency": "usd"})
        other = ctx.outbound(adapter.authorize, charge_request("order-8", 300))["id"]
        voided = ctx.outbound(adapter.void, {"payment_id": other})
        assert voided["status"] == "received" and voided["id"] == other
    expected = [
        ("charge", "adyen.authorize", 1),
        ("capture", "adyen.capture", 1),
        ("refund", "adyen.refund", 1),
        ("charge", "adyen.authorize", 2),
        ("void", "adyen.void", 1),
    ]
    seen = [(r.operation, r.idempotency_key) for r in gateway.requests]
    wanted = [
        (op, fit_key(step_intent_key(shop.settings, execution, name, n), MAX_KEY_LENGTH))
        for op, name, n in expected
    ]
    assert seen == wanted
    for _, key in seen:
        assert key is not None and len(key) <= MAX_KEY_LENGTH and ":" not in key  # digests
    made = {psp_reference_of(p["id"]): p for p in gateway.payments}
    assert made[payment]["amount_captured"] == 900
    assert made[other]["status"] == "canceled"


def test_a_short_key_is_sent_as_it_is(adapter_on: AdapterOn, shop: Shop) -> None:
    server, adapter = adapter_on("adyen")
    with shop.start("task-1") as ctx:
        ctx.outbound(adapter.charge, charge_request("order-2"))
    key = step_intent_key(shop.settings, "task-1", "adyen.charge")
    assert len(key) <= MAX_KEY_LENGTH
    assert [r.idempotency_key for r in server.gateway.requests] == [key]


def test_reconcile_replays_only_inside_the_window() -> None:
    adapter = AdyenAdapter("key", "Merchant")  # reconcile asks Adyen nothing: it cannot
    context = CallContext("k", charge_request("o"), 1, "adyen.charge")

    def answer(age: timedelta | None) -> object:
        return adapter.charge.reconcile(context, Lookup("k", context.request, 1, None, age))

    assert answer(timedelta(days=6, hours=23)) == NotSent()
    assert isinstance(answer(KEY_RETENTION), Unknown)
    assert isinstance(answer(None), Unknown)
