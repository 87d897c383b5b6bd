"""A customer who failed 3-D Secure confirms the same PaymentIntent again: captured once.

``checkout_3ds`` ends, noted ``checkout:<status>``, when Stripe's ``payment_failed``
answers its wait. Stripe lets the customer confirm that PaymentIntent again; when they
authenticate, Stripe holds the amount and sends ``amount_capturable_updated``. The shop
took that for nothing: no wait of the ended checkout took it, ``handle_stripe_event``
left the order ``authorized``, and nothing captured it, so Stripe released the money
the customer authorised and the order was never paid. Now ``web.stripe_webhook``
publishes ``shop.capture_retried_checkout`` for an authorisation of a PaymentIntent its
checkout gave up on; it captures under the checkout's own capture key (so once,
whatever number of events and executions) and marks the order paid by it
(``checkout_3ds_retry.py`` runs it; money counted at the fake gateway).

The customer may confirm again while the checkout is giving up (after its final reading,
before it ends): the event was then taken as an early answer to a wait the checkout never
reaches, ``web`` published no capture, and the money stayed held, the order unpaid. Now
the give-up enqueues a capture with its note (outbox), which reads Stripe after the
commit, and ``web`` publishes one for every authorisation of a PaymentIntent given up on.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.example.conftest import RunCase
from tests.example.support import run_on_sqlite

MODULE = "tests.example.checkout_3ds_retry"
AUTHENTICATING = "charge:requires_action"  # the authorisation, nothing held yet: not authorized


def test_a_payment_intent_confirmed_again_after_a_failed_3ds_is_captured_once(
    run_case: RunCase,
) -> None:
    seen = run_case(MODULE, "protected")
    retried = seen["retried"]
    assert retried["states"] == ["PAUSED", "COMPLETED"], retried
    # The capture the give-up enqueued reads Stripe before the customer confirms again:
    # nothing held, nothing captured; the order was never authorized (nothing held).
    assert retried["gave_up"] == {
        "status": "new",
        "ledger": [AUTHENTICATING, "checkout:requires_payment_method"],
        "capture": ["not_captured:requires_payment_method"],
    }, retried
    # The event twice (one capture execution), the return page answering nothing; a
    # later execution reads Stripe's "succeeded" and captures nothing more.
    assert retried["return_page_answered"] is False, retried
    assert retried["capture_executions"] == 1, retried
    assert retried["results"] == ["succeeded", "not_captured:succeeded"], retried
    # One capture at the gateway, and the order paid by the checkout's PaymentIntent.
    assert retried["requests"] == [["capture", "PROCESSED"]], retried
    assert (retried["status"], retried["payment_id_is_the_checkouts"]) == ("paid", True), retried
    assert retried["ledger"] == [
        AUTHENTICATING,
        "checkout:requires_payment_method",
        "paid",
        "webhook:payment_intent.amount_capturable_updated",
        "webhook:payment_intent.succeeded",
    ], retried
    # An authorisation no checkout gave up on is never captured by this path.
    assert seen["not_a_checkout"] == {
        "capture_executions": 0,
        "status": "authorized",
        "requests": [],
    }, seen["not_a_checkout"]


def test_without_the_retry_capture_the_authorised_money_is_never_captured(
    tmp_path: Path,
) -> None:
    """The twin: ``web`` publishing no capture (as before) leaves Stripe holding the
    customer's money, nothing captured, the order never paid."""
    retried = run_on_sqlite(MODULE, tmp_path, "without-retry")["retried"]
    assert retried["capture_executions"] == 0, retried
    assert retried["results"] == [], retried
    assert retried["requests"] == [], retried
    assert retried["status"] == "authorized", retried


LEDGER_PAID = [
    AUTHENTICATING,
    "checkout:requires_payment_method",
    "paid",
    "webhook:payment_intent.amount_capturable_updated",
]


@pytest.mark.parametrize("when", ["before-note", "after-note"])
def test_an_authorisation_while_the_checkout_gives_up_is_captured_once(
    run_case: RunCase, when: str
) -> None:
    """``before-note``: the give-up's capture (outbox) reads Stripe after its note
    committed and captures; ``after-note``: it read nothing held, and ``web`` publishes the
    capture though a wait (``3ds-2``) took the event as an early answer."""
    seen = run_case(MODULE, f"race:{when}")
    assert seen["states"] == ["PAUSED", "COMPLETED"], seen
    assert seen["requests"] == [["capture", "PROCESSED"]], seen  # once, at the gateway
    assert (seen["status"], seen["ledger"]) == ("paid", LEDGER_PAID), seen
    if when == "before-note":
        assert (seen["outbox_captures"], seen["web_captures"]) == (1, 0), seen
        assert seen["results"] == ["succeeded"], seen
    else:
        assert (seen["outbox_captures"], seen["web_captures"]) == (1, 1), seen
        assert seen["results"] == ["not_captured:requires_payment_method", "succeeded"], seen


@pytest.mark.parametrize(
    ("when", "switch"),
    [("before-note", "without-outbox-capture"), ("after-note", "without-capture-when-answered")],
)
def test_without_either_half_an_authorisation_while_giving_up_is_never_captured(
    tmp_path: Path, when: str, switch: str
) -> None:
    """The twins: no capture enqueued with the give-up's note, or ``web`` publishing a
    capture only for an authorisation no wait took (as before): Stripe holds the
    customer's money, nothing captured, the order never paid."""
    seen = run_on_sqlite(MODULE, tmp_path, f"race:{when}+{switch}")
    assert seen["states"] == ["PAUSED", "COMPLETED"], seen
    assert seen["requests"] == [], seen
    assert seen["status"] == "authorized", seen
