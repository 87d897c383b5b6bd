"""The shop's webhook handler moves an order only for the order's own PaymentIntent.

``handle_stripe_event`` found the order through the PaymentIntent's metadata and applied
what Stripe said of that PaymentIntent, whichever it was. A duplicate of the order (same
metadata, same amount) refunded in full by an operator moved the paid order to
``refunded`` and repointed its ``payment_id`` at the duplicate: the shop believed the
customer was refunded while it kept the real payment, and ``refund_order`` then refunded
the duplicate again (refused), never the real one. A succeeded duplicate marked an
authorised order paid the same way, and, before the order stored a payment and noted a
charge (its own charge in flight, its worker dead before the answer was written), any
duplicate that took the amount marked it paid: the customer's second payment kept, nobody
told. Now only the order's own PaymentIntent moves it: the one stored, or one the shop
created for it (``SHOP_CHARGE`` in its metadata); another moves nothing and is noted
``webhook:other-payment`` (``webhook_own_payment.py`` runs the cases).
"""

from __future__ import annotations

from tests.example.conftest import RunCase


def test_an_event_about_another_payment_intent_of_the_order_moves_nothing(
    run_case: RunCase,
) -> None:
    seen = run_case("tests.example.webhook_own_payment")
    refunded = "webhook:charge.refunded"
    succeeded = "webhook:payment_intent.succeeded"
    # The duplicate's refund leaves the order paid by its own payment; the shop's refund
    # then returns the real payment, once, and sends nothing more for the duplicate.
    assert seen["refunded_duplicate"] == {
        "after_webhook": {
            "status": "paid",
            "payment_id": "own",
            "ledger": [
                ["paid", "own"],
                [refunded, "-"],
                ["webhook:other-payment", "other"],
            ],
        },
        "refund_order_succeeded": True,
        "after_refund_order": "refunded",
        "own_refund_requests": 1,
        "other_refund_requests": 1,  # the operator's, only
    }, seen["refunded_duplicate"]
    # A succeeded duplicate leaves the authorised order to its own capture.
    assert seen["authorized_duplicate"] == {
        "after_webhook": {
            "status": "authorized",
            "payment_id": "own",
            "ledger": [[succeeded, "-"], ["webhook:other-payment", "other"]],
        },
        "capture_succeeded": True,
        "after_capture": "captured",
        "own_capture_requests": 1,
    }, seen["authorized_duplicate"]
    # Before the order stored a payment_id: only the PaymentIntent its charge created pays.
    other = [
        ["charge:requires_action", "own"],
        [succeeded, "-"],
        ["webhook:other-payment", "other"],
    ]
    assert seen["pending_duplicate"] == {
        "after_other": {"status": "new", "payment_id": None, "ledger": other},
        "after_own": {"status": "paid", "payment_id": "own", "ledger": [*other, [succeeded, "-"]]},
    }, seen["pending_duplicate"]
    # The shop's charge in flight (sent, its delivery dead before its answer was written):
    # the duplicate moves nothing, noted; the charge's re-run marks the order paid by its
    # own PaymentIntent (one charge request of the shop's).
    flagged = [[succeeded, "-"], ["webhook:other-payment", "other"]]
    assert seen["in_flight_duplicate"] == {
        "crashed": 1,
        "after_other": {"status": "new", "payment_id": None, "ledger": flagged},
        "after_own": {"status": "paid", "payment_id": "own", "ledger": [*flagged, ["paid", "own"]]},
        "shop_charge_requests": 1,
    }, seen["in_flight_duplicate"]
    # No task charged: a PaymentIntent the shop's checkout page made (``SHOP_CHARGE``)
    # pays the order; one made elsewhere that took its amount is noted, pays nothing.
    assert seen["checkout_page"] == {
        "status": "paid",
        "payment_id": "own",
        "ledger": [[succeeded, "-"]],
    }, seen["checkout_page"]
    assert seen["never_charged"] == {
        "status": "new",
        "payment_id": None,
        "ledger": flagged,
    }, seen["never_charged"]
    # Paid by its own PaymentIntent's webhook and refunded while the charge's answer was
    # unwritten: the re-run's late "paid" leaves the order refunded (one charge, one refund).
    assert seen["refunded_in_flight"] == {
        "crashed": 1,
        "refund_order_succeeded": True,
        "rerun_succeeded": True,
        "after_rerun": "refunded",
        "charge_requests": 1,
        "refund_requests": 1,
    }, seen["refunded_in_flight"]
