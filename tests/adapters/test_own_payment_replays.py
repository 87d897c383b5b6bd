"""Per adapter (design: only the request's payment), the cases test_own_payment_actions.py
left open: a capture or refund of "all of it" found under our key, and an action's answer
replayed for our key from another request (another amount, another payment, another kind).

Reconcile compares a capture or refund that names no amount with what all of it was when
it was made (Stripe, Checkout.com); a send compares the replayed answer's amount (when
the request names one), the payment it names and its kind (Checkout.com, Adyen, PayPal).
Each twin switches the comparison off (``adapter-adopts-any-payment``) and shows the harm:
the other request's action taken for ours, our own never made.
"""

from __future__ import annotations

from typing import Any

import pytest

from celery_agboss.adapters.common import AnotherRequestsAnswerError
from celery_agboss.core.outbound import Completed, Unknown
from celery_agboss.core.protections import ADOPTS_ANY_PAYMENT
from celery_agboss.testing import sabotage
from celery_agboss.testing.dialects.adyen import psp_reference_of
from celery_agboss.testing.gateway_server import FakeGatewayServer
from tests.adapters.conftest import ServeFn
from tests.adapters.own_payment_support import (
    OURS,
    THEIR_AMOUNT,
    THEIRS,
    TheirAction,
    action_id,
    action_request,
    assert_names_their_amount,
    each,
    key_for,
    make_payment,
    reconcile,
    send,
    served_adapter,
)
from tests.engine.helpers import Shop

# --- "all of it": reconcile compares with the whole ------------------------------------------

WHOLE = each("stripe capture", "stripe refund", "checkout capture", "checkout refund")


@WHOLE
def test_a_partial_action_under_our_key_is_not_taken_for_our_all_of_it(
    theirs: TheirAction,
) -> None:
    """Their 1000 of the 2500 payment, under our key: our "capture all" / "refund all"
    would have taken 2500, so reconcile names the amount and leaves it to an operator."""
    answer = reconcile(theirs.call, theirs.key, theirs.ours(None))
    assert_names_their_amount(answer)
    assert theirs.nothing_more_moved()


@WHOLE
def test_twin_without_the_comparison_their_part_is_taken_for_our_all_of_it(
    theirs: TheirAction,
) -> None:
    with sabotage(ADOPTS_ANY_PAYMENT):
        answer = reconcile(theirs.call, theirs.key, theirs.ours(None))
    assert isinstance(answer, Completed), answer
    theirs.assert_taken_for_ours(answer.result)  # "all of it" done with their part


@pytest.mark.parametrize("gateway", ["stripe", "checkout"])
def test_our_own_refund_of_all_that_was_left_is_taken(
    gateway: str, served: ServeFn, shop: Shop
) -> None:
    """The comparison does not refuse our own: 1000 refunded first under another key, then
    our "refund all" of the 1500 left; reconcile takes it (or, when Stripe's seconds cannot
    order the two, says the amount could not be checked, never takes another's)."""
    _, adapter = served_adapter(served, gateway)
    payment_id = make_payment(gateway, adapter, captured=True)
    send(adapter.refund, "someone-else", action_request(gateway, payment_id, THEIRS))
    key, request = key_for(shop, adapter.refund), action_request(gateway, payment_id, None)
    ours = send(adapter.refund, key, request)
    answer = reconcile(adapter.refund, key, request)
    if isinstance(answer, Unknown):
        assert gateway == "stripe" and "could not be checked" in answer.reason, answer.reason
    else:
        assert isinstance(answer, Completed), answer
        assert action_id(gateway, answer.result) == action_id(gateway, ours)
        assert answer.result["amount"] == OURS - THEIRS


# --- a replayed answer: another amount, another payment, another kind -------------------------


REPLAYED_AMOUNT = each("checkout capture", "checkout refund", "paypal capture", "paypal refund")


@REPLAYED_AMOUNT
def test_a_replayed_action_of_another_amount_is_refused(theirs: TheirAction) -> None:
    """Our resend of 2500 under the key their 1000 was made with: the gateway answers
    theirs again, which the send refuses (definite: nothing was done for ours)."""
    with pytest.raises(AnotherRequestsAnswerError, match=THEIR_AMOUNT):
        send(theirs.call, theirs.key, theirs.ours(), 2)
    assert theirs.nothing_more_moved()


@REPLAYED_AMOUNT
def test_twin_without_the_comparison_a_replayed_action_of_another_amount_is_taken(
    theirs: TheirAction,
) -> None:
    with sabotage(ADOPTS_ANY_PAYMENT):
        taken = send(theirs.call, theirs.key, theirs.ours(), 2)
    theirs.assert_taken_for_ours(taken)  # our 2500 never moved


OTHER_PAYMENT = [
    ("checkout", "capture"),
    ("checkout", "refund"),
    ("checkout", "void"),
    ("adyen", "capture"),
    ("adyen", "refund"),
    ("adyen", "void"),
    ("paypal", "capture"),
    ("paypal", "refund"),
    ("paypal", "void"),
]


