"""Stripe's capture, void and refund reconcile read the payment of the STORED request
(design: only the request's payment), never the one this delivery's request names.

The case: execution ``ship-1``'s capture (void, refund) of payment A under one business
key has an unknown outcome. Another execution then sends the same business key with
payment B (two executions for one order, a rolling deploy, a shifted step key): it takes
the pending intent over and reconciles it before its own request is compared
(``IdempotencyKeyConflictError``). That reconcile must ask about A. The twins show the
harm at the fake gateway: A's capture settled with B's (A never captured), A's void
settled with B's (A's hold stays), A's refund, made, recorded as proven not sent.

The engine twins switch off both layers that keep this (``BOTH_LAYERS``); the last
tests call Stripe's reconcile directly and switch off Stripe's reading alone
(``STRIPE_RECONCILE_READS_THIS_REQUEST``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest

from celery_agboss.adapters.stripe import StripeAdapter
from celery_agboss.core.outbound import (
    CallContext,
    Completed,
    Lookup,
    NotSent,
    OutboundCall,
    Outcome,
)
from celery_agboss.core.protections import (
    RECONCILE_READS_THIS_REQUEST,
    STRIPE_RECONCILE_READS_THIS_REQUEST,
)
from celery_agboss.core.store_protocol import IntentRecord, IntentStatus
from celery_agboss.core.transitions import policy_of
from celery_agboss.errors import IdempotencyKeyConflictError
from celery_agboss.testing import sabotage
from celery_agboss.testing.dialects.stripe import stripe_error
from celery_agboss.testing.gateway_server import FakeGatewayServer
from celery_agboss.testing.gateway_types import GatewayRequestOutcome
from tests.adapters.deliveries import lose_at_the_gateway
from tests.adapters.stripe_support import (  # noqa: F401 - the fixtures, used by name
    adapter_for,
    charge_request,
    dialect_of,
    stripe_fake_fixture,
    stripe_server_fixture,
)
from tests.engine.helpers import Shop, business_intent_key

KEY = "ship:order-1"
"""The business key both executions send (a key shared by mistake, or a shifted one)."""
A_AMOUNT, B_AMOUNT = 1000, 2500
BOTH_LAYERS = (STRIPE_RECONCILE_READS_THIS_REQUEST, RECONCILE_READS_THIS_REQUEST)
"""What the engine twins switch off: Stripe's own reading of the stored request, and the
core's (a holder's reconcile handed the stored request when another came under the key).
Either alone keeps this case whole; the tests at the end switch off Stripe's alone."""


@dataclass(frozen=True)
class TwoPayments:
    """Payments A (``ship-1``'s) and B (the other execution's), on one fake gateway."""

    server: FakeGatewayServer
    adapter: StripeAdapter
    a: str
    b: str

    def at_gateway(self, intent_id: str) -> dict[str, Any]:
        """The fake's own payment behind a PaymentIntent id (the fake's ``ch_x`` is ``pi_x``)."""
        return self.server.gateway.retrieve("ch_" + intent_id.removeprefix("pi_"))

    def processed(self, operation: str) -> list[str | None]:
        """The keys of the requests of ``operation`` the gateway processed."""
        return [
            r.idempotency_key
            for r in self.server.gateway.requests
            if r.operation == operation and r.outcome is GatewayRequestOutcome.PROCESSED
        ]


def _payments(stripe_fake: FakeGatewayServer, shop: Shop, *, captured: bool) -> TwoPayments:
    adapter = adapter_for(stripe_fake.url)
    call = adapter.charge if captured else adapter.authorize
    made = []
    for order, amount in (("order-A", A_AMOUNT), ("order-B", B_AMOUNT)):
        with shop.start(f"pay-{order}") as ctx:
            made.append(ctx.outbound(call, charge_request(order, amount))["id"])
    return TwoPayments(stripe_fake, adapter, made[0], made[1])


def _b_held_and_captured(stripe_fake: FakeGatewayServer, shop: Shop) -> TwoPayments:
    """A and B only held; B's capture made by its own execution."""
    p = _payments(stripe_fake, shop, captured=False)
    with shop.start("ship-B") as ctx:
        ctx.outbound(p.adapter.capture, {"payment_id": p.b})
    return p


def _b_held_and_voided(stripe_fake: FakeGatewayServer, shop: Shop) -> TwoPayments:
    """A and B only held; B's hold released (voided) by its own execution."""
    p = _payments(stripe_fake, shop, captured=False)
    with shop.start("cancel-B") as ctx:
        ctx.outbound(p.adapter.void, {"payment_id": p.b})
    return p


