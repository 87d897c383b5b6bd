"""Checkout.com's ``processed_on`` times are read as times, never compared as text.

Reconcile of a refund (or capture) of "all that is left" finds the action under our key
and compares its amount with what was left when it was made: the total less the actions
made before it, ordered by ``processed_on`` (design: only the request's payment).
Checkout.com writes those times in more than one precision (``…:00Z``, ``…:00.5Z``,
seven digits), and an ISO 8601 time may end ``+00:00`` as well as ``Z``: as text,
``…:00Z`` sorts after ``…:00.5Z``. Ordered as strings, a refund made half a second
after another was taken for the earlier one, "all that was left" came out as the whole,
and the lost answer of a refund (or capture) that was made was ``Unknown``: an operator
asked about money that had moved, and a ``--not-sent`` answer past the key's 24 h would
refund it twice. The gateway's clock is pinned here so the fake writes exactly those
forms; the twin (``CHECKOUT_TIMES_COMPARED_AS_TEXT``) orders them as text again.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from celery_agboss.adapters.checkout import CheckoutAdapter
from celery_agboss.adapters.checkout_requests import processed_at
from celery_agboss.core.outbound import CallContext, Unknown
from celery_agboss.core.protections import CHECKOUT_TIMES_COMPARED_AS_TEXT
from celery_agboss.errors import OutboundCallUnreconciledError
from celery_agboss.testing import sabotage
from celery_agboss.testing.dialects import checkout_wire
from celery_agboss.testing.gateway_server import FakeGatewayServer
from celery_agboss.testing.gateway_types import GatewayRequestOutcome
from tests.adapters.checkout_support import adapter_for, charge_request
from tests.adapters.conftest import ServeFn
from tests.adapters.own_payment_support import key_for, reconcile
from tests.engine.helpers import Shop

WHOLE_SECOND = 1796637600.0  # 2026-12-07T10:00:00Z
PROCESSED = GatewayRequestOutcome.PROCESSED


class _Pinned:
    """The gateway's clock, set by the test: the times the fake writes are chosen."""

    def __init__(self, at: float) -> None:
        self.at = at

    def now(self) -> float:
        return self.at


def _served(
    served: ServeFn, monkeypatch: pytest.MonkeyPatch
) -> tuple[FakeGatewayServer, CheckoutAdapter, _Pinned]:
    server = served("checkout")
    pinned = _Pinned(WHOLE_SECOND - 60)
    monkeypatch.setattr(server.gateway, "now", pinned.now)
    return server, adapter_for(server.url), pinned


def _theirs_then_all_of_the_rest(
    served: ServeFn, shop: Shop, monkeypatch: pytest.MonkeyPatch, kind: str, gap: float
) -> tuple[FakeGatewayServer, CheckoutAdapter, dict[str, Any]]:
    """1000 paid (authorised for a capture); 300 of it refunded (captured NonFinal) at
    10:00:00 exactly, then, ``gap`` seconds later, our ``kind`` of the rest, its answer
    lost. Returns our request."""
    server, adapter, pinned = _served(served, monkeypatch)
    pay = adapter.charge if kind == "refund" else adapter.authorize
    paid = pay.send(CallContext("pay-t", charge_request("order-t"), 1, pay.name))
    call = getattr(adapter, kind)
    part = {"payment_id": paid["id"], "amount": 300}
    if kind == "capture":
        part["capture_type"] = "NonFinal"
    pinned.at = WHOLE_SECOND
    call.send(CallContext(f"theirs-{kind}", part, 1, call.name))
    pinned.at = WHOLE_SECOND + gap
    rest = {"payment_id": paid["id"]}
    gw = server.gateway
    shop.lose_the_answer("rest-t", call, rest, gateway=gw, operation=kind, business_key="rest")
    return server, adapter, rest


def _moved(server: FakeGatewayServer, kind: str) -> list[int]:
    made = server.gateway.refunds if kind == "refund" else server.gateway.captures
    return [int(m["amount"]) for m in made]


