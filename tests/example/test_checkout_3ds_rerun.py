"""The shop's 3-D Secure checkout, killed right after its capture, then run again.

``example_project.shop.checkout_3ds`` reads the payment's status from Stripe after the
pause and captures only when it is ``requires_capture``. A re-run starts from the top:
if it read the status again it would read ``succeeded`` (its own capture), skip the
capture an earlier delivery made, and end waiting for an operator ("divergence"), the
money captured and the order never marked paid. The shop keeps the first reading in a
fenced effect, so the re-run takes the same branch: the capture is reconciled, not sent
again, and the order is marked paid once (``checkout_3ds_crash.py`` runs it).
"""

from __future__ import annotations

from pathlib import Path

from tests.example.support import run_script


def test_a_rerun_after_the_capture_completes_with_one_capture_and_the_order_paid(
    tmp_path: Path,
) -> None:
    seen = run_script("tests.example.checkout_3ds_crash", str(tmp_path), timeout=120)
    assert seen["paused"] == "PAUSED" and seen["crashed"], seen
    # The gateway: one authorisation, one capture request (the re-run reconciled it).
    assert seen["requests"] == [["charge", "PROCESSED"], ["capture", "PROCESSED"]], seen
    # The re-run took the capture's branch again: completed, not "divergence: …".
    assert (seen["state"], seen["reason"], seen["rerun_succeeded"]) == ("COMPLETED", None, True), (
        seen
    )
    assert (seen["order_status"], seen["marked_paid"]) == ("paid", 1), seen
    assert seen["payment_id"], seen
