"""Holes a second review found in the undo fixes of this release.

- A thread the body started may still call ``outbound()`` after the body failed and its
  undos started: it charged while they refunded, and that charge, made after the
  compensation's start mark, was counted as an undo's refund: FAILED, charged, listed
  nowhere. Once the compensation starts, the body's calls are refused.
- A later click on a step whose claimer's undo refunded and then raised was told
  "nothing was refunded yet": it is told the undo's outcome is not known there.
- A signature undo's task whose refund went through but whose result JSON cannot hold
  was shown as "undo … failed" (an operator may refund by hand again): it ends
  ``FAILED`` saying why, as any task.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from celery_agboss.core import state_machine
from celery_agboss.core.compensation import UndoStep
from celery_agboss.core.protections import BODY_CALLS_AFTER_COMPENSATION_START
from celery_agboss.errors import ConfigurationError
from celery_agboss.operator import list_failed_after_payment
from celery_agboss.task import undo_function
from celery_agboss.testing import sabotage
from tests.delivery.conftest import PaymentShop, assert_waits_for_an_operator
from tests.delivery.test_undo_review_fixes import later_click_shop
from tests.support.processes import wait_until


def split_pay_with_a_body_thread(
    shop: PaymentShop,
    *,
    undo_starts: Callable[[], None],
    card_b_starts: Callable[[], None] = lambda: None,
    body_raises: Callable[[], None] = lambda: None,
    thread_name: str | None = None,
) -> list[BaseException]:
    """Card A charged (its undo declared); the body starts card B in a thread and raises;
    card A's undo calls ``undo_starts``, waits for the thread, then refunds card A. The
    thread calls ``card_b_starts`` before charging, the body ``body_raises`` before it
    raises: the race each test stages. What the thread raised, if anything."""
    charge, refund = shop.call(), shop.refund_call()
    straggler_done = threading.Event()
    raised: list[BaseException] = []

    @undo_function(shop.app, "refund-charge")
    def refund_charge(task: Any, undo: UndoStep, payment: str) -> None:
        undo_starts()
        assert straggler_done.wait(15), "the body's thread"
        task.outbound(refund, {"payment": payment})

    @shop.task()
    def split_pay(self: Any, order: str) -> Any:
        receipt = self.outbound(charge, {"amount": 600}, business_key=f"order:{order}:card-a")
        self.undo_with("refund-charge", payment=receipt["id"])
        request = dict(vars(self.request))

        def card_b() -> None:  # a thread of the body, on the delivery's request
            self.push_request(request)
            try:
                card_b_starts()
                self.outbound(charge, {"amount": 400}, business_key=f"order:{order}:card-b")
            except BaseException as exc:
                raised.append(exc)
            finally:
                self.pop_request()
                straggler_done.set()

        threading.Thread(target=card_b, name=thread_name, daemon=True).start()
        body_raises()
        raise LookupError("card A's order line is out of stock")

    with shop.worker():
        shop.deliver(split_pay, "o-7", states=("FAILED", "WAITING_OPERATOR"))
    assert straggler_done.is_set()
    return raised


def _a_body_thread_charging_after_the_undo_started(shop: PaymentShop) -> list[BaseException]:
    """Card B is sent while card A's undo runs."""
    undo_running = threading.Event()

    def undo_has_started() -> None:
        assert undo_running.wait(15)

    return split_pay_with_a_body_thread(
        shop, undo_starts=undo_running.set, card_b_starts=undo_has_started
    )


def test_a_body_thread_sends_nothing_once_the_undo_started(shop: PaymentShop) -> None:
    raised = _a_body_thread_charging_after_the_undo_started(shop)
    assert [type(exc) for exc in raised] == [ConfigurationError], raised
    assert len(shop.gateway.payments) == 1 and len(shop.gateway.refunds) == 1
    assert list_failed_after_payment(shop.app) == []  # nothing left charged


@pytest.mark.parametrize("delivery_store_url", ["postgresql"], indirect=True)
def test_twin_a_body_thread_charges_while_the_undo_refunds_listed_nowhere(
    shop: PaymentShop,
) -> None:
    """PostgreSQL only: on SQLite the thread's charge and the undo's refund take turns at
    the one write lock, and on a loaded machine the harness's short lease (5 s: a 1.25 s
    bound on holding it) stops the delivery before the harm shows."""
    with sabotage(BODY_CALLS_AFTER_COMPENSATION_START):
        raised = _a_body_thread_charging_after_the_undo_started(shop)
        listed = list_failed_after_payment(shop.app)
    assert raised == []
    assert len(shop.gateway.payments) == 2 and len(shop.gateway.refunds) == 1
    assert listed == [], "card B's charge passed as an undo's refund"


def test_a_later_click_is_not_told_nothing_was_refunded(
    shop: PaymentShop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Speed-up: the later click meets the claimed step after the first execution ended, so
    no undo is in flight; its wait for one is 0.05 s, not 5 s (``COMPENSATION_WAIT_S``)."""
    monkeypatch.setattr(state_machine, "COMPENSATION_WAIT_S", 0.05)
    charge, refund = shop.call(), shop.refund_call()

    @undo_function(shop.app, "refund-then-notify")
    def refund_then_notify(task: Any, undo: UndoStep, payment: str) -> None:
        task.outbound(refund, {"payment": payment})
        raise RuntimeError("mail server down")  # after the refund went through

    place_order, told = later_click_shop(shop, charge, "refund-then-notify")

    with shop.worker():
        first = shop.deliver(place_order, "o-1", True, states=("FAILED", "WAITING_OPERATOR"))
        assert_waits_for_an_operator(shop.execution(first), "undo refund-then-notify failed")
        shop.deliver(place_order, "o-1", states=("COMPLETED", "FAILED", "WAITING_OPERATOR"))
    assert len(shop.gateway.refunds) == 1  # the first charge's refund went through
    [error] = told
    assert error.undone is False and error.undo_by == first
    assert "nothing was refunded" not in str(error)
    assert f"agboss show {first}" in str(error)


def test_an_undo_task_whose_refund_went_through_is_not_told_failed(shop: PaymentShop) -> None:
    refund = shop.refund_call("shop.sig-refund")

    class Receipt:  # what a body may return by mistake: not JSON
        pass

    @shop.task()
    def refund_payment(self: Any, payment: str) -> Any:
        self.outbound(refund, {"payment": payment}, business_key=f"refund:{payment}:1")
        return Receipt()

    place_order = shop.pay_failing_after_its_charge(refund_payment.s, "place_order")

    def ended() -> list[Any]:
        return [
            found
            for found in shop.agboss.executions.list_executions(None, limit=50)
            if found.task_name == "shop.refund_payment"
            and found.state.value in ("FAILED", "WAITING_OPERATOR", "COMPLETED")
        ]

    with shop.worker():
        shop.deliver(place_order, "o-9", states=("FAILED", "WAITING_OPERATOR"))
        wait_until(ended, 20, message="the undo task ended")
    [task] = ended()
    assert len(shop.gateway.refunds) == 1  # the refund went through
    assert task.state.value == "FAILED", (task.state, task.reason)
    assert "undo" not in (task.reason or "").lower(), task.reason
