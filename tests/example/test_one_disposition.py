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

import pytest

from tests.example.conftest import RunCase
from tests.example.support import run_on_sqlite

MODULE = "tests.example.one_disposition"
CAPTURE, VOID, REFUND = ["capture", "PROCESSED"], ["void", "PROCESSED"], ["refund", "PROCESSED"]
GAVE_UP = "checkout:requires_payment_method"
AUTHENTICATING = "charge:requires_action"  # the checkout's authorisation, nothing held yet


def test_a_shipment_of_an_order_the_checkout_captured_is_refused_and_noted(
    run_case: RunCase,
) -> None:
    seen = run_case(MODULE, "shipment:checkout-first")
    assert seen == {
        "checkout": "COMPLETED",
        "checkout_result": "succeeded",
        "shipment": "COMPLETED",
        "shipment_result": {"not_captured": "the authorisation was captured whole first"},
        "status": "paid",
        "ledger": [AUTHENTICATING, "paid", "refused:ship:capture"],
        "requests": [CAPTURE],  # the checkout's, once; nothing sent for the shipment
        "captured": 1000,
    }, seen


def test_a_checkout_meeting_a_shipment_captured_first_sends_nothing_and_is_noted(
    run_case: RunCase,
) -> None:
    seen = run_case(MODULE, "shipment:shipment-first")
    assert seen == {
        "checkout": "COMPLETED",
        "checkout_result": {"not_captured": "a shipment was captured, or is being captured, first"},
        "shipment": "COMPLETED",
        "shipment_result": "succeeded",
        "status": "new",  # never paid by a part: a person settles the rest
        "ledger": [AUTHENTICATING, "shipping", "captured", "refused:capture:ship"],
        "requests": [CAPTURE],  # the shipment's 600, once
        "captured": 600,
    }, seen


def test_a_cancel_after_the_retried_capture_becomes_its_refund(run_case: RunCase) -> None:
    seen = run_case(MODULE, "cancel:capture-first")
    assert seen == {
        "capture": "COMPLETED",
        "capture_result": "succeeded",
        "cancel": "COMPLETED",
        "cancel_result": "refunded",
        "status": "refunded",
        "ledger": [AUTHENTICATING, GAVE_UP, "paid", "refunded"],
        "requests": [CAPTURE, REFUND],  # no void sent after the capture
        "refunds": 1,
    }, seen


def test_a_cancel_before_the_retried_capture_stands_the_capture_down(run_case: RunCase) -> None:
    seen = run_case(MODULE, "cancel:void-first")
    assert seen == {
        "capture": "COMPLETED",
        "capture_result": {"not_captured": "the order was cancelled first"},
        "cancel": "COMPLETED",
        "cancel_result": "canceled",
        "status": "voided",
        "ledger": [AUTHENTICATING, GAVE_UP, "disposition:void"],
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
    seen = run_on_sqlite(MODULE, tmp_path, f"{case}+without-one-record")
    assert seen["requests"] == sent, seen
    assert seen[loser] == "FAILED", seen
    if case == "cancel:capture-first":
        assert (seen["status"], seen["refunds"]) == ("paid", 0), seen
    if case == "shipment:shipment-first":
        ledger = [AUTHENTICATING, "shipping", "captured", "disposition:capture:refused"]
        assert (seen["status"], seen["ledger"]) == ("new", ledger), seen


SHIPPED = ["shipping", "shipping:refused"]  # shipment 1: started, Stripe refused it
REFUSED = ["capture", "INVALID"]  # shipment 1's 1500 of the 1000 authorised


def test_a_whole_capture_after_a_refused_shipment_captures_the_order(run_case: RunCase) -> None:
    """Stripe refused the only shipment (nothing captured): its ``ship`` disposition no
    longer stands fulfilment's whole capture down; the capture is sent once, the order
    ``captured``, and a shipment after it is refused, nothing sent."""
    seen = run_case(MODULE, "refused-shipment:capture")
    assert seen == {
        "refused": {"failed": "InvalidRequestError"},
        "settle": "COMPLETED",
        "settle_result": "succeeded",
        "shipment": "COMPLETED",
        "shipment_result": {"not_captured": "the authorisation was captured whole first"},
        "status": "captured",
        "ledger": [*SHIPPED, "disposition:capture", "refused:ship:capture"],
        "requests": [REFUSED, CAPTURE],
        "captured": 1000,
    }, seen


def test_a_cancel_after_a_refused_shipment_voids_the_authorisation(run_case: RunCase) -> None:
    seen = run_case(MODULE, "refused-shipment:void")
    assert seen == {
        "refused": {"failed": "InvalidRequestError"},
        "settle": "COMPLETED",
        "settle_result": "canceled",
        "shipment": "COMPLETED",
        "shipment_result": {"not_captured": "the order was cancelled first"},
        "status": "voided",
        "ledger": [*SHIPPED, "disposition:void", "refused:ship:void"],
        "requests": [REFUSED, VOID],
        "captured": 0,
    }, seen


def test_a_whole_capture_meeting_a_shipment_in_flight_stands_down(run_case: RunCase) -> None:
    """Shipment 2 noted ``shipping`` (about to send) when fulfilment's whole capture
    decides: the capture sends nothing and is noted; shipment 2 takes its 600, once.
    The order stays ``authorized``, for a person to settle the rest (as before)."""
    seen = run_case(MODULE, "refused-shipment:in-flight")
    assert seen == {
        "refused": {"failed": "InvalidRequestError"},
        "settle": "COMPLETED",
        "settle_result": {"not_captured": "a shipment was captured, or is being captured, first"},
        "shipment": "COMPLETED",
        "shipment_result": "succeeded",
        "status": "authorized",
        "ledger": [*SHIPPED, "shipping", "refused:capture:ship", "captured"],
        "requests": [REFUSED, CAPTURE],
        "captured": 600,
    }, seen


def test_without_the_shipping_note_a_shipment_in_flight_and_a_whole_capture_both_send(
    tmp_path: Path,
) -> None:
    """The twin: the whole capture cannot see shipment 2 about to send, goes ahead and
    takes the 1000; shipment 2's capture is sent after it, Stripe refuses it (it captures
    a PaymentIntent once), and the shipment's execution fails on it."""
    seen = run_on_sqlite(MODULE, tmp_path, "refused-shipment:in-flight+without-shipping-note")
    assert seen["requests"] == [REFUSED, CAPTURE, REFUSED], seen
    assert (seen["settle_result"], seen["shipment"]) == ("succeeded", "FAILED"), seen
