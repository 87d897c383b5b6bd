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
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.example.support import run_script

MODULE = "tests.example.checkout_3ds_retry"


def _run(tmp_path: Path, database_url: str, mode: str) -> Any:
    return run_script(MODULE, str(tmp_path), database_url, mode)


def test_a_payment_intent_confirmed_again_after_a_failed_3ds_is_captured_once(
    tmp_path: Path, shop_database_url: str
) -> None:
    seen = _run(tmp_path, shop_database_url, "protected")
    retried = seen["retried"]
    assert retried["states"] == ["PAUSED", "COMPLETED"], retried
    assert retried["gave_up"] == {
        "status": "authorized",
        "ledger": ["checkout:requires_payment_method"],
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
    retried = _run(tmp_path, f"sqlite:///{tmp_path / 'shop.db'}", "without-retry")["retried"]
    assert retried["capture_executions"] == 0, retried
    assert retried["results"] == [], retried
    assert retried["requests"] == [], retried
    assert retried["status"] == "authorized", retried
