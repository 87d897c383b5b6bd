"""Undo once in a delivery (design: undo once, what fails an execution): what starts the
undos, and how they end.

A worker in a thread of this process (tests/delivery/conftest.py). Only an application
exception with every intent settled, or a cancel after the charge, runs the declared
undos — inside the delivery, under its lease — then the execution ends ``FAILED`` (the
original failure) or ``CANCELLED``; an unknown outcome never does (design: P5). An undo that
raises leaves the execution waiting for an operator.

An undo declared as a Celery signature is published once, under a task id derived from
its step's key, through the outbox: a crash right before or right after its publish,
then the redelivery (the crashed lease expired on the virtual clock, the sweep's
re-drive) still runs its ``PaymentTask`` once — one refund. The twin publishes it
straight from the undo, under a new id each time: two refunds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from celery import chain
from celery import signals as celery_signals
from celery.utils.dispatch import Signal

from celery_agboss.core.compensation import UndoStep
from celery_agboss.core.executions import CANCELLED_AFTER_PAYMENT
from celery_agboss.core.log_events import EXECUTION_COMPENSATING, UNDO_DONE
from celery_agboss.core.outbound import CallContext
from celery_agboss.core.protections import (
    UNDO_PUBLISHES_COUNTED_IN_THE_DELIVERY,
    UNDO_REFUNDS_COUNTED_AS_PAYMENTS,
    UNDO_REFUSAL_REPLAYED_ON_REDRIVE,
    UNDO_TASK_PUBLISHED_DIRECTLY,
)
from celery_agboss.errors import ConfigurationError, OperatorRefusedError
from celery_agboss.operator import cancel, list_failed_after_payment, redrive
from celery_agboss.task import undo_function
from celery_agboss.testing import sabotage
from celery_agboss.testing.gateway import FakeGatewayFault
from tests.delivery.conftest import PaymentShop, assert_waits_for_an_operator
from tests.delivery.wallet_orders import released
from tests.engine.helpers import Crash
from tests.support.processes import wait_until

sqlite_only = pytest.mark.parametrize("delivery_store_url", ["sqlite"], indirect=True)
"""The store's part is the engine suite's (both stores); these check the delivery's."""


def _charge_with_a_refund_undo(
    shop: PaymentShop,
) -> tuple[list[UndoStep], Callable[[Any, str], Any]]:
    """The undo ``refund-charge`` (it refunds the payment, each run noted in the list)
    and the body's step that charges ``order`` and declares that undo."""
    charge, refund = shop.call(), shop.refund_call()
    seen: list[UndoStep] = []

    @undo_function(shop.app, "refund-charge")
    def refund_charge(task: Any, undo: UndoStep, payment: str) -> None:
        seen.append(undo)
        task.outbound(refund, {"payment": payment})  # keyed <step key>:compensation

    def charge_with_undo(task: Any, order: str) -> Any:
        receipt = task.outbound(charge, {"amount": 1000}, business_key=f"order:{order}")
        task.undo_with("refund-charge", payment=receipt["id"])
        return receipt

    return seen, charge_with_undo


def _failed_after_its_undo_refunded(shop: PaymentShop) -> tuple[list[UndoStep], Any]:
    """A body charges, declares the refund undo, then fails: the undo refunds the charge
    and the execution ends ``FAILED`` (the undos seen, and the task's result)."""
    seen, charge_with_undo = _charge_with_a_refund_undo(shop)

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        charge_with_undo(self, order)
        raise LookupError(f"order {order} is out of stock")

    with shop.worker():
        result = pay.delay("o-1")
        shop.wait_state(result.id, "FAILED")
        with pytest.raises(LookupError, match="out of stock"):
            result.get(timeout=10)
    return seen, result


def test_a_failure_after_the_charge_runs_the_undo_then_fails(shop: PaymentShop) -> None:
    seen, result = _failed_after_its_undo_refunded(shop)
    record = shop.execution(result.id)
    assert [undo.cause for undo in seen] == ["failure"]
    [payment] = shop.gateway.payments
    assert [r["payment"] for r in shop.gateway.refunds] == [payment["id"]]
    assert record.reason == "LookupError" and "out of stock" in (record.error or "")


@sqlite_only
def test_a_failure_whose_undo_refunded_the_charge_is_not_a_payment_left_behind(
    shop: PaymentShop,
) -> None:
    """Its own refund is the undo, not a payment: an operator is not called to it, and
    the "failed after a payment" gauge stays at zero."""
    _failed_after_its_undo_refunded(shop)
    assert len(shop.gateway.refunds) == 1
    assert list_failed_after_payment(shop.app) == []


