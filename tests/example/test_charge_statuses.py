"""The shop marks an order paid only when Stripe took the order's amount in its currency.

Stripe answers a create-and-confirm PaymentIntent with HTTP 200 at ``requires_action``
(3-D Secure) or ``processing`` too, having received nothing yet, and the adapter returns
that as the charge's result. ``example_project.shop`` (and the assistant's tasks) marked
the order paid on any answer, so the goods shipped and no money was taken; and its
webhook handler marked the order paid on any succeeded PaymentIntent naming it, an older,
smaller one or one in another currency too. Now every mark-paid goes through
``paid_in_full``: an order so answered is left as it is (noted ``charge:<status>``) and
Stripe's webhook marks it paid once its own PaymentIntent succeeded
(``charge_statuses.py`` runs it). The Django shop's ``charge_order`` keeps its order
pending the same way (``django_charge_statuses.py``).
"""

from __future__ import annotations

from pathlib import Path

from tests.example.conftest import RunCase
from tests.example.support import run_script

FLOWS = [
    "charge_order",
    "place_order",
    "approve_large_order",
    "assistant_session",
    "ship_part",
    "spend_budget",
    "pay_attempt",
]


def test_a_charge_stripe_has_not_taken_leaves_the_order_unpaid_until_its_webhook(
    run_case: RunCase,
) -> None:
    seen = run_case("tests.example.charge_statuses")
    # Every flow that marks an order paid: one charge request, the order still new (nothing
    # reserved, shipped or receipted), the answer's status noted; the saga waits for it.
    expected = {
        f"{flow}:{status}": {
            "succeeded": True,
            "status": "new",
            "ledger": [f"charge:{status}"],
            "charge_requests": 1,
        }
        for status in ("requires_action", "processing")
        for flow in FLOWS
    }
    for status in ("requires_action", "processing"):
        # The saga waits for the charge's outcome (test_saga_waits_for_its_charge.py).
        waiting = {"succeeded": False, "ledger": [f"saga:{status}"]}
        expected[f"place_order:{status}"].update(waiting)
    assert seen["flows"] == expected, seen["flows"]
    # An authorisation awaiting 3-D Secure holds nothing: authorized only once Stripe says so.
    assert seen["authorize_order"] == {
        "after_authorize": "new",
        "after_webhook": "authorized",
        "ledger": ["charge:requires_action", "webhook:payment_intent.succeeded"],
    }, seen["authorize_order"]
    # Succeeded PaymentIntents of the order that did not take its amount in its currency
    # (other than the one its charge created: noted for a person), and its own still
    # awaiting 3-D Secure, mark nothing; its own once succeeded does.
    webhooks = seen["webhooks"]
    event, other = "webhook:payment_intent.succeeded", "webhook:other-payment"
    assert webhooks == {
        "smaller": "new",
        "other_currency": "new",
        "own_still_requires_action": "new",
        "own_succeeded": "paid",
        "payment_id_is_own": True,
        "ledger": ["charge:requires_action", event, other, event, other, event, event],
    }, webhooks


def test_the_django_shop_keeps_an_order_pending_until_stripe_took_its_money(
    tmp_path: Path,
) -> None:
    # The Django shop's settings take a SQLite file only.
    seen = run_script("tests.example.django_charge_statuses", str(tmp_path))
    unpaid = {"succeeded": True, "status": "pending", "times_marked_paid": 0, "charge_requests": 1}
    assert seen == {
        "requires_action": unpaid,
        "processing": unpaid,
        "succeeded": {**unpaid, "status": "paid", "times_marked_paid": 1},
    }, seen
