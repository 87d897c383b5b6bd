"""Undo fixes from a review, in one Celery delivery, on both stores, counted at the gateway.

- An undo that reads the gateway first (docs/undo.md: the boundary) and, re-run after a
  crash between its refund and its done mark, finds the payment refunded and sends
  nothing: the refund its first run made is the undo's, never a payment the execution
  left behind (twin ``undo-intents-from-done-marks-only``).
- A later click on a step whose undo was claimed but not done (the refund refused) is
  never told the step was undone.
- ``undo_with()`` inside a fenced effect's ``fn`` is refused as ``outbound()`` is there.
- An undo declared as a signature whose task's refund is declined waits for a person
  (twin ``undo-task-failure-ends-failed``: the task ends ``FAILED``, nobody told).
"""

from __future__ import annotations

from typing import Any

import pytest

from celery_agboss import ConfigurationError, OutboundCallCompensatedError
from celery_agboss.core import state_machine
from celery_agboss.core.compensation import UndoStep
from celery_agboss.core.protections import (
    UNDO_INTENTS_FROM_DONE_MARKS_ONLY,
    UNDO_TASK_FAILURE_ENDS_FAILED,
)
from celery_agboss.operator import list_failed_after_payment, list_waits, redrive
from celery_agboss.task import undo_function
from celery_agboss.testing import sabotage
from celery_agboss.testing.gateway import FakeGatewayFault
from tests.delivery.conftest import PaymentShop, assert_waits_for_an_operator
from tests.engine.helpers import Crash
from tests.support.processes import wait_until

# --- an undo that reads the gateway first, re-run after a crash -----------------------------


def _read_first_undo(shop: PaymentShop, crashed: list[str]) -> None:
    """``refund-charge``: refunds unless the gateway shows the payment refunded; its
    first run dies after the refund, before its done mark."""
    refund = shop.refund_call()
    gateway = shop.gateway

    @undo_function(shop.app, "refund-charge")
    def refund_charge(task: Any, undo: UndoStep, payment: str) -> None:
        if any(found["payment"] == payment for found in gateway.refunds):
            return  # refunded already: nothing to send
        task.outbound(refund, {"payment": payment})
        if not crashed:
            crashed.append(undo.key)
            raise Crash()  # the worker dies after the refund, before the done mark


def _fail_after_a_crashed_undo(shop: PaymentShop, order: str) -> str:
    crashed: list[str] = []
    _read_first_undo(shop, crashed)

    pay = shop.pay_failing_after_its_charge("refund-charge")

    with shop.worker():
        task_id = str(pay.delay(order).id)
        wait_until(lambda: crashed, 10, message="the crash after the refund")
        shop.redrive_after_crash(task_id)
        shop.wait_state(task_id, "FAILED", "WAITING_OPERATOR")
    return task_id


def test_a_failure_whose_undo_found_its_refund_made_left_no_payment_behind(
    shop: PaymentShop,
) -> None:
    task_id = _fail_after_a_crashed_undo(shop, "o-1")
    assert shop.execution(task_id).state.value == "FAILED"
    assert len(shop.requests_of("charge")) == 1 and len(shop.requests_of("refund")) == 1
    assert len(shop.gateway.payments) == 1 and len(shop.gateway.refunds) == 1
    assert list_failed_after_payment(shop.app) == []


def test_twin_without_the_start_mark_the_refund_is_listed_as_a_payment(
    shop: PaymentShop,
) -> None:
    with sabotage(UNDO_INTENTS_FROM_DONE_MARKS_ONLY):
        task_id = _fail_after_a_crashed_undo(shop, "o-1")
        left = list_failed_after_payment(shop.app)
    assert len(shop.gateway.payments) == 1 and len(shop.gateway.refunds) == 1
    # The operator is told to refund at the gateway what is the refund itself.
    assert [entry.execution.id for entry in left] == [task_id]
    assert all("compensation" in key for key in left[0].intents), left
    assert "refund it at the gateway" in left[0].ends_with


def _cancel_after_a_crashed_undo(shop: PaymentShop, order: str) -> str:
    crashed: list[str] = []
    _read_first_undo(shop, crashed)
    pay_and_revoke = shop.pay_revoked_after_its_charge("refund-charge")
    with shop.worker():
        task_id = pay_and_revoke(order)
        wait_until(lambda: crashed, 10, message="the crash after the refund")
        shop.redrive_after_crash(task_id)
        shop.wait_state(task_id, "CANCELLED", "WAITING_OPERATOR", "FAILED")
    return task_id


