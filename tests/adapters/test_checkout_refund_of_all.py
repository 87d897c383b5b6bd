"""Checkout.com: a refund of "all that is captured" before the rest was captured.

A refund that names no amount takes what was captured less what was refunded, when it
is made. An authorisation captured in parts (``capture_type: "NonFinal"``) stays open
after such a refund, and Checkout.com lets the rest be captured later. Reconcile of the
refund compares the refund found under our key with what it took when made: the
payment's ``total_captured`` now counts the later captures too, so they are taken off
(design: only the request's payment). It used to compare with today's total: our refund
of 300, made, read as someone else's refund of 1000, ``Unknown``; an operator answering
``--not-sent`` past the key's retention had a refund of "all" resent, refunding 1000 more
instead of the 300 it was. A capture at the same instant as ours, or with no readable
time, leaves the order untold: ``Unknown``. The twin
(``CHECKOUT_REFUND_ALL_IGNORES_LATER_CAPTURES``) shows the wait.
"""

from __future__ import annotations

from typing import Any

import pytest

from celery_agboss.adapters.checkout import CheckoutAdapter
from celery_agboss.core.outbound import Unknown
from celery_agboss.core.protections import CHECKOUT_REFUND_ALL_IGNORES_LATER_CAPTURES
from celery_agboss.errors import OutboundCallUnreconciledError
from celery_agboss.testing import sabotage
from celery_agboss.testing.dialects import checkout_wire
from celery_agboss.testing.gateway_server import FakeGatewayServer
from celery_agboss.testing.gateway_types import GatewayRequestOutcome
from tests.adapters.checkout_support import adapter_for, charge_request
from tests.adapters.conftest import ServeFn
from tests.adapters.own_payment_support import key_for, reconcile
from tests.engine.helpers import Shop

PROCESSED = GatewayRequestOutcome.PROCESSED
REFUND_ALL = "refund:r:all"
REFUNDED_AT = 1796637600.0  # 2026-12-07T10:00:00Z: our refund, on the gateway's pinned clock


class _Pinned:
    """The gateway's clock, set by the test: which action came first is chosen."""

    def __init__(self, at: float) -> None:
        self.at = at

    def now(self) -> float:
        return self.at


def _refunded_then_rest_captured(
    served: ServeFn, shop: Shop, monkeypatch: pytest.MonkeyPatch, gap: float = 1
) -> tuple[FakeGatewayServer, CheckoutAdapter, dict[str, Any]]:
    """1000 authorised, 300 captured NonFinal a second before our refund of all of it
    (300), its answer lost; ``gap`` seconds after it another task captures the rest (700).
    Returns our refund's request."""
    server = served("checkout")
    adapter, gw = adapter_for(server.url), server.gateway
    pinned = _Pinned(REFUNDED_AT - 1)
    monkeypatch.setattr(gw, "now", pinned.now)
    with shop.start("order-r") as ctx:
        held = ctx.outbound(adapter.authorize, charge_request("order-r"), business_key="auth:r")
        part = {"payment_id": held["id"], "amount": 300, "capture_type": "NonFinal"}
        ctx.outbound(adapter.capture, part, business_key="capture:r:1")
    shop.clock.advance(1)
    pinned.at = REFUNDED_AT
    refund = {"payment_id": str(held["id"])}
    shop.lose_the_answer(
        "refund-r", adapter.refund, refund, gateway=gw, operation="refund", business_key=REFUND_ALL
    )
    shop.clock.advance(1)
    pinned.at = REFUNDED_AT + gap
    with shop.start("capture-r") as ctx:
        rest = ctx.outbound(adapter.capture, {"payment_id": held["id"]}, business_key="capture:r:2")
    assert rest["amount"] == 700, "the fake captures the rest after a refund, as Checkout.com"
    shop.clock.advance(1)
    return server, adapter, refund


def _refunds(server: FakeGatewayServer) -> list[int]:
    return [int(r["amount"]) for r in server.gateway.refunds]


def _refunds_sent(server: FakeGatewayServer) -> list[GatewayRequestOutcome]:
    return [r.outcome for r in server.gateway.requests if r.operation == "refund"]


def test_a_lost_refund_of_all_is_what_was_captured_before_it(
    served: ServeFn, shop: Shop, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, adapter, refund = _refunded_then_rest_captured(served, shop, monkeypatch)
    done = shop.reconciled("refund-r", adapter.refund, refund, business_key=REFUND_ALL)
    assert (done["type"], done["amount"]) == ("Refund", 300), done
    assert _refunds(server) == [300] and _refunds_sent(server) == [PROCESSED], "refunded once"
    assert [int(c["amount"]) for c in server.gateway.captures] == [300, 700]


def test_twin_against_todays_captured_total_a_made_refund_waits_for_an_operator(
    served: ServeFn, shop: Shop, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, adapter, refund = _refunded_then_rest_captured(served, shop, monkeypatch)
    answer = reconcile(adapter.refund, key_for(shop, adapter.refund, REFUND_ALL), refund)
    assert not isinstance(answer, Unknown), answer
    with (
        sabotage(CHECKOUT_REFUND_ALL_IGNORES_LATER_CAPTURES),
        shop.start("refund-r") as retry,
        pytest.raises(OutboundCallUnreconciledError),
    ):
        retry.outbound(adapter.refund, refund, business_key=REFUND_ALL)
    assert _refunds(server) == [300], "the refund had been made all the same"


def test_a_capture_at_the_same_instant_leaves_the_amount_unchecked(
    served: ServeFn, shop: Shop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whether the capture came before our refund cannot be told: ``Unknown``."""
    server, adapter, refund = _refunded_then_rest_captured(served, shop, monkeypatch, gap=0)
    answer = reconcile(adapter.refund, key_for(shop, adapter.refund, REFUND_ALL), refund)
    assert isinstance(answer, Unknown) and "same time" in answer.reason, answer
    assert _refunds(server) == [300]


def test_a_capture_whose_time_cannot_be_read_leaves_the_amount_unchecked(
    served: ServeFn, shop: Shop, monkeypatch: pytest.MonkeyPatch
) -> None:
    written, unreadable = checkout_wire.iso_time, REFUNDED_AT + 1

    def iso_time(epoch: float) -> str:
        return "Mon, 07 Dec 2026 10:00:00 GMT" if epoch == unreadable else written(epoch)

    monkeypatch.setattr(checkout_wire, "iso_time", iso_time)
    _, adapter, refund = _refunded_then_rest_captured(served, shop, monkeypatch)
    listed = [a["processed_on"] for a in adapter._actions(refund["payment_id"])]
    assert "Mon, 07 Dec 2026 10:00:00 GMT" in listed, listed
    answer = reconcile(adapter.refund, key_for(shop, adapter.refund, REFUND_ALL), refund)
    assert isinstance(answer, Unknown) and "could not be checked" in answer.reason, answer
