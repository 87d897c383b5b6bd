"""The saga keeps its promise when Stripe takes the money later: out of stock refunds the
charge, once; in stock, the order is paid with its goods reserved.

``place_order`` reserved the goods only when the charge's answer had taken the money
(``paid_in_full``). A charge answered ``processing`` (or ``requires_action``) reserved
nothing, the saga ended ``COMPLETED``, and when Stripe took the money its webhook marked
the order ``paid``: out of stock, the customer was charged and nothing refunded; in stock,
a paid order held no reservation.

Now the saga waits for the charge's outcome (noted ``saga:<status>``), as the 3-D Secure
checkout waits: Stripe's webhook answers the wait (``web.stripe_webhook``), the saga reads
the PaymentIntent and reserves, its failure refunding the charge through the saga's undo,
once, or takes nothing when the charge failed. ``handle_stripe_event`` never marks a
waiting saga's order paid: the saga does, after the reservation (``pending_payments.py``
runs it; money counted at the fake Stripe).
"""

from __future__ import annotations

from tests.example.conftest import RunCase

MODULE = "tests.example.pending_payments"
PAUSED = {"failed": "ExecutionNotFinishedError"}  # the first delivery waits for the outcome


def test_a_charge_stripe_takes_later_for_an_item_out_of_stock_is_refunded_once(
    run_case: RunCase,
) -> None:
    seen = run_case(MODULE, "saga:out-of-stock")
    assert seen == {
        "first": PAUSED,
        "states": ["PAUSED", "FAILED"],
        "webhook_status": 200,
        "after_webhook": "new",  # never paid for goods nobody can ship
        "status": "refunded",
        "ledger": ["saga:processing", "webhook:payment_intent.succeeded", "refunded"],
        "charges": 1,
        "refunds": 1,
        "stock_left": 0,
    }, seen


def test_a_charge_stripe_takes_later_is_paid_with_its_goods_reserved(run_case: RunCase) -> None:
    seen = run_case(MODULE, "saga:in-stock")
    assert seen == {
        "first": PAUSED,
        "states": ["PAUSED", "COMPLETED"],
        "webhook_status": 200,
        "after_webhook": "new",  # paid by the saga, after its reservation
        "status": "paid",
        "ledger": ["saga:processing", "webhook:payment_intent.succeeded", "reserved", "paid"],
        "charges": 1,
        "refunds": 0,
        "stock_left": 0,
    }, seen


def test_a_charge_that_fails_later_reserves_and_refunds_nothing(run_case: RunCase) -> None:
    seen = run_case(MODULE, "saga:failed")
    assert seen == {
        "first": PAUSED,
        "states": ["PAUSED", "COMPLETED"],
        "webhook_status": 200,
        "after_webhook": "new",
        "status": "new",
        "ledger": [
            "saga:processing",
            "webhook:payment_intent.payment_failed",
            "charge:requires_payment_method",
        ],
        "charges": 1,
        "refunds": 0,
        "stock_left": 1,
    }, seen
