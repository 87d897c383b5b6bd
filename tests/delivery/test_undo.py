"""Undo once in a delivery (DESIGN §2.1–§2.2): what starts the undos, and how they end.

A worker in a thread of this process (tests/delivery/conftest.py). Only an application
exception with every intent settled, or a cancel after the charge, runs the declared
undos — inside the delivery, under its lease — then the execution ends ``FAILED`` (the
original failure) or ``CANCELLED``; an unknown outcome never does (P5). An undo that
raises leaves the execution waiting for an operator.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest

from celery_agboss.core.compensation import UndoStep
from celery_agboss.core.executions import CANCELLED_AFTER_PAYMENT
from celery_agboss.core.outbound import CallContext, Completed, Lookup, NotSent, OutboundCall
from celery_agboss.operator import cancel
from celery_agboss.task import undo_function
from celery_agboss.testing.gateway import FakeGatewayFault
from tests.delivery.conftest import PaymentShop
from tests.support.processes import wait_until

sqlite_only = pytest.mark.parametrize("delivery_store_url", ["sqlite"], indirect=True)
"""The store's part is the engine suite's (both stores); these check the delivery's."""


def _refund_call(shop: PaymentShop) -> OutboundCall:
    gateway = shop.gateway

    def send(call: CallContext) -> Any:
        return gateway.refund(call.request["payment"], call.idempotency_key)

    def reconcile(call: CallContext, lookup: Lookup) -> Any:
        found = gateway.lookup(lookup.idempotency_key)
        return NotSent() if found is None else Completed(found)

    made = OutboundCall(
        name="shop.refund", send=send, reconcile=reconcile, key_retention=timedelta(hours=24)
    )
    shop.agboss.register(made)
    return made


def _refund_undo(shop: PaymentShop, seen: list[UndoStep]) -> None:
    refund = _refund_call(shop)

    @undo_function(shop.app, "refund-charge")
    def refund_charge(task: Any, undo: UndoStep, payment: str) -> None:
        seen.append(undo)
        task.outbound(refund, {"payment": payment})  # keyed <step key>:compensation


def test_a_failure_after_the_charge_runs_the_undo_then_fails(shop: PaymentShop) -> None:
    charge = shop.call()
    seen: list[UndoStep] = []
    _refund_undo(shop, seen)

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        receipt = self.outbound(charge, {"amount": 1000}, business_key=f"order:{order}")
        self.undo_with("refund-charge", payment=receipt["id"])
        raise LookupError(f"order {order} is out of stock")

    with shop.worker():
        result = pay.delay("o-1")
        record = shop.wait_state(result.id, "FAILED")
        with pytest.raises(LookupError, match="out of stock"):
            result.get(timeout=10)
    assert [undo.cause for undo in seen] == ["failure"]
    [payment] = shop.gateway.payments
    assert [r["payment"] for r in shop.gateway.refunds] == [payment["id"]]
    assert record.reason == "LookupError" and "out of stock" in (record.error or "")


@sqlite_only
def test_an_unknown_outcome_after_the_charge_never_starts_undo(shop: PaymentShop) -> None:
    """P5: the second call's answer is lost; the retry reconciles it and completes."""
    charge = shop.call()
    seen: list[UndoStep] = []
    _refund_undo(shop, seen)

    faulted: list[str] = []

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        receipt = self.outbound(charge, {"amount": 1000}, business_key=f"order:{order}")
        self.undo_with("refund-charge", payment=receipt["id"])
        if not faulted:  # the fee's answer is lost on the first delivery only
            faulted.append(self.request.id)
            shop.gateway.inject_fault(FakeGatewayFault.ANSWER_THEN_DROP, operation="charge")
        return self.outbound(charge, {"amount": 50}, business_key=f"order:{order}:fee")

    with shop.worker():
        task_id = str(pay.delay("o-2").id)
        record = shop.wait_state(task_id, "COMPLETED")
    assert record.deliveries == 2, "the unknown outcome was retried, not failed"
    assert seen == [] and shop.gateway.refunds == []
    assert len(shop.gateway.payments) == 2