def test_a_cancel_whose_undo_found_its_refund_made_ends_cancelled(shop: PaymentShop) -> None:
    task_id = _cancel_after_a_crashed_undo(shop, "o-2")
    record = shop.execution(task_id)
    assert record.state.value == "CANCELLED", record.reason
    assert len(shop.requests_of("charge")) == 1 and len(shop.requests_of("refund")) == 1
    assert len(shop.gateway.payments) == 1 and len(shop.gateway.refunds) == 1
    assert list_failed_after_payment(shop.app) == []


def test_twin_without_the_start_mark_the_refunded_cancel_waits_for_a_person(
    shop: PaymentShop,
) -> None:
    with sabotage(UNDO_INTENTS_FROM_DONE_MARKS_ONLY):
        task_id = _cancel_after_a_crashed_undo(shop, "o-2")
    assert len(shop.gateway.payments) == 1 and len(shop.gateway.refunds) == 1
    assert_waits_for_an_operator(shop.execution(task_id), "cancelled after a completed payment")


# --- a later click on a step whose undo's refund was refused --------------------------------


def later_click_shop(
    shop: PaymentShop, charge: Any, undo: str, *, undo_also_on_success: bool = False
) -> tuple[Any, list[OutboundCallCompensatedError]]:
    """``place_order(order, fail)``: charges the order, then, when asked to fail, declares
    the undo ``undo`` (on success too with ``undo_also_on_success``) and fails; a later
    click told the first charge was compensated charges again under the order's second
    attempt key. Returns the task and what later clicks were told."""
    told: list[OutboundCallCompensatedError] = []

    @shop.task()
    def place_order(self: Any, order: str, fail: bool = False) -> Any:
        request = {"amount": 1000, "order": order}
        try:
            receipt = self.outbound(charge, request, business_key=f"order:{order}")
        except OutboundCallCompensatedError as exc:
            told.append(exc)
            receipt = self.outbound(charge, request, business_key=f"order:{order}:attempt:2")
        if fail or undo_also_on_success:
            self.undo_with(undo, payment=receipt["id"])
        if fail:
            raise LookupError("out of stock")
        return receipt

    return place_order, told


def test_a_later_click_is_told_claimed_not_undone_while_the_refund_was_refused(
    shop: PaymentShop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A charges order o-1 and fails; its undo's refund is refused (a decline: no money
    moved), so A waits for an operator with the charge not refunded. A later click C on
    the same order is told the step was claimed for A's undo, not that it was refunded.

    Speed-up: C meets the claimed step after A ended, so no undo is in flight; its wait for
    one is 0.05 s, not 5 s (``COMPENSATION_WAIT_S``)."""
    monkeypatch.setattr(state_machine, "COMPENSATION_WAIT_S", 0.05)
    charge = shop.call()
    refund = shop.refund_call("shop.refusable-refund", refusable=True)

    shop.refund_undo(refund)

    place_order, told = later_click_shop(shop, charge, "refund-charge", undo_also_on_success=True)

    shop.gateway.inject_fault(FakeGatewayFault.DECLINE, operation="refund")
    with shop.worker():
        first = shop.deliver(place_order, "o-1", True, states=("FAILED", "WAITING_OPERATOR"))
        assert_waits_for_an_operator(shop.execution(first), "undo refund-charge failed")
        later = shop.deliver(place_order, "o-1", states=("COMPLETED", "FAILED", "WAITING_OPERATOR"))
    assert shop.execution(later).state.value == "COMPLETED"
    assert len(told) == 1
    message = str(told[0])
    assert "was undone" not in message and "refunded, released" not in message, message
    assert f"claimed for undo by execution {first}" in message, message
    assert told[0].undone is False and told[0].undo_by == first
    assert len(shop.gateway.payments) == 2 and shop.gateway.refunds == []
    # Re-driven by an operator, A's refund goes out, once.
    with shop.worker():
        assert redrive(shop.app, first, "balance topped up", actor="test")
        shop.wait_state(first, "FAILED", timeout=20)
    assert len(shop.gateway.refunds) == 1 and len(shop.gateway.payments) == 2


# --- undo_with() inside a fenced effect's fn ---------------------------------------------------


def test_undo_with_inside_a_fenced_effect_fn_is_refused(shop: PaymentShop) -> None:
    """Refused as outbound() is there (a ConfigurationError the body lets through fails
    it, and its charge is refunded), never left to stall on the store's lock."""
    charge, refund = shop.call(), shop.refund_call()

    shop.refund_undo(refund)

    @undo_function(shop.app, "unreserve")
    def unreserve(task: Any, undo: UndoStep) -> None:
        raise AssertionError("an undo declared inside a fenced effect's fn never runs")

    refused: list[ConfigurationError] = []

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        receipt = self.outbound(charge, {"amount": 1000}, business_key=f"order:{order}")
        self.undo_with("refund-charge", payment=receipt["id"])

        def reserve(conn: Any) -> str:
            try:
                self.undo_with("unreserve")
            except ConfigurationError as exc:
                refused.append(exc)
                raise
            return "ok"

        self.fenced_effect("reserve", reserve)
        return receipt

    with shop.worker():
        task_id = shop.deliver(pay, "o-2", states=("FAILED", "WAITING_OPERATOR", "COMPLETED"))
    record = shop.execution(task_id)
    assert record.state.value == "FAILED", record.reason
    assert record.deliveries == 1
    assert len(refused) == 1 and "undo_with() inside a fenced effect's fn" in str(refused[0])
    assert len(shop.requests_of("charge")) == 1 and len(shop.requests_of("refund")) == 1
    assert len(shop.gateway.refunds) == 1


