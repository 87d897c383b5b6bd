"""A charge undone by two undos, a function and a task (an undo declared as a Celery
signature), reads undone once both finished, whichever finishes last, in Celery
deliveries, counted at the gateway; and what a later click on the order is told.

- Both finish at the same moment (PostgreSQL): the parent's last undo and the refund
  task's ``COMPLETED`` each write their mark, then judge the step from both marks.
  Judged one after the other (the record's row lock), the second sees the first's mark:
  a later click is told undone and pays anew, once (twin ``undo-marks-read-unlocked``:
  each misses the other's uncommitted mark, the record stays claimed, and every later
  click fails with nothing listed for a person).
- The parent's function undo waits for a person past the retentions while the refund
  task completed: the task's mark is kept for the parent, which finishes its undo when
  re-driven, and the click pays anew (twin ``undo-task-mark-not-kept``: retention took
  the mark with the task's records, and the order can never be paid again).

Speed-up: the virtual clock moves the database past the 7-day retentions.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from typing import Any

import pytest

from celery_agboss import OutboundCallCompensatedError
from celery_agboss.core.compensation import UndoStep
from celery_agboss.core.executions import ExecutionRecord
from celery_agboss.core.fault_points import FENCED_BEFORE_COMMIT, UNDO_BEFORE_COMPENSATED
from celery_agboss.core.protections import UNDO_MARKS_READ_UNLOCKED, UNDO_TASK_MARK_NOT_KEPT
from celery_agboss.operator import list_failed_after_payment, list_waits, redrive
from celery_agboss.task import undo_function
from celery_agboss.testing import arm_fault, disarm_all, sabotage
from tests.delivery import later_click
from tests.delivery.conftest import PaymentShop, assert_waits_for_an_operator
from tests.delivery.later_click import ENDED, charge_unless_still_claimed, refund_task_execution

# A later click's wait for a claimed undo, shortened in every test here.
_short_wait_for_a_claimed_undo = later_click.short_wait_for_a_claimed_undo

PAST_RETENTION = 8 * 24 * 3600  # seconds: past the 7-day defaults of every retention
RELEASE = "release-stock"


class TwoUndos:
    """``place_order(order, fail)`` charges the order under ``order:<order>``; asked to
    fail, it declares ``release-stock`` (a function undo, refused while ``stock_up`` is
    clear) and then ``refund_payment.s(payment)`` after the charge, and fails: the undos
    run last declared first, so the refund task is published, then the stock released.
    A click told the charge was compensated pays again under ``order:<order>:attempt:2``
    only when told ``.undone`` (docs/undo.md), else it fails."""

    def __init__(self, shop: PaymentShop) -> None:
        self.shop = shop
        self.told: list[OutboundCallCompensatedError] = []
        self.stock_up = threading.Event()
        self.stock_up.set()
        self.parent_thread: list[int] = []  # the failing parent's delivery thread
        self.queue = f"refunds-{uuid.uuid4().hex[:8]}"  # never another test's worker's
        charge = shop.call()
        refund = shop.refund_call("shop.sig-refund")
        told, stock_up, parent_thread, queue = (
            self.told,
            self.stock_up,
            self.parent_thread,
            self.queue,
        )

        @undo_function(shop.app, RELEASE)
        def release_stock(task: Any, undo: UndoStep, order: str) -> None:
            if not stock_up.is_set():
                raise ConnectionError("the stock service is down")
            task.fenced_effect("release-stock", lambda conn: None)

        refund_payment = shop.refund_task(refund)

        @shop.task()
        def place_order(self: Any, order: str, fail: bool = False) -> Any:
            receipt = charge_unless_still_claimed(self, charge, order, told)
            if fail:
                parent_thread[:] = [threading.get_ident()]
                self.undo_with(RELEASE, order=order)
                self.undo_with(refund_payment.s(receipt["id"]).set(queue=queue))
                raise LookupError("out of stock")
            return receipt

        self.place_order = place_order

    def refund_task(self) -> ExecutionRecord:
        """The refund task's execution, once recorded."""
        return refund_task_execution(self.shop)

    def click(self, order: str) -> str:
        """A later click on ``order`` in the running worker, run to its end."""
        return self.shop.deliver(self.place_order, order, states=ENDED)

    def queues(self) -> list[str]:
        return [self.shop.app.conf.task_default_queue, self.queue]


def _assert_paid_anew_once(shop: PaymentShop, orders: TwoUndos, again: str) -> None:
    assert shop.execution(again).state.value == "COMPLETED"
    assert [exc.undone for exc in orders.told] == [True]
    assert len(shop.gateway.payments) == 2 and len(shop.gateway.refunds) == 1
    assert list_failed_after_payment(shop.app) == [] and list_waits(shop.app) == []


