"""``transaction.on_commit`` hooks registered inside a fenced effect's ``fn``.

Django runs them inside ``atomic``'s exit, after the COMMIT. Before, a hook that raised
(the receipt e-mail's SMTP error) reached the body as the effect's failure though the
effect had committed: the order marked paid and recorded, the execution FAILED and its
undo refunding the charge. Now they run as Django's ``robust=True`` hooks do: each one,
its error logged by Django, and the committed effect is the effect's outcome. Counted at
the fake gateway: one charge, no refund.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.django.money_script import run_shop

pytestmark = [pytest.mark.slow]

SCRIPT = """
hooks_ran = []

def send_receipt_email():
    hooks_ran.append("receipt")
    raise ConnectionError("SMTP server unreachable")

def write(ref, conn):
    mark_paid(ref)
    transaction.on_commit(send_receipt_email)   # once the order is marked paid
    transaction.on_commit(lambda: hooks_ran.append("stock"))

pay = paying(write)
report(pay.apply(args=("o-1",), task_id="t-1"), hooks=hooks_ran)
"""


def test_a_raising_on_commit_hook_leaves_the_committed_effect_paid(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    out = run_shop(request, tmp_path, "sqlite", SCRIPT)
    assert out["gateway"] == ["charge"], "one charge, never refunded"
    assert (out["state"], out["paid"], out["effects"]) == ("COMPLETED", 1, 1), out
    assert out["hooks"] == ["receipt", "stock"], "each hook ran once, after the commit"


def test_a_hook_of_an_effect_that_rolled_back_never_runs(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Unchanged: fn's failure rolls its writes back, and its hooks with them."""
    script = """
    hooks_ran = []

    def write(ref, conn):
        mark_paid(ref)
        transaction.on_commit(lambda: hooks_ran.append("receipt"))
        raise ValueError("the effect fails after its write")

    report(paying(write).apply(args=("o-1",), task_id="t-1"), hooks=hooks_ran)
    """
    out = run_shop(request, tmp_path, "sqlite", script)
    assert out["gateway"] == ["charge", "refund"]
    assert (out["state"], out["paid"], out["hooks"]) == ("FAILED", 0, []), out
