"""The shop settles an authorisation by what Stripe did, and a 3-D Secure checkout waits
again while Stripe has decided nothing.

``settle_authorization`` moved the order to ``captured`` (or ``voided``) on any answer to
its capture (or void): Stripe answers a capture with the PaymentIntent, which may be
``processing``, or show less received than the order's amount. Now the order is
``captured`` only when ``paid_in_full`` says Stripe took its amount, ``voided`` only when
the PaymentIntent is ``canceled``; otherwise it is left as it is, noted
``capture:<status>`` or ``void:<status>``.

``checkout_3ds`` read Stripe's status once after its wait and took a reading still
pending (``requires_action``, ``processing``: the return page answered before the bank did)
as final: ``not_captured``, the authorisation never captured. Now it waits again under the
next name (``3ds-2``, …), which the return page and the webhook answer (``web``'s
``answer_checkout``) up to ``OUTCOME_ROUNDS`` waits; a later wait is an operator's
(``settle_and_3ds_statuses.py`` runs both).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.example.support import run_script


def _run(tmp_path: Path, database_url: str, section: str) -> Any:
    """The runner's ``section`` (``settle`` or ``3ds``), run on its own."""
    module = "tests.example.settle_and_3ds_statuses"
    return run_script(module, str(tmp_path), database_url, section)[section]


def test_an_authorisation_is_captured_or_voided_only_when_stripe_did_it(
    tmp_path: Path, shop_database_url: str
) -> None:
    settle = run_script(
        "tests.example.settle_and_3ds_statuses", str(tmp_path), shop_database_url, "settle"
    )["settle"]
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


def test_a_3ds_checkout_waits_again_while_stripe_is_still_pending(
    tmp_path: Path, shop_database_url: str
) -> None:
    seen = run_script(
        "tests.example.settle_and_3ds_statuses", str(tmp_path), shop_database_url, "3ds"
    )["3ds"]
    # The return page answered before the bank: the reading (requires_action) is no
    # outcome, the checkout waits again; the webhook answers that wait, one capture.
    assert seen["pending_then_authorised"] == {
        "states": ["PAUSED", "PAUSED", "COMPLETED"],
        "return_page_answered": [True],
        "webhook_status": 200,
        "status": "paid",
        "ledger": ["paid"],
        "requests": [["capture", "PROCESSED"]],
    }, seen["pending_then_authorised"]
    # Still processing after every wait the return page answers: the next wait is an
    # operator's (told why), nothing captured until the operator's answer and Stripe's word.
    assert seen["bound"] == {
        "states": ["PAUSED"] * 6 + ["COMPLETED"],
        "return_page_answered": [True] * 5 + [False],
        "operator_wait": "PENDING",
        "operator_told": True,
        "requests_before_operator": [],
        "status": "paid",
        "ledger": ["paid"],
        "requests": [["capture", "PROCESSED"]],
    }, seen["bound"]