def _intent(shop: Shop, call: OutboundCall) -> IntentRecord:
    record = shop.store.read_intent(business_intent_key(shop.settings, KEY, call.name))
    assert record is not None
    return record


def _a_failed_then_b_came(shop: Shop, p: TwoPayments, call: OutboundCall) -> None:
    """``ship-1``'s call on A answered a 500 before Stripe processed it (unknown: A is
    untouched), then ``ship-2`` sends the same business key on B and is refused."""
    dialect_of(p.server).answer_next(stripe_error(500, "api_error", "boom"))
    shop.unknown("ship-1", call, {"payment_id": p.a}, business_key=KEY)
    _b_comes(shop, p, call)


def _a_pending_once_b_came(shop: Shop, p: TwoPayments, call: OutboundCall) -> None:
    """:func:`_a_failed_then_b_came`, after which A's intent is still pending (B refused)."""
    _a_failed_then_b_came(shop, p, call)
    assert _intent(shop, call).status is IntentStatus.PENDING


def _b_comes(shop: Shop, p: TwoPayments, call: OutboundCall) -> None:
    shop.expire_leases()
    with shop.start("ship-2") as second, pytest.raises(IdempotencyKeyConflictError):
        second.outbound(call, {"payment_id": p.b}, business_key=KEY)
    shop.expire_leases()


def _rerun_of_a(shop: Shop, call: OutboundCall, p: TwoPayments) -> tuple[dict[str, Any], Any]:
    with shop.start("ship-1") as rerun:
        result = rerun.outbound(call, {"payment_id": p.a}, business_key=KEY)
        return result, rerun.last_outcome


# --- capture ---------------------------------------------------------------------------------


def test_a_capture_of_a_is_never_settled_with_b_s_capture(
    stripe_fake: FakeGatewayServer, shop: Shop
) -> None:
    p = _b_held_and_captured(stripe_fake, shop)
    _a_pending_once_b_came(shop, p, p.adapter.capture)
    assert p.at_gateway(p.a)["status"] == "requires_capture"
    captured, outcome = _rerun_of_a(shop, p.adapter.capture, p)
    assert outcome is Outcome.SENT, "reconcile read A, uncaptured: sent again under the key"
    assert (captured["id"], captured["amount_received"]) == (p.a, A_AMOUNT)
    assert p.at_gateway(p.a)["amount_captured"] == A_AMOUNT, "A's money is collected"
    assert len(p.processed("capture")) == 2, "B's capture and A's, once each"


def test_twin_reading_this_request_settles_a_s_capture_with_b_s_and_a_is_never_captured(
    stripe_fake: FakeGatewayServer, shop: Shop
) -> None:
    p = _b_held_and_captured(stripe_fake, shop)
    with sabotage(*BOTH_LAYERS):
        _a_failed_then_b_came(shop, p, p.adapter.capture)
        assert _intent(shop, p.adapter.capture).status is IntentStatus.COMPLETED
        taken, outcome = _rerun_of_a(shop, p.adapter.capture, p)
    assert outcome is Outcome.REPLAYED
    assert taken["id"] == p.b, "A's body handed B's capture"
    assert p.at_gateway(p.a)["status"] == "requires_capture", "A's money never collected"
    assert len(p.processed("capture")) == 1, "only B's capture was ever made"


# --- void ------------------------------------------------------------------------------------


def test_a_void_of_a_is_never_settled_with_b_s_void(
    stripe_fake: FakeGatewayServer, shop: Shop
) -> None:
    p = _b_held_and_voided(stripe_fake, shop)
    _a_pending_once_b_came(shop, p, p.adapter.void)
    voided, outcome = _rerun_of_a(shop, p.adapter.void, p)
    assert outcome is Outcome.SENT
    assert (voided["id"], voided["status"]) == (p.a, "canceled")
    assert p.at_gateway(p.a)["status"] == "canceled", "A's hold is released"
    assert len(p.processed("void")) == 2


def test_twin_reading_this_request_settles_a_s_void_with_b_s_and_a_stays_held(
    stripe_fake: FakeGatewayServer, shop: Shop
) -> None:
    p = _b_held_and_voided(stripe_fake, shop)
    with sabotage(*BOTH_LAYERS):
        _a_failed_then_b_came(shop, p, p.adapter.void)
        taken, outcome = _rerun_of_a(shop, p.adapter.void, p)
    assert outcome is Outcome.REPLAYED and taken["id"] == p.b
    assert p.at_gateway(p.a)["status"] == "requires_capture", "A's hold stays on the card"
    assert len(p.processed("void")) == 1


# --- refund ----------------------------------------------------------------------------------