@pytest.mark.parametrize("kind", ["refund", "capture"])
def test_a_lost_action_on_the_rest_half_a_second_later_is_reconciled(
    served: ServeFn, shop: Shop, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    server, adapter, rest = _theirs_then_all_of_the_rest(served, shop, monkeypatch, kind, 0.5)
    listed = [a["processed_on"] for a in adapter._actions(rest["payment_id"])]
    assert listed[:2] == ["2026-12-07T10:00:00.5Z", "2026-12-07T10:00:00Z"], listed
    call = getattr(adapter, kind)
    done = shop.reconciled("rest-t", call, rest, business_key="rest")
    assert done["amount"] == 700 and _moved(server, kind) == [300, 700]
    sent = [r.outcome for r in server.gateway.requests if r.operation == kind]
    assert sent == [PROCESSED, PROCESSED], "our action went once"


@pytest.mark.parametrize("kind", ["refund", "capture"])
def test_twin_ordered_as_text_a_made_action_waits_for_an_operator(
    served: ServeFn, shop: Shop, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    server, adapter, rest = _theirs_then_all_of_the_rest(served, shop, monkeypatch, kind, 0.5)
    call = getattr(adapter, kind)
    with (
        sabotage(CHECKOUT_TIMES_COMPARED_AS_TEXT),
        shop.start("rest-t") as retry,
        pytest.raises(OutboundCallUnreconciledError),
    ):
        retry.outbound(call, rest, business_key="rest")
    assert _moved(server, kind) == [300, 700], "the rest had moved all the same"


def test_two_refunds_at_the_same_instant_leave_the_amount_unchecked(
    served: ServeFn, shop: Shop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Which came first cannot be told: ``Unknown``, never a guess."""
    server, adapter, rest = _theirs_then_all_of_the_rest(served, shop, monkeypatch, "refund", 0)
    key = key_for(shop, adapter.refund, "rest")
    answer = reconcile(adapter.refund, key, rest)
    assert isinstance(answer, Unknown) and "same time" in answer.reason, answer
    assert _moved(server, "refund") == [300, 700]


def test_a_time_that_cannot_be_read_leaves_the_amount_unchecked(
    served: ServeFn, shop: Shop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Our refund listed with a time that is no ISO 8601 time: as text it sorted after
    the other and the rest was taken as checked; read as a time, it is ``Unknown``."""
    written = checkout_wire.iso_time
    unreadable = WHOLE_SECOND + 0.5

    def iso_time(epoch: float) -> str:
        return "Mon, 07 Dec 2026 10:00:00 GMT" if epoch == unreadable else written(epoch)

    monkeypatch.setattr(checkout_wire, "iso_time", iso_time)
    _, adapter, rest = _theirs_then_all_of_the_rest(served, shop, monkeypatch, "refund", 0.5)
    answer = reconcile(adapter.refund, key_for(shop, adapter.refund, "rest"), rest)
    assert isinstance(answer, Unknown) and "could not be checked" in answer.reason, answer


UTC = timezone.utc


@pytest.mark.parametrize(
    ("written", "meant"),
    [
        ("2026-12-07T10:00:00Z", datetime(2026, 12, 7, 10, tzinfo=UTC)),
        ("2026-12-07T10:00:00+00:00", datetime(2026, 12, 7, 10, tzinfo=UTC)),
        ("2026-12-07T10:00:00.5Z", datetime(2026, 12, 7, 10, 0, 0, 500000, tzinfo=UTC)),
        ("2026-12-07T10:00:00.2371663Z", datetime(2026, 12, 7, 10, 0, 0, 237166, tzinfo=UTC)),
        ("2026-12-07T12:00:00.5+02:00", datetime(2026, 12, 7, 10, 0, 0, 500000, tzinfo=UTC)),
        ("2026-12-07t10:00:00z", datetime(2026, 12, 7, 10, tzinfo=UTC)),
    ],
)
def test_processed_on_is_read_as_an_aware_time(written: str, meant: datetime) -> None:
    assert processed_at(written) == meant


@pytest.mark.parametrize(
    "written",
    [
        None,
        "",
        "2026-12-07T10:00:00",
        "2026-12-07 10:00",
        "07/12/2026",
        "2026-13-07T10:00:00Z",
        "2026-12-07T10:00:00.Z",
        "2026-12-07T10:00:00+25:00",
        1796637600,
        "tomorrow",
    ],
)
def test_a_time_without_an_offset_or_not_iso_is_not_read(written: Any) -> None:
    """No offset says which instant it is; nothing else is guessed either."""
    assert processed_at(written) is None


def test_the_same_instant_in_both_forms_is_one_time() -> None:
    zulu, offset = processed_at("2026-12-07T10:00:00Z"), processed_at("2026-12-07T10:00:00+00:00")
    later = processed_at("2026-12-07T10:00:00.5Z")
    assert zulu == offset and zulu is not None and later is not None and zulu < later
    assert later - zulu == timedelta(milliseconds=500)
