"""One authorisation (PaymentIntent), one disposition: whichever route records first wins.

A shipment's capture was keyed ``capture:<pi>:<shipment>``, and shipment 1's key was the
3-D Secure checkout's own capture key: a shipment of an order the checkout captured
failed on the key's other request (``IdempotencyKeyConflictError``), and a shipment
captured while the checkout was about to capture made the checkout fail the same way,
the order never marked paid and nobody told. The customer's cancel
(``settle_authorization(order, "void")``) recorded the authorisation's disposition, but
``capture_retried_checkout`` never looked at it: a cancel after the retried capture sent
a void Stripe refused (the customer who cancelled kept paying), and one before it was
followed by a capture of the cancelled PaymentIntent.

Now every route decides through the one disposition record (``dispositions.dispose``): the
checkout's captures (``checkout_3ds``, ``capture_retried_checkout``) and fulfilment's
(``settle_authorization``) are one capture, sent under the disposition's key; a cancel
that loses to it becomes a refund, a capture that loses to a cancel sends nothing; a
shipment's capture and a whole capture refuse each other, nothing sent, noted
``refused:<route>:<first>`` for a person (``one_disposition.py`` runs each race both
ways; money counted at the fake Stripe's requests).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.example.support import run_script

MODULE = "tests.example.one_disposition"
CAPTURE, VOID, REFUND = ["capture", "PROCESSED"], ["void", "PROCESSED"], ["refund", "PROCESSED"]
GAVE_UP = "checkout:requires_payment_method"


def _run(tmp_path: Path, database_url: str, case: str) -> Any:
    return run_script(MODULE, str(tmp_path), database_url, case)


def test_a_shipment_of_an_order_the_checkout_captured_is_refused_and_noted(
    tmp_path: Path, shop_database_url: str
) -> None:
    seen = _run(tmp_path, shop_database_url, "shipment:checkout-first")
    assert seen == {
        "checkout": "COMPLETED",
        "checkout_result": "succeeded",
        "shipment": "COMPLETED",
        "shipment_result": {"not_captured": "the authorisation was captured whole first"},
        "status": "paid",
        "ledger": ["paid", "refused:ship:capture"],
        "requests": [CAPTURE],  # the checkout's, once; nothing sent for the shipment
        "captured": 1000,
    }, seen


def test_a_checkout_meeting_a_shipment_captured_first_sends_nothing_and_is_noted(
    tmp_path: Path, shop_database_url: str
) -> None:
    seen = _run(tmp_path, shop_database_url, "shipment:shipment-first")
    assert seen == {
        "checkout": "COMPLETED",
        "checkout_result": {"not_captured": "a shipment was captured first"},
        "shipment": "COMPLETED",
        "shipment_result": "succeeded",
        "status": "authorized",  # never paid by a part: a person settles the rest
        "ledger": ["captured", "refused:capture:ship"],
        "requests": [CAPTURE],  # the shipment's 600, once
        "captured": 600,
    }, seen


def test_a_cancel_after_the_retried_capture_becomes_its_refund(
    tmp_path: Path, shop_database_url: str
) -> None:
    seen = _run(tmp_path, shop_database_url, "cancel:capture-first")
    assert seen == {
        "capture": "COMPLETED",
        "capture_result": "succeeded",
        "cancel": "COMPLETED",
        "cancel_result": "refunded",
        "status": "refunded",
        "ledger": [GAVE_UP, "paid", "refunded"],
        "requests": [CAPTURE, REFUND],  # no void sent after the capture
        "refunds": 1,
    }, seen


def test_a_cancel_before_the_retried_capture_stands_the_capture_down(
    tmp_path: Path, shop_database_url: str
) -> None:
    seen = _run(tmp_path, shop_database_url, "cancel:void-first")
    assert seen == {
        "capture": "COMPLETED",
        "capture_result": {"not_captured": "the order was cancelled first"},
        "cancel": "COMPLETED",
        "cancel_result": "canceled",
        "status": "voided",
        "ledger": [GAVE_UP, "disposition:void"],
        "requests": [VOID],  # no capture of the cancelled PaymentIntent
        "refunds": 0,
    }, seen


@pytest.mark.parametrize(
    ("case", "sent", "loser"),
    [
        ("shipment:checkout-first", [CAPTURE, ["capture", "INVALID"]], "shipment"),
        ("shipment:shipment-first", [CAPTURE, ["capture", "INVALID"]], "checkout"),
        ("cancel:capture-first", [CAPTURE, ["void", "INVALID"]], "cancel"),
        ("cancel:void-first", [VOID, ["capture", "INVALID"]], "capture"),
    ],
)
def test_without_the_one_record_both_routes_send_and_stripe_refuses_the_second(
    tmp_path: Path, case: str, sent: list[list[str]], loser: str
) -> None:
    """The twins: each route deciding alone sends its request after the other's, which
    Stripe refuses and the loser's execution fails on. A customer who cancelled after the
    retried capture stays charged, the order ``paid``; a checkout meeting a shipment
    never marks the order paid, and nobody is told."""
    seen = _run(tmp_path, f"sqlite:///{tmp_path / 'shop.db'}", f"{case}+without-one-record")
    assert seen["requests"] == sent, seen
    assert seen[loser] == "FAILED", seen
    if case == "cancel:capture-first":
        assert (seen["status"], seen["refunds"]) == ("paid", 0), seen
    if case == "shipment:shipment-first":
        assert (seen["status"], seen["ledger"]) == ("authorized", ["captured"]), seen