@sqlite_only
def test_twin_counting_undo_refunds_as_payments_lists_the_refund_as_left_behind(
    shop: PaymentShop,
) -> None:
    _, result = _failed_after_its_undo_refunded(shop)
    with sabotage(UNDO_REFUNDS_COUNTED_AS_PAYMENTS):
        (left,) = list_failed_after_payment(shop.app)
    assert left.execution.id == result.id
    assert left.intents and all("compensation" in key for key in left.intents), left


@sqlite_only
def test_an_unknown_outcome_after_the_charge_never_starts_undo(shop: PaymentShop) -> None:
    """The second call's answer is lost; the retry reconciles it and completes (design: P5)."""
    seen, charge_with_undo = _charge_with_a_refund_undo(shop)
    charge = shop.call()  # the same call: the fee is a second charge
    faulted: list[str] = []

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        charge_with_undo(self, order)
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
    seen, _ = _charge_with_a_refund_undo(shop)
    pay_and_revoke = shop.pay_revoked_after_its_charge("refund-charge")
    with shop.worker():
        task_id = pay_and_revoke("o-3")
        record = shop.wait_state(task_id, "CANCELLED", "WAITING_OPERATOR", "FAILED")
    assert record.state.value == "CANCELLED", record.reason
    assert [undo.cause for undo in seen] == ["cancel"]
    assert len(shop.gateway.refunds) == 1


def _wait_released(shop: PaymentShop, task_id: str) -> None:
    """WAITING, and the delivery that wrote it let its lease go: its verdict and its
    release are two transactions, and a cancel is refused while the lease is live."""
    shop.wait_state(task_id, "WAITING")
    released(shop, task_id)


def test_a_cancel_of_a_waiting_execution_runs_its_undo_in_a_delivery(shop: PaymentShop) -> None:
    """An operator's cancel of an execution that waits (here for a long retry): it is
    handed to a delivery (the sweep re-drives it), which undoes the charge, then cancels."""
    seen, charge_with_undo = _charge_with_a_refund_undo(shop)

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        charge_with_undo(self, order)
        raise self.retry(countdown=3600)  # waits in the store, not in the broker

    with shop.worker():
        task_id = str(pay.delay("o-4").id)
        _wait_released(shop, task_id)
        moved = cancel(shop.app, task_id, "the customer changed their mind")
        assert moved.state.value == "COMPENSATING"
        with pytest.raises(OperatorRefusedError, match=r"ends FAILED .* or CANCELLED"):
            cancel(shop.app, task_id, "again")  # the undo that started is not stopped
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
        _wait_released(shop, task_id)
        moved = cancel(shop.app, task_id, "changed their mind")
    assert_waits_for_an_operator(moved, CANCELLED_AFTER_PAYMENT)


@sqlite_only
def test_an_undo_that_raises_waits_for_an_operator(shop: PaymentShop) -> None:

    @undo_function(shop.app, "refund-charge")
    def refund_charge(task: Any, undo: UndoStep, payment: str) -> None:
        raise RuntimeError("the refund API is down for maintenance")

    pay = shop.pay_failing_after_its_charge("refund-charge")

    with shop.worker():
        task_id = str(pay.delay("o-6").id)
        record = shop.wait_state(task_id, "WAITING_OPERATOR", "FAILED")
    assert_waits_for_an_operator(record, "undo refund-charge failed: RuntimeError")


def _refund_refused_then_redriven(shop: PaymentShop) -> str:
    """The body charges, declares the refund undo, then fails; the gateway refuses the
    refund definitively (nothing moved), so the execution waits for an operator, who
    re-drives it once the merchant's balance is topped up."""
    gateway = shop.gateway
    refund = shop.refund_call("shop.refusable-refund", refusable=True)

    shop.refund_undo(refund)

    pay = shop.pay_failing_after_its_charge("refund-charge")

    gateway.inject_fault(FakeGatewayFault.DECLINE, operation="refund")
    with shop.worker():
        task_id = str(pay.delay("o-7").id)
        record = shop.wait_state(task_id, "WAITING_OPERATOR", "FAILED")
        assert_waits_for_an_operator(record, "undo refund-charge failed")
        assert gateway.refunds == []
        assert redrive(shop.app, task_id, "balance topped up", actor="test")
        wait_until(
            lambda: (
                shop.execution(task_id).deliveries >= 2
                and shop.execution(task_id).state.value in ("FAILED", "WAITING_OPERATOR")
            ),
            20,
            message="the re-driven delivery to end",
        )
    return task_id


def test_a_refund_refused_by_the_gateway_is_sent_again_on_redrive(shop: PaymentShop) -> None:
    task_id = _refund_refused_then_redriven(shop)
    assert shop.execution(task_id).state.value == "FAILED", "undone, then failed"
    assert len(shop.gateway.refunds) == 1
    assert len(shop.gateway.payments) == 1


