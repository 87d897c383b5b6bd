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

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.example.support import REPO_ROOT


@pytest.fixture(params=["sqlite", "postgresql"])
def shop_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'shop.db'}"
    url: str = request.getfixturevalue("empty_postgres_url")
    return url


def _run(tmp_path: Path, database_url: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-m", "tests.example.refund_statuses", str(tmp_path), database_url],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-6000:]
    seen: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return seen


def test_only_a_succeeded_refund_of_the_orders_amount_marks_it_refunded(
    tmp_path: Path, shop_database_url: str
) -> None:
    seen = _run(tmp_path, shop_database_url)
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