def _assert_claimed_for_ever(shop: PaymentShop, orders: TwoUndos, again: str, parent: str) -> None:
    """The refund was made once, yet the click is told "claimed for undo" and fails, and no
    listing names the order: the customer can never pay for it again, nobody told."""
    assert shop.execution(again).state.value == "FAILED"
    assert [(exc.undone, exc.undo_by) for exc in orders.told] == [(False, parent)]
    assert len(shop.gateway.payments) == 1 and len(shop.gateway.refunds) == 1
    assert list_failed_after_payment(shop.app) == [] and list_waits(shop.app) == []


# --- both undos finish at once -------------------------------------------------------------


@contextmanager
def _both_finish_at_once(orders: TwoUndos) -> Iterator[None]:
    """The parent's ``release-stock`` and the refund task's ``COMPLETED``, each with its
    mark written, meet before judging the step (neither committed), and once they judged,
    meet again before committing, for 0.5 s at most: a judge held back by the other's row
    lock gets there only once the other committed, and must not wait for it."""
    meet, commit = threading.Barrier(2, timeout=15), threading.Barrier(2, timeout=0.5)
    racing = threading.local()

    def judging(context: Mapping[str, object]) -> None:
        parent = threading.get_ident() in orders.parent_thread
        if parent and context.get("undo") != RELEASE:
            return  # the parent's publish of the task: judged before the task ran
        meet.wait()
        racing.on = True

    def committing(context: Mapping[str, object]) -> None:
        if getattr(racing, "on", False):
            racing.on = False
            # Broken: the other committed first (it held the row), nothing to wait for.
            with suppress(threading.BrokenBarrierError):
                commit.wait()

    arm_fault(UNDO_BEFORE_COMPENSATED, judging, times=3)
    arm_fault(FENCED_BEFORE_COMMIT, committing, times=10_000)
    try:
        yield
    finally:
        disarm_all()


def _both_undos_finish_at_once(shop: PaymentShop) -> tuple[TwoUndos, str, str]:
    orders = TwoUndos(shop)
    with _both_finish_at_once(orders), shop.worker(queues=orders.queues()):
        parent = shop.deliver(orders.place_order, "o-1", True, states=ENDED)
        shop.wait_state(orders.refund_task().id, "COMPLETED")
        assert shop.execution(parent).state.value == "FAILED", shop.execution(parent).reason
        later = orders.click("o-1")
    return orders, parent, later


@pytest.mark.parametrize("delivery_store_url", ["postgresql"], indirect=True)
def test_a_charge_reads_undone_when_both_its_undos_finish_at_once(shop: PaymentShop) -> None:
    orders, _parent, later = _both_undos_finish_at_once(shop)
    _assert_paid_anew_once(shop, orders, later)


@pytest.mark.parametrize("delivery_store_url", ["postgresql"], indirect=True)
def test_twin_marks_read_unlocked_both_miss_and_the_order_is_stuck(shop: PaymentShop) -> None:
    with sabotage(UNDO_MARKS_READ_UNLOCKED):
        orders, parent, later = _both_undos_finish_at_once(shop)
    _assert_claimed_for_ever(shop, orders, later, parent)


# --- the parent finishes its undo past the retentions ----------------------------------------


def _parent_finishes_after_retention(shop: PaymentShop) -> tuple[TwoUndos, str, str]:
    """The stock service is down: the refund task completes, the parent waits for a person
    with ``release-stock`` not done. Eight days pass (a sweep runs retention); the service
    is back, the operator re-drives the parent, and a click comes."""
    orders = TwoUndos(shop)
    orders.stock_up.clear()
    with shop.worker(queues=orders.queues()):
        parent = shop.deliver(orders.place_order, "o-2", True, states=ENDED)
        task = orders.refund_task()
        shop.wait_state(task.id, "COMPLETED")
        assert_waits_for_an_operator(shop.execution(parent), f"undo {RELEASE} failed")
        shop.clock.advance(PAST_RETENTION)
        shop.sweep()
        assert shop.intents(task.id) == [], "retention went on with the task's records"
        orders.stock_up.set()
        assert redrive(shop.app, parent, "the stock service is back", actor="test")
        shop.wait_state(parent, "FAILED")
        later = orders.click("o-2")
    return orders, parent, later


def test_a_charge_reads_undone_when_its_parent_finishes_after_retention(
    shop: PaymentShop,
) -> None:
    orders, _parent, later = _parent_finishes_after_retention(shop)
    _assert_paid_anew_once(shop, orders, later)


def test_twin_mark_not_kept_retention_takes_it_and_the_order_is_stuck(shop: PaymentShop) -> None:
    with sabotage(UNDO_TASK_MARK_NOT_KEPT):
        orders, parent, later = _parent_finishes_after_retention(shop)
    _assert_claimed_for_ever(shop, orders, later, parent)