def test_twin_a_redrive_replays_the_refusal_and_the_customer_is_never_refunded(
    shop: PaymentShop,
) -> None:
    with sabotage(UNDO_REFUSAL_REPLAYED_ON_REDRIVE):
        task_id = _refund_refused_then_redriven(shop)
    assert shop.execution(task_id).state.value == "WAITING_OPERATOR"
    assert shop.gateway.refunds == []


# --- an undo declared as a Celery signature ------------------------------------------------

REFUND_PART = 400
"""Each refund task refunds a part of the charge, so a second run shows (and fits)."""


def _refund_task(shop: PaymentShop) -> tuple[Any, list[str]]:
    """A ``PaymentTask`` refunding a part of a payment; the ids of the runs of its body."""
    gateway = shop.gateway
    ran: list[str] = []

    def send(call: CallContext) -> Any:
        return gateway.refund(call.request["payment"], call.idempotency_key, amount=REFUND_PART)

    part_refund = shop.looked_up_call("shop.part-refund", send)

    @shop.task()
    def refund_payment(self: Any, payment: str) -> Any:
        ran.append(str(self.request.id))
        return self.outbound(part_refund, {"payment": payment})

    return refund_payment, ran


@contextmanager
def _crash_at(signal: Signal, task_name: str, nth: int) -> Iterator[list[str]]:
    """The delivery dies (a ``BaseException``, what a SIGKILL leaves behind) at the
    ``nth`` ``signal`` of a publish of ``task_name``: before that message left, or
    right after it did."""
    seen: list[str] = []
    crashed: list[str] = []

    def crash(sender: Any = None, **_: Any) -> None:
        if sender != task_name or crashed:
            return
        seen.append(str(sender))
        if len(seen) == nth:
            crashed.append(str(sender))
            raise Crash()

    signal.connect(crash, weak=False)
    try:
        yield crashed
    finally:
        signal.disconnect(crash)


def _quiet(shop: PaymentShop, ran: list[str], count: int) -> None:
    """Until ``count`` undo tasks ran to their end (none is left running when the virtual
    clock next moves past a lease)."""
    wait_until(lambda: len(set(ran)) >= count, 10, message=f"{count} undo tasks to run")
    for task_id in set(ran):
        shop.wait_state(task_id, "COMPLETED")


def _undo_tasks_across_a_crash(shop: PaymentShop, signal: Signal) -> tuple[str, list[str]]:
    """Two charges, each undone by ``refund_payment.s(payment)``, then a failure; the
    delivery dies at ``signal`` of the second undo task's publish (the first charge's:
    undos run last declared first); the redelivery continues the undo."""
    charge = shop.call()
    refund_payment, ran = _refund_task(shop)

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        for part in ("goods", "shipping"):
            receipt = self.outbound(charge, {"amount": 1000}, business_key=f"{order}:{part}")
            self.undo_with(refund_payment.s(receipt["id"]))
        raise LookupError(f"order {order} is out of stock")

    with shop.worker(), _crash_at(signal, refund_payment.name, nth=2) as crashed:
        task_id = str(pay.delay("o-7").id)
        wait_until(lambda: crashed, 10, message="the crash at the undo task's publish")
        _quiet(shop, ran, 2 if signal is celery_signals.after_task_publish else 1)
        shop.redrive_after_crash(task_id)
        record = shop.wait_state(task_id, "FAILED", "WAITING_OPERATOR")
        assert record.state.value == "FAILED", record.reason
        wait_until(lambda: len(shop.gateway.refunds) >= len(set(ran)), 10, message="refunds")
        _quiet(shop, ran, len(set(ran)))
    return task_id, ran


@pytest.mark.parametrize(
    "signal",
    [celery_signals.before_task_publish, celery_signals.after_task_publish],
    ids=["before-the-publish", "after-the-publish"],
)
def test_an_undo_signature_runs_once_across_a_crash_and_a_redelivery(
    shop: PaymentShop, signal: Signal, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="celery_agboss")
    task_id, ran = _undo_tasks_across_a_crash(shop, signal)
    assert len(ran) == 2 and len(set(ran)) == 2, "one task per undo, each body run once"
    assert shop.refunded() == sorted((p["id"], REFUND_PART) for p in shop.gateway.payments)
    events = [vars(r) for r in caplog.records if getattr(r, "execution_id", None) == task_id]
    starts = [e for e in events if e["event"] == EXECUTION_COMPENSATING]
    assert [(e["cause"], e["count"], e["continuing"]) for e in starts] == [
        ("failure", 2, False),
        ("failure", 2, True),
    ]
    done = [vars(r) for r in caplog.records if getattr(r, "event", None) == UNDO_DONE]
    assert [(e["execution_id"], e["undo"]) for e in done] == [(task_id, "shop.refund_payment")] * 2
    assert all("step_key_handle" in e for e in done), "business-keyed steps: handles"
    assert "o-7:goods" not in caplog.text, "R17: no business key in clear"


