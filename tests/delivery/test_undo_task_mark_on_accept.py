"""``agboss accept`` of an undo's task that diverged finishes its undo, as a body that
returned does: the charge it refunded reads undone, on both stores, counted at the
gateway.

The refund task is guarded the way applications write it ("refunded already? return"):
its refund is made but the answer is lost, so its re-run finds the refund at the gateway
and returns without reaching the call, a divergence that waits for an operator. The
operator checks the gateway and accepts: the refund made is the outcome accepted, so a
later click on the order is told the charge was undone and pays anew, once (twin
``undo-task-accept-writes-no-mark``: the task is ``COMPLETED`` without the mark, the charge
reads claimed for ever, and every later click fails with nothing listed for a person).
"""

from __future__ import annotations

from typing import Any

from celery_agboss import OutboundCallCompensatedError
from celery_agboss.core.executions import DIVERGENCE, ExecutionRecord
from celery_agboss.core.protections import UNDO_TASK_ACCEPT_WRITES_NO_MARK
from celery_agboss.operator import accept, list_failed_after_payment, list_waits
from celery_agboss.testing import sabotage
from celery_agboss.testing.gateway import FakeGatewayFault
from tests.delivery import later_click
from tests.delivery.conftest import PaymentShop, assert_waits_for_an_operator
from tests.delivery.later_click import ENDED, charge_unless_still_claimed, refund_task_execution

# A later click's wait for a claimed undo, shortened in every test here.
_short_wait_for_a_claimed_undo = later_click.short_wait_for_a_claimed_undo


class GuardedRefunds:
    """``place_order(order, fail)`` charges the order under ``order:<order>``; asked to
    fail, it declares ``refund_payment.s(payment)`` and fails. ``refund_payment`` returns
    at once when the gateway shows a refund of the payment. A click told the charge was
    compensated pays again under ``order:<order>:attempt:2`` only when told ``.undone``."""

    def __init__(self, shop: PaymentShop) -> None:
        self.shop = shop
        self.told: list[OutboundCallCompensatedError] = []
        charge = shop.call()
        refund = shop.refund_call("shop.sig-refund")
        told, gateway = self.told, shop.gateway

        @shop.task()
        def refund_payment(self: Any, payment: str) -> Any:
            if any(r["payment"] == payment for r in gateway.refunds):
                return {"refunded": "already"}  # the application's own guard
            return self.outbound(refund, {"payment": payment}, business_key=f"refund:{payment}")

        @shop.task()
        def place_order(self: Any, order: str, fail: bool = False) -> Any:
            receipt = charge_unless_still_claimed(self, charge, order, told)
            if fail:
                self.undo_with(refund_payment.s(receipt["id"]))
                raise LookupError("out of stock")
            return receipt

        self.place_order = place_order

    def refund_task(self, *states: str) -> ExecutionRecord:
        """The refund task's execution, once in one of ``states``."""
        return refund_task_execution(self.shop, *states, timeout=30)


def _refund_task_accepted(shop: PaymentShop) -> tuple[GuardedRefunds, str, str]:
    """Order o-1 charged and failed; its refund task refunds, loses the answer, diverges
    on its re-run and waits; the sweep looks the refund up (made), the operator accepts,
    and a click comes. The parent's and the click's ids."""
    orders = GuardedRefunds(shop)
    shop.gateway.inject_fault(FakeGatewayFault.ANSWER_THEN_DROP, operation="refund")
    with shop.worker():
        parent = shop.deliver(orders.place_order, "o-1", True, states=("FAILED",))
        task = orders.refund_task("WAITING_OPERATOR", "COMPLETED", "FAILED")
        assert_waits_for_an_operator(task, DIVERGENCE, "shop.sig-refund")
        shop.sweep()  # the refund's intent, pending, is looked up: made
        assert accept(shop.app, task.id, "the gateway shows the refund made", actor="test")
        shop.wait_state(task.id, "COMPLETED")
        later = shop.deliver(orders.place_order, "o-1", states=ENDED)
    return orders, parent, later


def test_an_accepted_refund_task_reads_its_charge_undone(shop: PaymentShop) -> None:
    orders, _parent, later = _refund_task_accepted(shop)
    assert shop.execution(later).state.value == "COMPLETED"
    assert [exc.undone for exc in orders.told] == [True]
    assert len(shop.gateway.payments) == 2 and len(shop.gateway.refunds) == 1
    assert list_failed_after_payment(shop.app) == [] and list_waits(shop.app) == []


def test_twin_accept_writes_no_mark_and_the_order_is_stuck(shop: PaymentShop) -> None:
    with sabotage(UNDO_TASK_ACCEPT_WRITES_NO_MARK):
        orders, parent, later = _refund_task_accepted(shop)
    # Refunded once, yet every later click is told "claimed for undo" and fails, unlisted.
    assert shop.execution(later).state.value == "FAILED"
    assert [(exc.undone, exc.undo_by) for exc in orders.told] == [(False, parent)]
    assert len(shop.gateway.payments) == 1 and len(shop.gateway.refunds) == 1
    assert list_failed_after_payment(shop.app) == [] and list_waits(shop.app) == []
