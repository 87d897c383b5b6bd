"""The shop's webhook handler moves an order only for the order's own PaymentIntent.

``handle_stripe_event`` found the order through the PaymentIntent's metadata and applied
what Stripe said of that PaymentIntent, whichever it was. A duplicate of the order (same
metadata, same amount) refunded in full by an operator moved the paid order to
``refunded`` and repointed its ``payment_id`` at the duplicate: the shop believed the
customer was refunded while it kept the real payment, and ``refund_order`` then refunded
the duplicate again (refused), never the real one. A succeeded duplicate marked an
authorised order paid the same way. Now another PaymentIntent moves nothing and is noted
``webhook:other-payment`` (``webhook_own_payment.py`` runs the cases).
"""

from __future__ import annotations

from pathlib import Path

from tests.example.support import run_script


def test_an_event_about_another_payment_intent_of_the_order_moves_nothing(
    tmp_path: Path, shop_database_url: str
) -> None:
    seen = run_script("tests.example.webhook_own_payment", str(tmp_path), shop_database_url)
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
    # Nothing charged, nothing noted: a PaymentIntent naming the order that took its
    # amount pays it (paid_in_full), as before.
    assert seen["never_charged"] == {
        "status": "paid",
        "payment_id": "own",
        "ledger": [[succeeded, "-"]],
    }, seen["never_charged"]
