"""``python -m tests.example.refund_statuses DIR DATABASE_URL``: the shop's refunds at each
status Stripe gives a refund, and what the shop marked the order; as JSON on stdout.

Run in a process of its own (by ``test_refund_statuses.py``), as ``checkout_3ds_crash.py``
is: ``example_project.shop`` reads its settings from the environment when imported.

The fake's refunds all succeed at once; Stripe's Refund object may be ``pending``,
``requires_action``, ``succeeded``, ``failed`` or ``canceled``, and move later. So the
Stripe dialect here renders each refund with what the test says Stripe would show
(``StripeRefunds``), over the fake's own object. Each case is one order of 1000 usd,
charged by ``charge_order``; then either the shop's ``refund_order`` refunds it, or a
refund made at Stripe (as the dashboard makes one) is told by a ``charge.refunded``
webhook that ``handle_stripe_event`` applies. Each task runs in this thread (``apply``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import celery_agboss.testing.dialects.stripe as stripe_dialect
from tests.example.charge_statuses import StripeIntents, shop_on_fake_stripe

WEBHOOK_CASES: dict[str, list[tuple[int | None, dict[str, Any]]]] = {
    # case: the refunds made at Stripe, in order (amount, None for all; what Stripe shows)
    "pending": [(None, {"status": "pending"})],
    "requires_action": [(None, {"status": "requires_action"})],
    "failed": [(None, {"status": "failed"})],
    "canceled": [(None, {"status": "canceled"})],
    "partial": [(400, {})],
    "other_currency": [(None, {"currency": "eur"})],
    "succeeded": [(None, {})],
    "two_partials": [(400, {}), (600, {})],
}


class StripeRefunds(StripeIntents):
    """What Stripe shows of each refund, where the test changes it: ``next`` for the next
    refund made (its create's answer and every listing), ``changed`` by refund id."""

    def __init__(self) -> None:
        super().__init__(stripe_dialect.render_refund)


def run(data_dir: Path, database_url: str) -> dict[str, Any]:
    refunds = StripeRefunds()
    stripe_dialect.render_refund = refunds.render
    with shop_on_fake_stripe(data_dir, database_url) as world:
        from example_project import shop

        def paid_order(case: str) -> tuple[str, str]:
            order_id = world.place(case)
            shop.charge_order.apply((order_id,)).get()
            return order_id, str(shop._read(order_id)["payment_id"])

        def webhook(order_id: str, payment_id: str) -> str:
            """Stripe's ``charge.refunded`` for the payment, applied; the order's status."""
            world.webhook("charge.refunded", payment_id)
            return str(shop._read(order_id)["status"])

        def refund_requests() -> int:
            return sum(1 for r in world.gateway.requests if r.operation == "refund")

        seen: dict[str, Any] = {"webhook": {}, "refund_order": {}}
        for case, made in WEBHOOK_CASES.items():
            order_id, payment_id = paid_order(case)
            statuses = []
            for amount, shown in made:
                params: Any = {"payment_intent": payment_id}
                if amount is not None:
                    params["amount"] = amount
                refunds.next = shown
                shop.stripe.client.v1.refunds.create(params=params)
                statuses.append(webhook(order_id, payment_id))
            seen["webhook"][case] = statuses

        # The shop's own refund, answered pending, then failed or succeeded at Stripe.
        for case, later in (("pending_then_succeeded", "succeeded"), ("failed", "failed")):
            order_id, payment_id = paid_order(case)
            refunds.next = {"status": "pending" if later == "succeeded" else later}
            before = refund_requests()
            done = shop.refund_order.apply((order_id,)).get()
            sent = refund_requests() - before
            after_refund = str(shop._read(order_id)["status"])
            refunds.changed[done["id"]] = {"status": later}
            seen["refund_order"][case] = {
                "answered": done["status"],
                "after_refund": after_refund,
                "after_webhook": webhook(order_id, payment_id),
                "ledger": world.ledger(order_id),
                "refund_requests": sent,
            }
        seen["refunds_made"] = len(world.gateway.refunds)
    return seen


if __name__ == "__main__":
    print(json.dumps(run(Path(sys.argv[1]).resolve(), sys.argv[2])))
