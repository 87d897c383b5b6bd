"""The Stripe adapter through the official ``stripe`` SDK against the fake's Stripe dialect.

What it proves: the checklist sees what Stripe documents (G1–G5); an answer lost after
a charge, a capture, a void or a refund leaves one payment (one refund) at the gateway,
found by reconcile or replayed under the key; a search that lags is never taken for
"not sent" past the key's retention; every money-moving request carries the intent's
key (digested when over Stripe's 255). The sabotage twin shows the second payment.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from celery_agboss.adapters.stripe import KEY_METADATA, StripeAdapter
from celery_agboss.core.engine_settings import EngineSettings
from celery_agboss.core.keys import fit_key
from celery_agboss.core.outbound import CallContext, Lookup, NotSent, Outcome, Unknown
from celery_agboss.core.protections import EVERY_ERROR_DEFINITE
from celery_agboss.errors import OutboundCallUnreconciledError
from celery_agboss.testing import sabotage
from celery_agboss.testing.checklist import GatewayCheckStatus
from celery_agboss.testing.clock import VirtualClock
from celery_agboss.testing.gateway import FakeGatewayFault, GatewayRequestOutcome
from celery_agboss.testing.gateway_server import FakeGatewayServer
from tests.adapters.conftest import ServeFn, checklist, checklist_shows, refund_from_every_path
from tests.adapters.deliveries import raised_then_retry_asked
from tests.adapters.stripe_support import (  # noqa: F401 - the fixtures, used by name
    adapter_for,
    charge_request,
    dialect_of,
    stripe_fake_fixture,
    stripe_server_fixture,
)
from tests.engine.helpers import Shop, business_intent_key, step_intent_key

PASSED, FAILED = GatewayCheckStatus.PASSED, GatewayCheckStatus.FAILED
DOCUMENTED_LEVEL = {"G1": PASSED, "G2": PASSED, "G3": PASSED, "G4": PASSED, "G5": PASSED}
RETENTION = 86400  # "Stripe retains keys for at least 24 hours"
PAST_RETENTION = RETENTION + 3600
DROP = FakeGatewayFault.ANSWER_THEN_DROP


def _stripe(
    server: FakeGatewayServer, search_lag: float = 0.0
) -> tuple[FakeGatewayServer, StripeAdapter]:
    dialect_of(server).search_lag = search_lag
    return server, adapter_for(server.url)


def _outcomes(server: FakeGatewayServer, operation: str) -> list[GatewayRequestOutcome]:
    return [r.outcome for r in server.gateway.requests if r.operation == operation]


def _lose_the_first_charge(shop: Shop, server: FakeGatewayServer, adapter: StripeAdapter) -> None:
    shop.lose_the_answer(
        "task-1", adapter.charge, charge_request("order-1"), gateway=server.gateway
    )


# --- the checklist ------------------------------------------------------------------------


def test_the_checklist_through_the_sdk_shows_the_level_stripe_documents(
    served: ServeFn, db_clock: VirtualClock
) -> None:
    checklist_shows(adapter_for(served("stripe").url), db_clock, RETENTION, DOCUMENTED_LEVEL)


def test_a_lagging_search_cannot_find_a_payment_just_made(
    stripe_fake: FakeGatewayServer, db_clock: VirtualClock
) -> None:
    _, adapter = _stripe(stripe_fake, search_lag=60)
    report = checklist(adapter, db_clock, RETENTION)
    assert report.result("G2").status is FAILED
    assert "found nothing" in report.result("G2").evidence


# --- the answer lost after the charge (design: PS1) ---------------------------------------


def test_ps1_a_charge_whose_answer_was_lost_is_found_by_search_on_the_retry(
    stripe_fake: FakeGatewayServer, shop: Shop
) -> None:
    server, adapter = _stripe(stripe_fake)
    _lose_the_first_charge(shop, server, adapter)
    receipt = shop.reconciled("task-1", adapter.charge, charge_request("order-1"))
    assert [p["id"] for p in server.gateway.payments] == [receipt["latest_charge"]]
    assert _outcomes(server, "charge") == [GatewayRequestOutcome.PROCESSED]


def test_ps1_with_a_lagging_search_the_resend_replays_the_key(
    stripe_fake: FakeGatewayServer, shop: Shop
) -> None:
    server, adapter = _stripe(stripe_fake, search_lag=600)
    _lose_the_first_charge(shop, server, adapter)
    with shop.start("task-1") as retry:
        receipt = retry.outbound(adapter.charge, charge_request("order-1"))
        assert retry.last_outcome is Outcome.SENT  # NotSent: resent under the same key
    assert [p["id"] for p in server.gateway.payments] == [receipt["latest_charge"]]
    assert _outcomes(server, "charge") == [
        GatewayRequestOutcome.PROCESSED,
        GatewayRequestOutcome.REPLAYED,
    ]


# --- the key expired before the retry (design: PS17) ---------------------------------------


def _past_retention(server: FakeGatewayServer, clock: VirtualClock) -> None:
    clock.advance(PAST_RETENTION)
    server.gateway.forget_keys()


def test_ps17_past_the_key_s_retention_search_still_finds_the_payment(
    stripe_fake: FakeGatewayServer, shop: Shop, db_clock: VirtualClock
) -> None:
    server, adapter = _stripe(stripe_fake)
    _lose_the_first_charge(shop, server, adapter)
    _past_retention(server, db_clock)
    shop.reconciled("task-1", adapter.charge, charge_request("order-1"))
    assert len(server.gateway.payments) == 1
    assert _outcomes(server, "charge") == [GatewayRequestOutcome.PROCESSED]


def test_ps17_an_empty_search_past_retention_waits_for_an_operator(
    stripe_fake: FakeGatewayServer, shop: Shop, settings: EngineSettings, db_clock: VirtualClock
) -> None:
    server, adapter = _stripe(stripe_fake, search_lag=3 * RETENTION)  # search still behind
    _lose_the_first_charge(shop, server, adapter)
    _past_retention(server, db_clock)
    with shop.start("task-1") as retry, pytest.raises(OutboundCallUnreconciledError):
        retry.outbound(adapter.charge, charge_request("order-1"))
    intent = shop.store.read_intent(
        fit_key(step_intent_key(settings, "task-1", "stripe.charge"), 255)
    )
    assert intent is not None and intent.needs_operator
    assert len(server.gateway.payments) == 1
    assert _outcomes(server, "charge") == [GatewayRequestOutcome.PROCESSED]


def test_ps17_twin_every_error_definite_resends_past_retention_and_pays_twice(
    stripe_fake: FakeGatewayServer, shop: Shop, db_clock: VirtualClock
) -> None:
    server, adapter = _stripe(stripe_fake)
    server.gateway.inject_fault(DROP)
    with sabotage(EVERY_ERROR_DEFINITE):
        request = charge_request("order-1")
        # the body's autoretry_for=(Exception,):
        raised_then_retry_asked(shop, "task-1", adapter.charge, request, Exception)
        _past_retention(server, db_clock)
        with shop.start("task-1") as retry:
            retry.outbound(adapter.charge, charge_request("order-1"))
    assert len(server.gateway.payments) == 2


# --- captures, voids and refunds whose answers were lost ------------------------------------


def _authorised(shop: Shop, adapter: StripeAdapter, order: str) -> dict[str, Any]:
    with shop.start(f"authorize-{order}") as ctx:
        result: dict[str, Any] = ctx.outbound(adapter.authorize, charge_request(order))
    assert result["status"] == "requires_capture"
    return result


@pytest.mark.parametrize(
    ("kind", "operation", "status"),
    [("capture", "capture", "succeeded"), ("void", "void", "canceled")],
)
def test_a_capture_or_void_whose_answer_was_lost_is_read_back_by_id(
    stripe_fake: FakeGatewayServer, shop: Shop, kind: str, operation: str, status: str
) -> None:
    server, adapter = _stripe(stripe_fake)
    authorised = _authorised(shop, adapter, "order-20")
    call = getattr(adapter, kind)
    shop.lose_the_answer(
        "ship-1",
        call,
        {"payment_id": authorised["id"]},
        operation=operation,
        gateway=server.gateway,
    )
    result = shop.reconciled("ship-1", call, {"payment_id": authorised["id"]})
    assert result["id"] == authorised["id"] and result["status"] == status
    assert _outcomes(server, operation) == [GatewayRequestOutcome.PROCESSED]


def test_ps19_a_refund_retried_from_every_path_refunds_once(
    stripe_fake: FakeGatewayServer, shop: Shop
) -> None:
    server, adapter = _stripe(stripe_fake)
    with shop.start("order-19") as ctx:
        payment = ctx.outbound(adapter.charge, charge_request("order-19"), business_key="o:19")
    request = {"payment_id": payment["id"], "amount": 300}
    business_key = f"refund:{payment['id']}:1"
    refund, outcome = refund_from_every_path(shop, server, adapter.refund, request, business_key)
    assert outcome is Outcome.RECONCILED
    assert [r["id"] for r in server.gateway.refunds] == [refund["id"]]
    assert refund["amount"] == 300 and refund["payment_intent"] == payment["id"]


# --- the key on every request -----------------------------------------------------------------


def test_every_money_moving_request_carries_the_intent_s_key_digested_past_255(
    stripe_fake: FakeGatewayServer, shop: Shop, settings: EngineSettings
) -> None:
    server, adapter = _stripe(stripe_fake)
    order = "order-" + "x" * 300  # the key grammar makes this well over 255 characters
    with shop.start("long-1") as ctx:
        authorised = ctx.outbound(adapter.authorize, charge_request(order), business_key=order)
        ctx.outbound(adapter.capture, {"payment_id": authorised["id"], "amount": None})
        ctx.outbound(adapter.refund, {"payment_id": authorised["id"], "amount": 100})
        ctx.outbound(adapter.charge, charge_request("order-2"))
        other = ctx.outbound(adapter.authorize, charge_request("order-3"), business_key="o-3")
        ctx.outbound(adapter.void, {"payment_id": other["id"]})
    expected = [
        fit_key(business_intent_key(settings, order, "stripe.authorize"), 255),
        step_intent_key(settings, "long-1", "stripe.capture"),
        step_intent_key(settings, "long-1", "stripe.refund"),
        step_intent_key(settings, "long-1", "stripe.charge"),
        business_intent_key(settings, "o-3", "stripe.authorize"),
        step_intent_key(settings, "long-1", "stripe.void"),
    ]
    assert len(expected[0]) == 43  # the SHA-256 digest, never a cut key
    assert [r.idempotency_key for r in server.gateway.requests] == expected
    assert server.gateway.payments[0]["metadata"]["metadata"][KEY_METADATA] == expected[0]
    found = adapter.lookup(expected[0])
    assert found is not None and found["id"] == authorised["id"]


# --- reconcile's answers when nothing is found --------------------------------------------


@pytest.mark.parametrize(
    ("key_age", "answer"),
    [
        (None, Unknown),
        (timedelta(hours=25), Unknown),
        (timedelta(hours=24), Unknown),
        (timedelta(hours=1), NotSent),
    ],
)
@pytest.mark.parametrize("kind", ["charge", "refund"])
def test_nothing_found_is_not_sent_only_inside_stripe_s_retention(
    stripe_fake: FakeGatewayServer, kind: str, key_age: timedelta | None, answer: type
) -> None:
    _, adapter = _stripe(stripe_fake)
    call = getattr(adapter, kind)
    request = charge_request("o-1") if kind == "charge" else {"payment_id": "pi_0", "amount": 1}
    ctx = CallContext("default:t:t-1:stripe.x", request, 1, call.name)
    found = call.reconcile(ctx, Lookup(ctx.idempotency_key, request, 1, None, key_age))
    assert isinstance(found, answer), found