# --- an undo declared as a signature whose task fails -------------------------------------


def _signature_undo_refused(shop: PaymentShop) -> str:
    """``place_order`` charges, declares ``refund_payment.s(payment)`` and fails; the
    gateway declines the refund task's refund (definitively: nothing moved). The parent's
    id."""
    refund = shop.refund_call("shop.sig-refund", refusable=True)

    @shop.task()
    def refund_payment(self: Any, payment: str) -> Any:
        return self.outbound(refund, {"payment": payment}, business_key=f"refund:{payment}:1")

    place_order = shop.pay_failing_after_its_charge(refund_payment.s, "place_order")

    shop.gateway.inject_fault(FakeGatewayFault.DECLINE, operation="refund")
    with shop.worker():
        parent = shop.deliver(place_order, "o-9", states=("FAILED", "WAITING_OPERATOR"))
        wait_until(
            lambda: _refund_tasks(shop, "FAILED", "WAITING_OPERATOR"),
            20,
            message="the refund task to end",
        )
    return parent


def _refund_tasks(shop: PaymentShop, *states: str) -> list[Any]:
    return [
        found
        for found in shop.agboss.executions.list_executions(None, limit=50)
        if found.task_name == "shop.refund_payment" and found.state.value in states
    ]


def test_a_signature_undo_whose_refund_is_declined_waits_for_a_person(shop: PaymentShop) -> None:
    parent = _signature_undo_refused(shop)
    assert shop.execution(parent).state.value == "FAILED"
    assert len(shop.requests_of("charge")) == 1 and len(shop.requests_of("refund")) == 1
    assert len(shop.gateway.payments) == 1 and shop.gateway.refunds == []
    [task] = _refund_tasks(shop, "WAITING_OPERATOR")
    assert_waits_for_an_operator(task, f"undo shop.refund_payment of execution {parent} failed")
    assert [wait.execution.id for wait in list_waits(shop.app)] == [task.id]
    # Re-driven by an operator, the declined refund is sent again under its key: once.
    with shop.worker():
        assert redrive(shop.app, task.id, "balance topped up", actor="test")
        shop.wait_state(task.id, "COMPLETED", timeout=20)
    assert len(shop.gateway.refunds) == 1 and len(shop.gateway.payments) == 1


def test_twin_a_failed_undo_task_ends_failed_shown_to_nobody(
    shop: PaymentShop,
) -> None:
    with sabotage(UNDO_TASK_FAILURE_ENDS_FAILED):
        parent = _signature_undo_refused(shop)
    assert shop.execution(parent).state.value == "FAILED"
    assert len(shop.gateway.payments) == 1 and shop.gateway.refunds == []
    assert [task.state.value for task in _refund_tasks(shop, "FAILED", "WAITING_OPERATOR")] == [
        "FAILED"
    ]
    assert list_waits(shop.app) == [] and list_failed_after_payment(shop.app) == []