def _a_refunded_answer_lost_then_b_came(shop: Shop, p: TwoPayments) -> None:
    """``ship-1``'s refund of all of A is made, its answer lost; then ``ship-2``."""
    request = {"payment_id": p.a, "amount": None}
    lose_at_the_gateway(shop, p.server, "ship-1", p.adapter.refund, request, KEY)
    assert [r["amount"] for r in p.server.gateway.refunds] == [A_AMOUNT]
    _b_comes(shop, p, p.adapter.refund)


def test_a_made_refund_of_a_is_found_whatever_b_s_request_names(
    stripe_fake: FakeGatewayServer, shop: Shop
) -> None:
    p = _payments(stripe_fake, shop, captured=True)
    _a_refunded_answer_lost_then_b_came(shop, p)
    intent = _intent(shop, p.adapter.refund)
    assert intent.status is IntentStatus.COMPLETED and not intent.not_sent_confirmed
    with shop.start("ship-1") as rerun:
        refund = rerun.outbound(
            p.adapter.refund, {"payment_id": p.a, "amount": None}, business_key=KEY
        )
        assert rerun.last_outcome is Outcome.REPLAYED
    refunds = p.server.gateway.refunds
    assert [(r["id"], r["amount"]) for r in refunds] == [(refund["id"], A_AMOUNT)]
    assert refund["payment_intent"] == p.a
    assert p.at_gateway(p.b)["amount_refunded"] == 0


def test_twin_reading_this_request_records_a_made_refund_as_proven_not_sent(
    stripe_fake: FakeGatewayServer, shop: Shop
) -> None:
    p = _payments(stripe_fake, shop, captured=True)
    with sabotage(*BOTH_LAYERS):
        _a_refunded_answer_lost_then_b_came(shop, p)
    intent = _intent(shop, p.adapter.refund)
    assert intent.status is IntentStatus.PENDING and intent.not_sent_confirmed
    assert p.at_gateway(p.a)["amount_refunded"] == A_AMOUNT, "yet the gateway refunded A"


# --- Stripe's reconcile alone: the stored request's payment, whatever the context carries ------


def _reconcile_with_b_in_context(call: OutboundCall, stored: dict[str, Any], b: str) -> Any:
    """``call``'s reconcile under ``KEY``, the stored request (masked, as kept) on A and
    the context carrying B's: what a holder that took the intent over could hand it."""
    key = f"default:b:{KEY}:{call.name}"
    masked = policy_of(call).mask_request(stored)
    lookup = Lookup(key, masked, 1, None, timedelta(minutes=1))
    return call.reconcile(CallContext(key, {**stored, "payment_id": b}, 1, call.name), lookup)


@pytest.mark.parametrize("kind", ["capture", "void"])
def test_stripe_s_reconcile_reads_a_s_payment_not_b_s_done_one(
    stripe_fake: FakeGatewayServer, shop: Shop, kind: str
) -> None:
    """A untouched under the key, B captured (voided) under another: A's is not sent."""
    p = _payments(stripe_fake, shop, captured=False)
    call: OutboundCall = getattr(p.adapter, kind)
    call.send(CallContext("default:t:other:x", {"payment_id": p.b}, 1, call.name))
    answer = _reconcile_with_b_in_context(call, {"payment_id": p.a}, p.b)
    assert answer == NotSent(), answer
    with sabotage(STRIPE_RECONCILE_READS_THIS_REQUEST):
        taken = _reconcile_with_b_in_context(call, {"payment_id": p.a}, p.b)
    assert isinstance(taken, Completed) and taken.result["id"] == p.b, "twin: B's taken for A"


def test_stripe_s_reconcile_finds_a_s_refund_of_all_not_b_s_none(
    stripe_fake: FakeGatewayServer, shop: Shop
) -> None:
    """A refunded in full under the key (compared with what A received, not B's 2500)."""
    p = _payments(stripe_fake, shop, captured=True)
    stored: dict[str, Any] = {"payment_id": p.a, "amount": None}
    key = f"default:b:{KEY}:{p.adapter.refund.name}"
    made = p.adapter.refund.send(CallContext(key, stored, 1, p.adapter.refund.name))
    answer = _reconcile_with_b_in_context(p.adapter.refund, stored, p.b)
    assert isinstance(answer, Completed) and answer.result["id"] == made["id"], answer
    with sabotage(STRIPE_RECONCILE_READS_THIS_REQUEST):
        taken = _reconcile_with_b_in_context(p.adapter.refund, stored, p.b)
    assert taken == NotSent(), "twin: A's refund, made, answered as not sent"