@pytest.mark.parametrize("delivery_store_url", ["sqlite"], indirect=True)
def test_twin_an_undo_task_published_under_a_new_id_refunds_twice(shop: PaymentShop) -> None:
    with sabotage(UNDO_TASK_PUBLISHED_DIRECTLY):
        _, ran = _undo_tasks_across_a_crash(shop, celery_signals.after_task_publish)
    assert len(set(ran)) == 3, "published again under a new id: a third refund task"
    goods = shop.gateway.payments[0]["id"]
    assert [payment for payment, _ in shop.refunded()].count(goods) == 2, "refunded twice"


@sqlite_only
def test_an_undo_signature_is_one_task_with_its_own_arguments(shop: PaymentShop) -> None:
    charge = shop.call()
    refund_payment, _ = _refund_task(shop)

    @shop.task()
    def pay(self: Any, order: str) -> list[str]:
        self.outbound(charge, {"amount": 1000}, business_key=f"order:{order}")
        refused = []
        for undo, arguments in (
            (chain(refund_payment.s("a"), refund_payment.s("b")), {}),
            (refund_payment.s("a"), {"amount": 1}),
            (refund_payment.s(object()), {}),
            (refund_payment.s("a").set(expires=60), {}),
        ):
            try:
                self.undo_with(undo, **arguments)
            except ConfigurationError as exc:
                refused.append(str(exc))
        return refused

    with shop.worker():
        refused = pay.delay("o-8").get(timeout=10)
    assert [text.split(":")[0] for text in refused] == [
        "undo_with() takes the signature of one task, not a canvas (chain, group, chord)",
        "undo 'shop.refund_payment' is a signature",
        "the arguments of undo 'shop.refund_payment' must be JSON",
        "undo_with() refuses a signature with expires",
    ]


def _undos_publishing_across_a_crash(shop: PaymentShop) -> list[str]:
    """Two charges, each undone by a function that publishes ``notify(payment)`` with a
    plain ``.delay()``; the delivery dies at the second publish (the first charge's undo:
    undos run last declared first), before that message left; the redelivery continues
    with that undo alone. The payments whose notify ran."""
    charge = shop.call()
    notified: list[tuple[str, str]] = []  # (the notify's task id, its payment)

    @shop.task()
    def notify(self: Any, payment: str) -> str:
        notified.append((str(self.request.id), payment))
        return payment

    @undo_function(shop.app, "notify-refund")
    def notify_refund(task: Any, undo: UndoStep, payment: str) -> None:
        notify.delay(payment)

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        for part in ("goods", "shipping"):
            receipt = self.outbound(charge, {"amount": 1000}, business_key=f"{order}:{part}")
            self.undo_with("notify-refund", payment=receipt["id"])
        raise LookupError(f"order {order} is out of stock")

    with (
        shop.worker(),
        _crash_at(celery_signals.before_task_publish, notify.name, nth=2) as crashed,
    ):
        task_id = str(pay.delay("o-9").id)
        wait_until(lambda: crashed, 10, message="the crash at the second undo's publish")
        wait_until(lambda: notified, 10, message="the first undo's notify to run")
        # Finished before the clock moves past leases: the sweep would re-drive it too.
        shop.wait_state(notified[0][0], "COMPLETED")
        shop.redrive_after_crash(task_id)
        record = shop.wait_state(task_id, "FAILED", "WAITING_OPERATOR")
        assert record.state.value == "FAILED", record.reason
        payments = {p["id"] for p in shop.gateway.payments}
        # Bounded, not asserted here: in the twin the second notify never comes.
        deadline = time.monotonic() + 5
        while {payment for _, payment in notified} != payments and time.monotonic() < deadline:
            time.sleep(0.05)
    # A body may run again (a re-driven delivery); what counts is which payments got one.
    return sorted({payment for _, payment in notified})


def test_a_task_published_from_an_undo_keeps_its_id_when_the_undos_continue(
    shop: PaymentShop,
) -> None:
    """Its id is counted within its undo: the continuing delivery's publish is the same
    task as the crashed one's, and no other undo's publish takes its id."""
    notified = _undos_publishing_across_a_crash(shop)
    assert notified == sorted(p["id"] for p in shop.gateway.payments)


def test_an_undo_publish_counted_in_the_delivery_runs_another_undos_task(
    shop: PaymentShop,
) -> None:
    """Twin: counted in the delivery, the continuing undo's publish is the delivery's
    first again: the id of the first undo's task, which ran already, so the second
    undo's notify is taken for it and never runs."""
    with sabotage(UNDO_PUBLISHES_COUNTED_IN_THE_DELIVERY):
        notified = _undos_publishing_across_a_crash(shop)
    assert notified != sorted(p["id"] for p in shop.gateway.payments)
