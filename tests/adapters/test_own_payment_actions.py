"""Per adapter (design: only the request's payment), for the calls that act on a payment:
a capture or refund the gateway shows under this request's key is taken for it only
when it is this request's.

The case, as in tests/adapters/test_own_payment.py for the charge: another deployment
on the same account (the same tenant) captured or refunded 1000 of the payment first,
under the very key this one sends for its own capture or refund of 2500. Stripe and
Checkout.com read the payment's capture or refund back (by the payment id, then by the
key in the action's metadata) and compare its amount with the stored request; Adyen has
no read, so the resend's replayed answer is compared. Each twin switches the comparison
off (``adapter-adopts-any-payment``) and shows the harm: their 1000 taken for our 2500.

A second group: a payment or action of the same amount that carries another call's key
is not taken either. There the key is matched before anything is compared (Stripe's
search and refund filter, Checkout.com's reference listing and action filter), so
``ADOPTS_ANY_PAYMENT`` does not reach it and those tests have no twin.
"""

from __future__ import annotations

import pytest

from celery_agboss.adapters.common import AnotherRequestsAnswerError
from celery_agboss.core.outbound import Completed, NotSent
from celery_agboss.core.protections import ADOPTS_ANY_PAYMENT
from celery_agboss.testing import sabotage
from tests.adapters.conftest import ServeFn
from tests.adapters.own_payment_support import (
    ORDER,
    OURS,
    THEIR_AMOUNT,
    THEIRS,
    TheirAction,
    action_request,
    assert_names_their_amount,
    each,
    key_for,
    make_payment,
    reconcile,
    send,
    served_adapter,
    support,
)
from tests.engine.helpers import Shop

# --- another amount under our key ----------------------------------------------------------

ACTIONS = each(
    "stripe capture", "stripe refund", "checkout capture", "checkout refund", "adyen refund"
)


@ACTIONS
def test_a_capture_or_refund_of_another_amount_under_our_key_is_not_taken(
    theirs: TheirAction,
) -> None:
    """Reconcile names the amount and leaves it to an operator; Adyen, with no read,
    refuses the resend's replayed answer. Nothing more is captured or refunded."""
    ours = theirs.ours()
    answer = reconcile(theirs.call, theirs.key, ours)
    if theirs.gateway == "adyen":
        assert answer == NotSent(), answer
        with pytest.raises(AnotherRequestsAnswerError, match=THEIR_AMOUNT):
            send(theirs.call, theirs.key, ours, 2)
    else:
        assert_names_their_amount(answer)
    assert theirs.nothing_more_moved()


@ACTIONS
def test_twin_without_the_comparison_their_capture_or_refund_is_taken_for_ours(
    theirs: TheirAction,
) -> None:
    ours = theirs.ours()
    with sabotage(ADOPTS_ANY_PAYMENT):
        answer = reconcile(theirs.call, theirs.key, ours)
        taken = (
            answer.result
            if isinstance(answer, Completed)
            else send(theirs.call, theirs.key, ours, 2)
        )
    assert isinstance(answer, NotSent if theirs.gateway == "adyen" else Completed), answer
    theirs.assert_taken_for_ours(taken)  # "done" with theirs, and our 2500 never moved


# --- another call's key: never found for ours (no twin: the key is matched first) ------------


@pytest.mark.parametrize("gateway", ["stripe", "checkout"])
def test_a_payment_of_the_same_request_under_another_call_s_key_is_not_taken(
    gateway: str, served: ServeFn, shop: Shop
) -> None:
    """Same amount, currency and order, but made under another call's key (its metadata
    carries that key): reconcile shows nothing of ours (Stripe searches our key,
    Checkout.com drops a listed payment marked with another key) and never adopts it."""
    server, adapter = served_adapter(served, gateway)
    request = support(gateway).charge_request(ORDER, OURS)
    send(adapter.charge, key_for(shop, adapter.charge, "order:42:another-call"), request)
    answer = reconcile(adapter.charge, key_for(shop, adapter.charge), request)
    assert answer == NotSent(), answer
    assert len(server.gateway.payments) == 1


KEYED_ACTIONS = [
    ("stripe", "refund"),
    ("checkout", "capture"),
    ("checkout", "refund"),
    ("checkout", "void"),
]


@pytest.mark.parametrize(("gateway", "kind"), KEYED_ACTIONS)
def test_an_action_on_our_payment_under_another_call_s_key_is_not_taken(
    gateway: str, kind: str, served: ServeFn, shop: Shop
) -> None:
    """The very capture, refund or void we ask for (same payment, same amount), made
    under another call's key: the action's metadata names that key, so reconcile finds
    nothing of ours."""
    _, adapter = served_adapter(served, gateway)
    call = getattr(adapter, kind)
    payment_id = make_payment(gateway, adapter, captured=kind == "refund")
    amount = None if kind == "void" else (THEIRS if kind == "refund" else OURS)
    request = action_request(gateway, payment_id, amount)
    send(call, key_for(shop, call, "order:42:another-call"), request)
    answer = reconcile(call, key_for(shop, call), request)
    assert answer == NotSent(), answer
