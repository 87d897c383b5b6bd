"""An undo declared as a Celery signature counts as undone for the charge's record only once
its task refunded, in one Celery delivery, on both stores, counted at the gateway.

A later click on the same order (the same business key) asks the charge's record whether
it was undone: told ``.undone``, the docs' pattern charges again under a new attempt key.
While the refund task is only published (queued on a queue no worker consumes yet) or
waits for an operator (its refund declined), the click is told the step was *claimed for
undo*, not undone, and charges nothing; once the task completed, a click is told undone
and pays anew, once (twin ``undo-task-read-undone-on-publish``, on PostgreSQL: the click
is told undone while the refund is queued, and the customer holds two charges, no refund).

A cancel of the parent still ends ``CANCELLED`` once its undo's task is published: the
task, not the parent, carries the refund from there (a failure of it waits for a person).
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from celery_agboss import OutboundCallCompensatedError
from celery_agboss.core.executions import ExecutionRecord
from celery_agboss.core.protections import UNDO_TASK_READ_UNDONE_ON_PUBLISH
from celery_agboss.operator import list_failed_after_payment, list_waits, redrive
from celery_agboss.testing import sabotage
from celery_agboss.testing.gateway import FakeGatewayFault
from tests.delivery import later_click
from tests.delivery.conftest import PaymentShop, assert_waits_for_an_operator
from tests.delivery.later_click import ENDED, charge_unless_still_claimed, refund_task_execution
from tests.support.processes import wait_until

# A later click's wait for a claimed undo, shortened in every test here.
_short_wait_for_a_claimed_undo = later_click.short_wait_for_a_claimed_undo


class Orders:
    """``place_order(order, fail)`` charges the order under ``order:<order>``; asked to
    fail, it declares ``refund_payment.s(payment)`` (on a queue of this test's own,
    ``self.queue``, when ``queued``: the in-memory broker's queues are the process's, and a
    refund left there must never reach another test's worker) and fails. A click told the
    charge was compensated pays again under ``order:<order>:attempt:2`` only when told
    ``.undone`` (docs/undo.md), else it fails."""

    def __init__(self, shop: PaymentShop, *, queued: bool, refusable: bool = False) -> None:
        self.shop = shop
        self.told: list[OutboundCallCompensatedError] = []
        self.queue = f"refunds-{uuid.uuid4().hex[:8]}"
        queue = self.queue
        charge = shop.call()
        refund = shop.refund_call("shop.sig-refund", refusable=refusable)
        told = self.told

        refund_payment = shop.refund_task(refund)

        @shop.task()
        def place_order(self: Any, order: str, fail: bool = False) -> Any:
            receipt = charge_unless_still_claimed(self, charge, order, told)
            if fail:
                undo = refund_payment.s(receipt["id"])
                self.undo_with(undo.set(queue=queue) if queued else undo)
                raise LookupError("out of stock")
            return receipt

        self.place_order = place_order

    def refund_task(self, *states: str) -> ExecutionRecord:
        """The refund task's execution (in one of ``states``, when given), once recorded."""
        return refund_task_execution(self.shop, *states)

    def click(self, order: str) -> str:
        """A later click on ``order`` in the running worker, run to its end."""
        return self.shop.deliver(self.place_order, order, states=ENDED)


def _click_while_the_refund_is_queued(shop: PaymentShop) -> tuple[Orders, str, str]:
    """Order o-1 charged and failed; its refund task sits on its queue, which the worker
    does not consume, when a later click comes. The parent's and the click's ids."""
    orders = Orders(shop, queued=True)
    with shop.worker():
        parent = shop.deliver(orders.place_order, "o-1", True, states=("FAILED",))
        orders.refund_task()
        later = orders.click("o-1")
    return orders, parent, later


def test_a_later_click_never_pays_again_while_the_refund_task_is_queued(
    shop: PaymentShop,
) -> None:
    orders, parent, later = _click_while_the_refund_is_queued(shop)
    assert [exc.undone for exc in orders.told] == [False]
    assert orders.told[0].undo_by == parent
    assert shop.execution(later).state.value == "FAILED"
    assert len(shop.requests_of("charge")) == 1 and shop.gateway.refunds == []
    assert len(shop.gateway.payments) == 1
    # The refund task runs: the charge is undone, and a new click pays anew, once.
    with shop.worker(queues=[shop.app.conf.task_default_queue, orders.queue]):
        shop.wait_state(orders.refund_task().id, "COMPLETED")
        again = orders.click("o-1")
    assert shop.execution(again).state.value == "COMPLETED"
    assert [exc.undone for exc in orders.told] == [False, True]
    assert len(shop.gateway.payments) == 2 and len(shop.gateway.refunds) == 1
    assert list_failed_after_payment(shop.app) == [] and list_waits(shop.app) == []


@pytest.mark.parametrize("delivery_store_url", ["postgresql"], indirect=True)
def test_twin_read_undone_on_publish_a_queued_refund_leaves_two_charges(
    shop: PaymentShop,
) -> None:
    with sabotage(UNDO_TASK_READ_UNDONE_ON_PUBLISH):
        orders, _parent, later = _click_while_the_refund_is_queued(shop)
    assert [exc.undone for exc in orders.told] == [True]
    assert shop.execution(later).state.value == "COMPLETED"
    # The customer holds two charges, and the refund of the first has not run.
    assert len(shop.requests_of("charge")) == 2 and len(shop.gateway.payments) == 2
    assert shop.gateway.refunds == []


def test_a_later_click_never_pays_again_while_the_refund_task_waits_for_a_person(
    shop: PaymentShop,
) -> None:
    orders = Orders(shop, queued=False, refusable=True)
    shop.gateway.inject_fault(FakeGatewayFault.DECLINE, operation="refund")
    with shop.worker():
        parent = shop.deliver(orders.place_order, "o-2", True, states=("FAILED",))
        task = orders.refund_task("WAITING_OPERATOR", "FAILED", "COMPLETED")
        assert_waits_for_an_operator(task, f"undo shop.refund_payment of execution {parent}")
        later = orders.click("o-2")
        assert shop.execution(later).state.value == "FAILED"
        assert [exc.undone for exc in orders.told] == [False]
        assert len(shop.gateway.payments) == 1 and shop.gateway.refunds == []
        # The operator re-drives the refund task: refunded once, and read undone after it.
        assert redrive(shop.app, task.id, "balance topped up", actor="test")
        shop.wait_state(task.id, "COMPLETED")
        again = orders.click("o-2")
    assert shop.execution(again).state.value == "COMPLETED"
    assert [exc.undone for exc in orders.told] == [False, True]
    assert len(shop.gateway.payments) == 2 and len(shop.gateway.refunds) == 1


def test_a_cancel_whose_undo_is_a_task_ends_cancelled_and_refunds_once(
    shop: PaymentShop,
) -> None:
    """The parent is revoked after its charge: its undo publishes the refund task, and the
    cancel ends ``CANCELLED`` (the task carries the refund), not waiting for a person."""
    refund_payment = shop.refund_task(shop.refund_call("shop.sig-refund"))
    pay_and_revoke = shop.pay_revoked_after_its_charge(refund_payment.s)
    with shop.worker():
        task_id = pay_and_revoke("o-3")
        record = shop.wait_state(task_id, "CANCELLED", "WAITING_OPERATOR", "FAILED")
        wait_until(lambda: len(shop.gateway.refunds) == 1, 20, message="the refund task")
    assert record.state.value == "CANCELLED", record.reason
    assert len(shop.requests_of("charge")) == 1 and len(shop.requests_of("refund")) == 1
    assert len(shop.gateway.payments) == 1 and len(shop.gateway.refunds) == 1
    assert list_failed_after_payment(shop.app) == [] and list_waits(shop.app) == []
