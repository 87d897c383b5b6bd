"""``python -m tests.example.webhook_own_payment DIR DATABASE_URL``: Stripe's webhooks about
another PaymentIntent of an order, applied by ``handle_stripe_event``, and what the shop
then did; as JSON on stdout.

Run in a process of its own (by ``test_webhook_own_payment.py``), as ``charge_statuses.py``
is: ``example_project.shop`` reads its settings from the environment when imported.

Every PaymentIntent carries the order in its metadata, so a duplicate made elsewhere (the
same amount and currency) names the order as its own does. Cases: a paid order whose
duplicate an operator refunds in full (``charge.refunded``), then the shop's own
``refund_order``; an authorised order whose duplicate succeeded, then its capture; an
order whose charge Stripe answered ``requires_action`` (no ``payment_id`` yet, the
PaymentIntent noted ``charge:requires_action``) whose duplicate succeeded, then its own;
an order whose charge was sent by a delivery that died before writing its answer (nothing
noted) whose duplicate succeeded, then the charge's re-run; and orders no task charged,
paid by a PaymentIntent naming them, made by the shop's checkout page or elsewhere; and
an order paid by its own PaymentIntent's webhook and refunded while its charge's answer
was still unwritten, then the charge's re-run.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any

from celery_agboss.testing.clock import VirtualClock
from celery_agboss.testing.dialects.stripe_wire import payment_id_of
from celery_agboss.testing.fault_arming import OUTBOUND_AFTER_SEND, arm_raise
from tests.example.charge_statuses import (
    UNPAID,
    FakeStripeShop,
    StripeIntents,
    shop_on_fake_stripe,
)


class Crash(BaseException):
    """The delivery died here: nothing after this point runs, its lease is not released."""


def _order(
    world: FakeStripeShop, order_id: str, own: str | None, other: str | None
) -> dict[str, Any]:
    """The order as the shop holds it; PaymentIntent ids as ``own`` / ``other``."""
    from example_project import orders, shop

    named = ((own, "own"), (other, "other"))
    names: dict[str | None, str] = {pid: name for pid, name in named if pid}
    row = shop._read(order_id)
    with world.engine.connect() as conn:
        ledger = [
            [entry, names.get(reference, "-")]
            for entry, reference in orders.entries(conn, order_id)
        ]
    return {
        "status": row["status"],
        "payment_id": names.get(row["payment_id"], row["payment_id"]),
        "ledger": ledger,
    }


def _requests(world: FakeStripeShop, operation: str, payment_id: str) -> int:
    """Requests for ``operation`` the gateway received about the PaymentIntent."""
    fake_id = payment_id_of(payment_id)
    return sum(
        1 for r in world.gateway.requests if r.operation == operation and r.payment_id == fake_id
    )


def _after_the_order_stored_or_noted(
    world: FakeStripeShop, intents: StripeIntents
) -> dict[str, Any]:
    """Duplicates of orders that stored their payment, or noted their pending charge."""
    from example_project import shop

    seen: dict[str, Any] = {}

    # A paid order; the operator refunds its duplicate in full; then the shop refunds.
    order_id = world.place("refunded-duplicate")
    own = str(shop.charge_order.apply((order_id,)).get()["id"])
    other = world.another_intent(order_id)
    shop.stripe.client.v1.refunds.create(params={"payment_intent": other})
    world.webhook("charge.refunded", other)
    after_webhook = _order(world, order_id, own, other)
    refunded = shop.refund_order.apply((order_id,))
    seen["refunded_duplicate"] = {
        "after_webhook": after_webhook,
        "refund_order_succeeded": refunded.successful(),
        "after_refund_order": _order(world, order_id, own, other)["status"],
        "own_refund_requests": _requests(world, "refund", own),
        "other_refund_requests": _requests(world, "refund", other),
    }

    # An authorised order; a duplicate succeeded; then the shop captures.
    order_id = world.place("authorized-duplicate")
    own = str(shop.authorize_order.apply((order_id,)).get()["id"])
    other = world.another_intent(order_id)
    world.webhook("payment_intent.succeeded", other)
    after_webhook = _order(world, order_id, own, other)
    captured = shop.settle_authorization.apply((order_id, "capture"))
    seen["authorized_duplicate"] = {
        "after_webhook": after_webhook,
        "capture_succeeded": captured.successful(),
        "after_capture": _order(world, order_id, own, other)["status"],
        "own_capture_requests": _requests(world, "capture", own),
    }

    # A charge answered requires_action: no payment_id yet, its PaymentIntent noted.
    order_id = world.place("pending-duplicate")
    intents.next = dict(UNPAID["requires_action"])
    own = str(shop.charge_order.apply((order_id,)).get()["id"])
    other = world.another_intent(order_id)
    world.webhook("payment_intent.succeeded", other)
    after_other = _order(world, order_id, own, other)
    intents.changed[own] = {}  # the customer authenticated: Stripe shows succeeded
    world.webhook("payment_intent.succeeded", own)
    seen["pending_duplicate"] = {
        "after_other": after_other,
        "after_own": _order(world, order_id, own, other),
    }
    return seen


def _charge_sent_then_dead(world: FakeStripeShop, case: str) -> tuple[str, str, Any]:
    """An order placed for ``case``, the shop's charge of it sent and its worker dead
    before the answer was written (nothing noted): its id, the charge's task id and the
    crash point (its ``hits``)."""
    from example_project import shop

    order_id = world.place(case)
    task_id = f"charge-{order_id}"
    crashed = arm_raise(OUTBOUND_AFTER_SEND, Crash, only={"call": shop.stripe.charge.name})
    with contextlib.suppress(Crash):
        shop.charge_order.apply((order_id,), task_id=task_id)
    return order_id, task_id, crashed


def _before_anything_noted(world: FakeStripeShop, clock: VirtualClock) -> dict[str, Any]:
    """Orders with no payment stored and no charge noted: a charge in flight, none."""
    from example_project import shop

    seen: dict[str, Any] = {}
    # The shop's charge sent, its worker dead before the answer was written (nothing
    # noted, no payment_id); a duplicate succeeded; then the charge's re-run.
    order_id, task_id, crashed = _charge_sent_then_dead(world, "in-flight-duplicate")
    other = world.another_intent(order_id)
    world.webhook("payment_intent.succeeded", other)
    after_other = _order(world, order_id, None, other)
    clock.advance(world.runtime.settings.lease_ttl_seconds + 1)  # the dead one's lease
    own = str(shop.charge_order.apply((order_id,), task_id=task_id).get()["id"])
    seen["in_flight_duplicate"] = {
        "crashed": crashed.hits,
        "after_other": after_other,
        "after_own": _order(world, order_id, own, other),
        "shop_charge_requests": sum(
            1
            for r in world.gateway.requests
            if r.operation == "charge" and order_id in (r.idempotency_key or "")
        ),
    }

    # Orders no task charged: a PaymentIntent naming one pays it only when the shop made
    # it (its checkout page), not one made elsewhere (the dashboard).
    for case, shops in (("checkout_page", True), ("never_charged", False)):
        order_id = world.place(case)
        paid_by = world.another_intent(order_id, shops=shops)
        world.webhook("payment_intent.succeeded", paid_by)
        seen[case] = _order(world, order_id, paid_by if shops else None, None if shops else paid_by)
    return seen


def _refunded_before_the_charge_answered(
    world: FakeStripeShop, clock: VirtualClock
) -> dict[str, Any]:
    """The shop's charge sent, its worker dead before the answer was written; Stripe's
    webhook about that PaymentIntent pays the order, the customer is refunded; then the
    charge's re-run writes its answer late: the order stays refunded (never shipped)."""
    from example_project import shop

    order_id, task_id, crashed = _charge_sent_then_dead(world, "refunded-in-flight")
    sent = [r for r in world.gateway.requests if r.operation == "charge"][-1]
    (charged,) = world.gateway.payments_for(str(sent.idempotency_key))
    own = "pi_" + str(charged["id"]).removeprefix("ch_")
    world.webhook("payment_intent.succeeded", own)
    refunded = shop.refund_order.apply((order_id,)).successful()
    clock.advance(world.runtime.settings.lease_ttl_seconds + 1)  # the dead one's lease
    rerun = shop.charge_order.apply((order_id,), task_id=task_id).successful()
    return {
        "refunded_in_flight": {
            "crashed": crashed.hits,
            "refund_order_succeeded": refunded,
            "rerun_succeeded": rerun,
            "after_rerun": _order(world, order_id, own, None)["status"],
            "charge_requests": len(world.gateway.requests_for(str(sent.idempotency_key))),
            "refund_requests": _requests(world, "refund", own),
        }
    }


def run(data_dir: Path, database_url: str) -> dict[str, Any]:
    intents, clock = StripeIntents(), VirtualClock()
    with shop_on_fake_stripe(data_dir, database_url, intents, clock=clock) as world:
        return {
            **_after_the_order_stored_or_noted(world, intents),
            **_before_anything_noted(world, clock),
            **_refunded_before_the_charge_answered(world, clock),
        }


if __name__ == "__main__":
    print(json.dumps(run(Path(sys.argv[1]).resolve(), sys.argv[2])))
