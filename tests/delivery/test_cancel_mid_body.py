"""A cancel request (design: cancel request) recorded while the body runs stops it at its next
``outbound()`` or ``fenced_effect()``, which sends and writes nothing; the execution ends
``CANCELLED`` — unless a money-moving call of it already completed: then it never ends
silently cancelled but waits for an operator, listed with the command that ends it.
A resend after a lookup's ``NotSent`` reads the cancel request in the transaction that
claims it (twin ``cancel-checked-apart-from-resend``: a cancel recorded between a check
of its own and the claim is followed by the charge).

The revoke is ``app.control.revoke(id)`` without ``terminate`` (the body keeps running:
Celery itself does not stop it), recorded in the store by ``AGBoss``'s revoke recorder.

A 20 s lease here rather than the world's 5 s: the redelivery that recovers a write
cut by SQLite's watchdog (at a quarter of the lease, so 1.25 s on a loaded machine) is
a revoked id, which the worker discards; the in-process world has no sweep to finish
it, so these tests need their writes not to be cut.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest

from celery_agboss import Completed, NotSent, OutboundCall
from celery_agboss.core.executions import CANCELLED_AFTER_PAYMENT
from celery_agboss.core.outbound import CallContext
from celery_agboss.core.protections import (
    CANCEL_CHECKED_APART_FROM_RESEND,
    CANCEL_NOT_CHECKED_MID_BODY,
)
from celery_agboss.operator import cancel, list_waits
from celery_agboss.testing.fault_arming import RECONCILE_BEFORE_RESEND, arm_fault
from celery_agboss.testing.gateway_types import is_definite_failure
from celery_agboss.testing.switches import sabotage
from tests.delivery.conftest import PaymentShop, assert_waits_for_an_operator


@pytest.fixture
def shop_config() -> dict[str, Any]:
    return {"agboss_lease_ttl": 20}


def _revoked_before_the_charge(shop: PaymentShop) -> str:
    """The body does a step, waits there while the revoke is recorded, then charges."""
    charge = shop.call()
    at_the_step, go_on = threading.Event(), threading.Event()

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        at_the_step.set()  # e.g. a fraud check before the charge
        assert go_on.wait(20)
        return self.outbound(
            charge, {"amount": 1000, "order": order}, business_key=f"order:{order}"
        )

    with shop.worker():
        task_id = str(pay.delay("o-1").id)
        shop.revoke_at(task_id, at_the_step, go_on)
        shop.wait_state(task_id, "CANCELLED", "COMPLETED")
    return task_id


def test_a_revoke_while_the_body_runs_stops_it_before_the_charge(shop: PaymentShop) -> None:
    task_id = _revoked_before_the_charge(shop)
    assert shop.execution(task_id).state.value == "CANCELLED"
    assert shop.gateway.requests == [], "nothing sent after the cancel was recorded"
    assert shop.intents(task_id) == []


def test_without_the_check_a_revoked_body_still_charges(shop: PaymentShop) -> None:
    with sabotage(CANCEL_NOT_CHECKED_MID_BODY):
        task_id = _revoked_before_the_charge(shop)
    assert shop.execution(task_id).state.value == "COMPLETED"
    assert len(shop.gateway.payments) == 1, "a revoked order paid"


def test_a_revoke_after_the_charge_waits_for_an_operator_never_silently_cancelled(
    shop: PaymentShop,
) -> None:
    charge = shop.call()
    charged, go_on = threading.Event(), threading.Event()
    written: list[str] = []

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        receipt = self.outbound(
            charge, {"amount": 1000, "order": order}, business_key=f"order:{order}"
        )
        charged.set()
        assert go_on.wait(20)
        self.fenced_effect("mark-paid", lambda conn: written.append(order))
        return receipt

    with shop.worker():
        task_id = str(pay.delay("o-2").id)
        shop.revoke_at(task_id, charged, go_on)
        record = shop.wait_state(task_id, "WAITING_OPERATOR", "CANCELLED", "COMPLETED")
    assert_waits_for_an_operator(record, CANCELLED_AFTER_PAYMENT)
    assert written == [], "the fenced effect after the cancel wrote nothing"
    assert len(shop.gateway.payments) == 1
    (wait,) = [w for w in list_waits(shop.app) if w.execution.id == task_id]
    assert f"cancel {task_id} --payments-handled" in wait.ends_with
    # Without the operator's word the cancel stays a visible wait; with it, it ends.
    assert cancel(shop.app, task_id, "checking").state.value == "WAITING_OPERATOR"
    ended = cancel(shop.app, task_id, "refunded at the gateway", payments_handled=True)
    assert ended.state.value == "CANCELLED"
    assert shop.sweep().cancelled == 0  # nothing for the sweep to redo


def _cancel_recorded_as_a_resend_is_claimed(shop: PaymentShop) -> str:
    """The first send fails before the gateway read it (an unknown outcome); the next
    delivery's lookup says ``NotSent``, and a cancel is recorded just before the resend
    is claimed."""
    gateway = shop.gateway
    sends: list[str] = []

    def send(call: CallContext) -> Any:
        sends.append(call.idempotency_key)
        if len(sends) == 1:
            raise ConnectionError("connection reset before the gateway read the request")
        return gateway.charge(call.request["amount"], call.idempotency_key)

    charge = OutboundCall(
        name="shop.flaky_charge",
        send=send,
        reconcile=lambda call, lookup: (
            NotSent()
            if (found := gateway.lookup(lookup.idempotency_key)) is None
            else Completed(found)
        ),
        key_retention=timedelta(hours=24),
        is_definite_failure=is_definite_failure,
        lookup_proves_absence=True,  # the cancel may settle the unsent intent FAILED
    )
    shop.agboss.register(charge)
    task_ids: list[str] = []
    arm_fault(
        RECONCILE_BEFORE_RESEND,
        lambda _: shop.agboss.executions.request_cancel(task_ids[0], "customer asked"),
    )

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        return self.outbound(charge, {"amount": 1000}, business_key=f"order:{order}")

    with shop.worker():
        task_ids.append(str(pay.delay("o-3").id))
        shop.wait_state(task_ids[0], "CANCELLED", "WAITING_OPERATOR", "COMPLETED")
    assert len(sends) >= 1
    return task_ids[0]


def test_a_cancel_recorded_before_a_resend_is_claimed_stops_the_resend(
    shop: PaymentShop,
) -> None:
    task_id = _cancel_recorded_as_a_resend_is_claimed(shop)
    assert shop.execution(task_id).state.value == "CANCELLED"
    assert shop.gateway.payments == [], "nothing charged after the cancel"


def test_with_the_cancel_checked_apart_the_resend_charges_a_cancelled_order(
    shop: PaymentShop,
) -> None:
    with sabotage(CANCEL_CHECKED_APART_FROM_RESEND):
        task_id = _cancel_recorded_as_a_resend_is_claimed(shop)
    assert shop.execution(task_id).state.value != "CANCELLED"
    assert len(shop.gateway.payments) == 1, "charged after the cancel was recorded"