def _the_other_shop_acts_on_its_payment(
    gateway: str, kind: str, adapter: Any, key: str
) -> tuple[str, str, dict[str, Any]]:
    """Shop A's capture, refund or void of order 43's payment (2500, all of it), under the
    key shop B sends for the same action on order 42's: our payment, theirs, their result."""
    captured = kind == "refund"
    theirs = make_payment(gateway, adapter, captured=captured, order="order-43")
    ours = make_payment(gateway, adapter, captured=captured)
    amount = None if kind == "void" else OURS
    result: dict[str, Any] = send(
        getattr(adapter, kind), key, action_request(gateway, theirs, amount)
    )
    return ours, theirs, result


def _acted_on(server: FakeGatewayServer, kind: str, payment: str) -> bool:
    """Whether the fake shows the capture, refund or void done on its ``payment``."""
    found = [
        p
        for p in server.gateway.payments
        # Adyen answers a pspReference of its own; the others an id ending with the fake's.
        if payment.endswith(p["id"].removeprefix("ch_")) or payment == psp_reference_of(p["id"])
    ]
    assert len(found) == 1, (payment, server.gateway.payments)
    done = {"capture": "succeeded", "refund": "refunded", "void": "canceled"}[kind]
    return bool(found[0]["status"] == done)


_WHICH = {("adyen", "capture"): "capture_id", ("adyen", "void"): "cancel_id"}


def _which(gateway: str, kind: str, result: dict[str, Any]) -> Any:
    """Which action a result is: Checkout.com's action, Adyen's capture or cancel (their
    ``id`` is the request's payment), else the result's id."""
    if gateway == "checkout":
        return result["action_id"]
    return result[_WHICH.get((gateway, kind), "id")]


@pytest.mark.parametrize(("gateway", "kind"), OTHER_PAYMENT)
def test_a_replayed_action_on_another_payment_is_refused(
    gateway: str, kind: str, served: ServeFn, shop: Shop
) -> None:
    """Same kind, same amount, another payment (order 43's) under our key: the answer
    names that payment, so our send refuses it and our payment stays as it was."""
    server, adapter = served_adapter(served, gateway)
    call = getattr(adapter, kind)
    key = key_for(shop, call)
    ours, theirs, _ = _the_other_shop_acts_on_its_payment(gateway, kind, adapter, key)
    amount = None if kind == "void" else OURS
    with pytest.raises(AnotherRequestsAnswerError, match="payment") as refused:
        send(call, key, action_request(gateway, ours, amount), 2)
    assert any(repr(ours) in d for d in refused.value.differences), refused.value.differences
    assert _acted_on(server, kind, theirs)
    assert not _acted_on(server, kind, ours)


@pytest.mark.parametrize(("gateway", "kind"), OTHER_PAYMENT)
def test_twin_without_the_comparison_another_payment_s_action_is_taken_for_ours(
    gateway: str, kind: str, served: ServeFn, shop: Shop
) -> None:
    server, adapter = served_adapter(served, gateway)
    call = getattr(adapter, kind)
    key = key_for(shop, call)
    ours, theirs, made = _the_other_shop_acts_on_its_payment(gateway, kind, adapter, key)
    amount = None if kind == "void" else OURS
    with sabotage(ADOPTS_ANY_PAYMENT):
        taken = send(call, key, action_request(gateway, ours, amount), 2)
    assert _which(gateway, kind, taken) == _which(gateway, kind, made)  # "done", with 43's ...
    assert _acted_on(server, kind, theirs)
    assert not _acted_on(server, kind, ours)  # ... and order 42's never touched


def test_a_replayed_checkout_action_of_another_kind_is_refused(served: ServeFn, shop: Shop) -> None:
    """Their capture of order 42's payment under the key of our refund of it: Checkout.com
    answers the capture again, which is not a refund."""
    server, adapter = served_adapter(served, "checkout")
    payment_id = make_payment("checkout", adapter, captured=False)
    key = key_for(shop, adapter.refund)
    send(adapter.capture, key, action_request("checkout", payment_id, OURS))
    with pytest.raises(AnotherRequestsAnswerError, match="'Capture' action, not a 'Refund'"):
        send(adapter.refund, key, action_request("checkout", payment_id, OURS), 2)
    assert server.gateway.refunds == []


def test_twin_without_the_comparison_their_capture_is_taken_for_our_refund(
    served: ServeFn, shop: Shop
) -> None:
    server, adapter = served_adapter(served, "checkout")
    payment_id = make_payment("checkout", adapter, captured=False)
    key = key_for(shop, adapter.refund)
    send(adapter.capture, key, action_request("checkout", payment_id, OURS))
    with sabotage(ADOPTS_ANY_PAYMENT):
        taken = send(adapter.refund, key, action_request("checkout", payment_id, OURS), 2)
    assert taken["type"] == "Capture"  # a "refund" that refunded nothing
    assert server.gateway.refunds == []
