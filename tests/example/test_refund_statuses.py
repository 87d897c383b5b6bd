"""The shop marks an order refunded only when Stripe gave the order's amount back.

Stripe lists a refund whatever became of it: ``pending`` and ``requires_action`` have
returned nothing yet, ``failed`` and ``canceled`` never will, and a partial refund
leaves the rest paid. ``example_project.shop`` marked the order refunded on any listed
refund (``handle_stripe_event``) and on any refund's answer (``refund``), so a customer
was told they got their money back when nobody sent it. Now only succeeded refunds in
the order's currency adding up to its amount mark it; a pending one leaves it paid
until Stripe's webhook says the refund succeeded (``refund_statuses.py`` runs it).
"""

from __future__ import annotations

from tests.example.conftest import RunCase


def test_only_a_succeeded_refund_of_the_orders_amount_marks_it_refunded(run_case: RunCase) -> None:
    seen = run_case("tests.example.refund_statuses")
    # The webhook: Stripe's listed refunds, read when each charge.refunded event is applied.
    assert seen["webhook"] == {
        "pending": ["paid"],
        "requires_action": ["paid"],
        "failed": ["paid"],
        "canceled": ["paid"],
        "partial": ["paid"],
        "other_currency": ["paid"],
        "succeeded": ["refunded"],
        "two_partials": ["paid", "refunded"],
    }, seen
    # The shop's refund_order: one refund request each; a pending answer leaves the order
    # paid (noted), and Stripe's later word decides; a failed refund never marks it.
    assert seen["refund_order"] == {
        "pending_then_succeeded": {
            "answered": "pending",
            "after_refund": "paid",
            "after_webhook": "refunded",
            "ledger": ["paid", "refund:pending", "webhook:charge.refunded"],
            "refund_requests": 1,
        },
        "failed": {
            "answered": "failed",
            "after_refund": "paid",
            "after_webhook": "paid",
            "ledger": ["paid", "refund:failed", "webhook:charge.refunded"],
            "refund_requests": 1,
        },
    }, seen
    assert seen["refunds_made"] == 11, seen
