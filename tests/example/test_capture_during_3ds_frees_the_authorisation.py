"""A capture sent while the customer still authenticates holds nothing: the checkout's
capture, or the customer's cancel, still goes ahead, once.

``checkout_3ds`` marked its order ``authorized`` while Stripe showed ``requires_action``
(nothing held yet). Fulfilment then settled it (``settle_authorization(order,
"capture")``): the disposition was recorded ``capture``, the capture sent, Stripe refused
it; once the customer authenticated, the checkout's capture got ``capture`` from the
disposition, under the same key, whose recorded failure is never sent again: the checkout
waited for an operator, and so did the customer's cancel, which lost to the recorded
capture. The money the customer authorised was neither captured nor released.

Now an order is ``authorized`` only once Stripe holds its amount (``authorize``: the
checkout's order is noted ``charge:requires_action`` instead, its PaymentIntent kept), and
a whole capture Stripe definitely refused is noted ``disposition:capture:refused``, which
frees the authorisation as a refused shipment does: the next route decides in the
disposition's next round, under that round's key (``pending_payments.py`` runs it; money
counted at the fake Stripe).
"""

from __future__ import annotations

from tests.example.conftest import RunCase

MODULE = "tests.example.pending_payments"
REFUSED = ["charge:requires_action", "disposition:capture", "disposition:capture:refused"]


def test_the_checkout_captures_once_after_fulfilments_capture_was_refused(
    run_case: RunCase,
) -> None:
    seen = run_case(MODULE, "3ds:then-capture")
    refunded = seen.pop("cancel")
    assert sorted(refunded) == ["refunded"], refunded
    assert seen == {
        "while_authenticating": "new",  # never authorized while Stripe held nothing
        "settle": {"failed": "InvalidRequestError"},  # Stripe refused: nothing captured
        "settle_state": "FAILED",
        "checkout_states": ["PAUSED", "COMPLETED"],  # no operator
        "after_checkout": "paid",
        "cancel_state": "COMPLETED",  # the cancel after the capture: its refund
        "captures": 1,
        "refunds": 1,
        "stripe_status": "refunded",
        "status": "refunded",
        "ledger": [*REFUSED, "paid", "refunded"],
    }, seen


def test_the_customers_cancel_voids_after_fulfilments_capture_was_refused(
    run_case: RunCase,
) -> None:
    seen = run_case(MODULE, "3ds:then-void")
    assert seen == {
        "while_authenticating": "new",
        "settle": {"failed": "InvalidRequestError"},
        "settle_state": "FAILED",
        "checkout_states": ["PAUSED", "COMPLETED"],  # read canceled: nothing to capture
        "after_checkout": "voided",
        "cancel": "canceled",  # the void went ahead: the authorised money released
        "cancel_state": "COMPLETED",
        "captures": 0,
        "refunds": 0,
        "stripe_status": "canceled",
        "status": "voided",
        "ledger": [*REFUSED, "disposition:void", "checkout:canceled"],
    }, seen
