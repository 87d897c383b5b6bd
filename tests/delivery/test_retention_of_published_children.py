"""Retention and the executions a body published (design: retention).

A ``PaymentTask`` a body publishes alone (``charge.delay(order)``) gets an id derived
from its parent and the publish's position, and only its execution row makes the same
publish, reached again by a re-run of the parent, a replay. Retention keeps that row
while the parent may still run again (paused for an answer, waiting), however long.

Speed-up: the virtual clock moves the database past the 7-day retentions.
"""

from __future__ import annotations

from typing import Any

from celery_agboss import answer_pause
from celery_agboss.core.protections import RETENTION_FORGETS_PUBLISHED_CHILDREN
from celery_agboss.testing import sabotage
from tests.delivery.conftest import PaymentShop
from tests.support.processes import wait_until

PAST_RETENTION = 8 * 24 * 3600  # seconds: past the 7-day defaults of every retention


def _child_charged_then_parent_answered_after_retention(shop: PaymentShop) -> list[str]:
    """The parent publishes the charge, then pauses for an approval; the charge completes;
    eight days pass (a sweep runs retention); the approval comes and the parent's body
    runs again from the top, publishing the charge again. The ids the charge ran under."""
    charge = shop.call("shop.charge")
    ran: list[str] = []

    @shop.task()
    def charge_order(self: Any, order: str) -> Any:
        ran.append(str(self.request.id))
        return self.outbound(charge, {"amount": 1000, "order": order})

    @shop.task()
    def place_order(self: Any, order: str) -> Any:
        charge_order.delay(order)
        return self.pause("approve")

    with shop.worker():
        parent = shop.deliver(place_order, "o-1", states=("PAUSED",))
        wait_until(lambda: ran, 20, message="the charge to run")
        shop.wait_state(ran[0], "COMPLETED")
        shop.clock.advance(PAST_RETENTION)
        shop.sweep()
        assert shop.intents(ran[0]) == [], "retention went on with the charge's records"
        assert answer_pause(shop.app, f"{parent}:approve", {"ok": True})
        shop.wait_state(parent, "COMPLETED")
        # The re-published charge is either dropped as done or runs: wait for either.
        wait_until(
            lambda: len(ran) > 1 or shop.agboss.executions.read_execution(ran[0]) is not None,
            20,
            message="the re-published charge to be judged",
        )
        shop.wait_state(ran[0], "COMPLETED")
    return ran


def test_retention_keeps_a_published_charge_while_its_parent_may_run_again(
    shop: PaymentShop,
) -> None:
    ran = _child_charged_then_parent_answered_after_retention(shop)
    assert len(shop.gateway.payments) == 1, shop.gateway.payments
    assert len(ran) == 1, "the re-published charge ran again"


def test_twin_retention_forgets_a_published_charge_and_it_charges_again(
    shop: PaymentShop,
) -> None:
    with sabotage(RETENTION_FORGETS_PUBLISHED_CHILDREN):
        _child_charged_then_parent_answered_after_retention(shop)
    assert len(shop.gateway.payments) == 2, "the twin should charge twice"
