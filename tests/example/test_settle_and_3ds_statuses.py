"""The shop settles an authorisation by what Stripe did, and a 3-D Secure checkout waits
again while Stripe has decided nothing.

``settle_authorization`` moved the order to ``captured`` (or ``voided``) on any answer to
its capture (or void): Stripe answers a capture with the PaymentIntent, which may be
``processing``, or show less received than the order's amount. Now the order is
``captured`` only when ``paid_in_full`` says Stripe took its amount, ``voided`` only when
the PaymentIntent is ``canceled``; otherwise it is left as it is, noted
``capture:<status>`` or ``void:<status>``. A cancel that lost to the capture refunded
whatever the capture answered: a capture still ``processing`` (or short) got a refund of
money never captured. Now the capture's answer decides by the same rule; otherwise
nothing is sent and the order is noted ``cancelled:capture:<status>``.

``checkout_3ds`` read Stripe's status once after its wait and took a reading still
pending (``requires_action``, ``processing``: the return page answered before the bank did)
as final: ``not_captured``, the authorisation never captured. Now it waits again under the
next name (``3ds-2``, …), which the return page and the webhook answer (``web``'s
``answer_checkout``) up to ``OUTCOME_ROUNDS`` waits; a later wait is an operator's
(``settle_and_3ds_statuses.py`` runs both). The webhook answered only Stripe's
``amount_capturable_updated``: a failed authentication (``payment_failed``) left the
checkout waiting for an operator until its pause expired; now it answers it too.
"""

from __future__ import annotations

from typing import Any

from tests.example.conftest import RunCase


def _run(run_case: RunCase, section: str) -> Any:
    """The runner's ``section`` (``settle`` or ``3ds``), run on its own."""
    return run_case("tests.example.settle_and_3ds_statuses", section)[section]


def test_an_authorisation_is_captured_or_voided_only_when_stripe_did_it(run_case: RunCase) -> None:
    settle = _run(run_case, "settle")
    capture, void = [["capture", "PROCESSED"]], [["void", "PROCESSED"]]

    def left(action: str, status: str) -> dict[str, Any]:
        ledger = [f"disposition:{action}", f"{action}:{status}"]
        requests = capture if action == "capture" else void
        return {"succeeded": True, "status": "authorized", "ledger": ledger, "requests": requests}

    assert settle == {
        "capture_processing": left("capture", "processing"),
        "capture_short": left("capture", "succeeded"),
        "capture_other_currency": left("capture", "succeeded"),
        "capture_succeeded": {
            "succeeded": True,
            "status": "captured",
            "ledger": ["disposition:capture"],
            "requests": capture,
        },
        "void_not_canceled": left("void", "requires_capture"),
        "void_canceled": {
            "succeeded": True,
            "status": "voided",
            "ledger": ["disposition:void"],
            "requests": void,
        },
    }, settle


def test_a_cancel_after_the_capture_refunds_only_what_the_capture_took(run_case: RunCase) -> None:
    # The capture won the race and Stripe answered it: a refund request only when it took
    # the order's amount (``paid_in_full``); else nothing sent, noted for a person.
    cancelled = _run(run_case, "cancelled")
    capture = ["capture", "PROCESSED"]

    def kept(status: str) -> dict[str, Any]:
        ledger = ["disposition:capture", f"capture:{status}", f"cancelled:capture:{status}"]
        return {
            "succeeded": True,
            "answered": ["not_refunded"],
            "status": "authorized",
            "ledger": ledger,
            "requests": [capture],
        }

    assert cancelled == {
        "captured_after_the_cancel": {"status": "authorized", "last": "cancelled:captured-later"},
        "capture_processing": kept("processing"),
        "capture_short": kept("succeeded"),
        "capture_succeeded": {
            "succeeded": True,
            "answered": ["refunded"],
            "status": "refunded",
            "ledger": ["disposition:capture", "refunded"],
            "requests": [capture, ["refund", "PROCESSED"]],
        },
    }, cancelled


def test_a_3ds_checkout_waits_again_while_stripe_is_still_pending(run_case: RunCase) -> None:
    seen = _run(run_case, "3ds")
    # The return page answered before the bank: the reading (requires_action) is no
    # outcome, the checkout waits again; the webhook answers that wait, one capture.
    assert seen["pending_then_authorised"] == {
        "states": ["PAUSED", "PAUSED", "COMPLETED"],
        "return_page_answered": [True],
        "webhook_status": 200,
        "status": "paid",
        "ledger": ["charge:requires_action", "paid"],
        "requests": [["capture", "PROCESSED"]],
    }, seen["pending_then_authorised"]
    # 3-D Secure failed: Stripe's payment_failed answers the wait (before, only an
    # authorisation's event did, and the checkout waited until its pause expired); the
    # body reads requires_payment_method, captures nothing, notes it, never marks it paid
    # (nor ``authorized``: Stripe never held the amount).
    assert seen["authentication_failed"] == {
        "states": ["PAUSED", "COMPLETED"],
        "webhook_status": 200,
        "status": "new",
        "ledger": ["charge:requires_action", "checkout:requires_payment_method"],
        "requests": [],
    }, seen["authentication_failed"]
    # Still processing after every wait the return page answers: the next wait is an
    # operator's (told why), nothing captured until the operator's answer and Stripe's word.
    assert seen["bound"] == {
        "states": ["PAUSED"] * 6 + ["COMPLETED"],
        "return_page_answered": [True] * 5 + [False],
        "operator_wait": "PENDING",
        "operator_told": True,
        "requests_before_operator": [],
        "status": "paid",
        "ledger": ["charge:processing", "paid"],
        "requests": [["capture", "PROCESSED"]],
    }, seen["bound"]