@sqlite_only
def test_a_revoke_after_the_charge_runs_the_undo_then_cancels(shop: PaymentShop) -> None:
    charge = shop.call()
    seen: list[UndoStep] = []
    _refund_undo(shop, seen)
    charged, go_on = threading.Event(), threading.Event()

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        receipt = self.outbound(charge, {"amount": 1000}, business_key=f"order:{order}")
        self.undo_with("refund-charge", payment=receipt["id"])
        charged.set()
        assert go_on.wait(20)
        self.fenced_effect("mark-paid", lambda conn: None)  # stops here: the cancel
        return receipt

    with shop.worker():
        task_id = str(pay.delay("o-3").id)
        assert charged.wait(20)
        shop.app.control.revoke(task_id)
        wait_until(lambda: shop.execution(task_id).cancel_requested, 10, message="the revoke")
        go_on.set()
        record = shop.wait_state(task_id, "CANCELLED", "WAITING_OPERATOR", "FAILED")
    assert record.state.value == "CANCELLED", record.reason
    assert [undo.cause for undo in seen] == ["cancel"]
    assert len(shop.gateway.refunds) == 1


@sqlite_only
def test_a_cancel_of_a_waiting_execution_runs_its_undo_in_a_delivery(shop: PaymentShop) -> None:
    """An operator's cancel of an execution that waits (here for a long retry): it is
    handed to a delivery (the sweep re-drives it), which undoes the charge, then cancels."""
    charge = shop.call()
    seen: list[UndoStep] = []
    _refund_undo(shop, seen)

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        receipt = self.outbound(charge, {"amount": 1000}, business_key=f"order:{order}")
        self.undo_with("refund-charge", payment=receipt["id"])
        raise self.retry(countdown=3600)  # waits in the store, not in the broker

    with shop.worker():
        task_id = str(pay.delay("o-4").id)
        shop.wait_state(task_id, "WAITING")
        moved = cancel(shop.app, task_id, "the customer changed their mind")
        assert moved.state.value == "COMPENSATING"
        shop.sweep()
        record = shop.wait_state(task_id, "CANCELLED", "WAITING_OPERATOR")
    assert record.state.value == "CANCELLED", record.reason
    assert len(shop.gateway.refunds) == 1 and [u.cause for u in seen] == ["cancel"]


@sqlite_only
def test_without_an_undo_a_cancel_after_the_charge_still_waits_for_an_operator(
    shop: PaymentShop,
) -> None:
    charge = shop.call()

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        self.outbound(charge, {"amount": 1000}, business_key=f"order:{order}")
        raise self.retry(countdown=3600)

    with shop.worker():
        task_id = str(pay.delay("o-5").id)
        shop.wait_state(task_id, "WAITING")
        moved = cancel(shop.app, task_id, "changed their mind")
    assert moved.state.value == "WAITING_OPERATOR"
    assert (moved.reason or "").startswith(CANCELLED_AFTER_PAYMENT)


@sqlite_only
def test_an_undo_that_raises_waits_for_an_operator(shop: PaymentShop) -> None:
    charge = shop.call()

    @undo_function(shop.app, "refund-charge")
    def refund_charge(task: Any, undo: UndoStep, payment: str) -> None:
        raise RuntimeError("the refund API is down for maintenance")

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        receipt = self.outbound(charge, {"amount": 1000}, business_key=f"order:{order}")
        self.undo_with("refund-charge", payment=receipt["id"])
        raise LookupError("out of stock")

    with shop.worker():
        task_id = str(pay.delay("o-6").id)
        record = shop.wait_state(task_id, "WAITING_OPERATOR", "FAILED")
    assert record.state.value == "WAITING_OPERATOR"
    assert (record.reason or "").startswith("undo refund-charge failed: RuntimeError")
