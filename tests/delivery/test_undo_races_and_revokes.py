"""Undo: three holes a review left, in one Celery delivery, on both stores, counted at the
gateway.

- A thread the body started that passed the delivery's own "the body ended" check just
  before the compensation's start mark, and claims its charge just after it: the claim
  itself refuses it (twin ``body-claim-after-the-start-mark``: a second card charged,
  FAILED, the charge passed as an undo's refund and listed nowhere).
- An undo's task (a signature given to ``undo_with()``) revoked before its refund: it
  waits for an operator, listed by ``agboss pending``, and ``redrive`` runs the refund
  once, although the worker still holds its id revoked (twin
  ``undo-task-cancel-ends-cancelled``: the task ``CANCELLED``, the parent undone, the
  charge never refunded, shown to nobody). A revoke by stamped headers, which the worker
  records when the message arrives, is recorded for an undo's task too; only a cancel an
  operator cleared (``redrive``) is not recorded again.
- ``undo_with()`` inside an undo's task is refused at the call: its undos would never run.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
from celery import signals as celery_signals
from celery.worker.state import revoked as revoked_ids
from celery.worker.state import revoked_stamps

from celery_agboss.core.compensation import UndoStep
from celery_agboss.core.protections import (
    BODY_CLAIM_AFTER_THE_START_MARK,
    UNDO_TASK_CANCEL_ENDS_CANCELLED,
)
from celery_agboss.errors import AGBossError, ConfigurationError
from celery_agboss.operator import list_failed_after_payment, list_waits, redrive
from celery_agboss.task import undo_function
from celery_agboss.testing import sabotage
from celery_agboss.testing.fault_arming import FENCED_BEFORE_BEGIN, arm_pause
from tests.delivery.conftest import PaymentShop, assert_waits_for_an_operator
from tests.delivery.test_undo_after_the_body_ended import split_pay_with_a_body_thread
from tests.support.processes import wait_until

STRAGGLER = "card-b"
"""The name of the body's thread, which the paused fault point picks out."""


# --- a body thread past the check, claiming after the start mark ---------------------------


def _a_body_thread_claiming_just_after_the_start_mark(shop: PaymentShop) -> list[BaseException]:
    """Card A charged (its undo declared); the body starts card B in a thread, which
    passes the "body ended" check and stops right before its claim; the body raises,
    the compensation starts, and only its undo (so: after the start mark committed)
    lets card B's claim go on, then waits for it before refunding card A. What the
    thread raised, if anything."""
    paused = arm_pause(
        FENCED_BEFORE_BEGIN, only=lambda _: threading.current_thread().name == STRAGGLER
    )

    def past_the_check_before_its_claim() -> None:
        paused.wait_reached(15)

    return split_pay_with_a_body_thread(
        shop,
        undo_starts=paused.release,  # the start mark is committed: card B claims now
        body_raises=past_the_check_before_its_claim,
        thread_name=STRAGGLER,
    )


def test_a_body_thread_past_the_check_claims_nothing_after_the_start_mark(
    shop: PaymentShop,
) -> None:
    raised = _a_body_thread_claiming_just_after_the_start_mark(shop)
    assert [type(exc) for exc in raised] == [ConfigurationError], raised
    assert "after its compensation started" in str(raised[0])
    assert len(shop.requests_of("charge")) == 1 and len(shop.requests_of("refund")) == 1
    assert len(shop.gateway.payments) == 1 and len(shop.gateway.refunds) == 1
    assert list_failed_after_payment(shop.app) == []  # nothing left charged


def test_without_the_claims_check_a_body_thread_charges_after_the_start_mark(
    shop: PaymentShop,
) -> None:
    with sabotage(BODY_CLAIM_AFTER_THE_START_MARK):
        raised = _a_body_thread_claiming_just_after_the_start_mark(shop)
        listed = list_failed_after_payment(shop.app)
    assert raised == []
    assert len(shop.requests_of("charge")) == 2 and len(shop.requests_of("refund")) == 1
    assert len(shop.gateway.payments) == 2 and len(shop.gateway.refunds) == 1
    assert listed == [], "card B's charge passed as an undo's refund"


# --- an undo's task revoked before its refund ----------------------------------------------


def _a_revoked_undo_task(shop: PaymentShop) -> tuple[str, str]:
    """``place_order`` charges, declares ``refund_payment.s(payment)`` and fails; the
    refund task is revoked (a real ``revoke``, no terminate) while its body waits before
    the refund, and meets the cancel at its refund's claim. The parent's and the task's
    ids, once the task ended or waits."""
    refund = shop.refund_call("shop.sig-refund")
    reached, go_on = threading.Event(), threading.Event()
    ids: list[str] = []

    @shop.task()
    def refund_payment(self: Any, payment: str) -> Any:
        ids.append(str(self.request.id))
        reached.set()
        assert go_on.wait(15), "the revoke"
        return self.outbound(refund, {"payment": payment}, business_key=f"refund:{payment}")

    place_order = shop.pay_failing_after_its_charge(refund_payment.s, "place_order")

    parent = shop.deliver(place_order, "o-3", states=("FAILED", "WAITING_OPERATOR"))
    assert reached.wait(20), "the refund task to start"
    task_id = ids[0]
    shop.revoke_at(task_id, reached, go_on)
    shop.wait_state(task_id, "CANCELLED", "WAITING_OPERATOR", "COMPLETED")
    return parent, task_id


def test_a_revoked_undo_task_waits_for_an_operator_whose_redrive_refunds_once(
    shop: PaymentShop,
) -> None:
    with shop.worker():
        parent, task_id = _a_revoked_undo_task(shop)
        assert shop.gateway.refunds == []  # the revoke stopped the refund
        assert_waits_for_an_operator(shop.execution(task_id), "undo task cancelled", parent)
        [wait] = list_waits(shop.app)  # what `agboss pending` lists
        assert wait.execution.id == task_id and "agboss redrive" in wait.ends_with, wait
        # The worker still holds the id revoked: the redriven message must run anyway.
        wait_until(lambda: task_id in revoked_ids, 10, message="the worker's revoked set")
        assert redrive(shop.app, task_id, "the customer is owed the refund", actor="test")
        shop.wait_state(task_id, "COMPLETED", timeout=20)
    assert shop.execution(parent).state.value == "FAILED"
    assert len(shop.requests_of("charge")) == 1 and len(shop.requests_of("refund")) == 1
    assert len(shop.gateway.payments) == 1 and len(shop.gateway.refunds) == 1
    assert list_waits(shop.app) == []
    with pytest.raises(AGBossError, match="COMPLETED"):
        redrive(shop.app, task_id, "again", actor="test")  # once


def test_twin_a_revoked_undo_task_ends_cancelled_shown_to_nobody(shop: PaymentShop) -> None:
    with sabotage(UNDO_TASK_CANCEL_ENDS_CANCELLED), shop.worker():
        parent, task_id = _a_revoked_undo_task(shop)
        listed = list_waits(shop.app), list_failed_after_payment(shop.app)
    assert shop.execution(task_id).state.value == "CANCELLED"
    assert shop.execution(parent).state.value == "FAILED"  # its step reads undone
    assert len(shop.requests_of("charge")) == 1 and shop.requests_of("refund") == []
    assert len(shop.gateway.payments) == 1 and shop.gateway.refunds == []
    assert listed == ([], []), "the unrefunded charge is shown to nobody"


# --- undo_with() inside an undo's task ------------------------------------------------------


def test_undo_with_inside_an_undo_task_is_refused_at_the_call(shop: PaymentShop) -> None:
    refund = shop.refund_call("shop.sig-refund")
    refused: list[ConfigurationError] = []

    @undo_function(shop.app, "tell-the-customer")
    def tell_the_customer(task: Any, undo: UndoStep) -> None:
        raise AssertionError("never declared, never run")

    @shop.task()
    def refund_payment(self: Any, payment: str) -> Any:
        receipt = self.outbound(refund, {"payment": payment}, business_key=f"refund:{payment}")
        try:
            self.undo_with("tell-the-customer")
        except ConfigurationError as exc:
            refused.append(exc)
            raise
        return receipt

    place_order = shop.pay_failing_after_its_charge(refund_payment.s, "place_order")

    with shop.worker():
        parent = shop.deliver(place_order, "o-4", states=("FAILED", "WAITING_OPERATOR"))
        wait_until(lambda: refused, 20, message="the refund task's undo_with()")
        [wait] = wait_until(lambda: list_waits(shop.app), 20, message="the task to wait")
    [error] = refused
    assert f"undoes a step of execution {parent}" in str(error)
    assert "outbound() with a business key" in str(error)
    assert_waits_for_an_operator(
        wait.execution, f"undo shop.refund_payment of execution {parent} failed", "undo_with()"
    )
    assert len(shop.gateway.payments) == 1 and len(shop.gateway.refunds) == 1


def _refunds_queue() -> str:
    """A refunds queue of the test's own: in-memory queues live as long as the process,
    so a message a failed test left in a shared name would reach the next test's worker."""
    return f"refunds-{uuid.uuid4().hex[:8]}"


def _an_order_whose_refund_task_is_queued(
    shop: PaymentShop, order: str, queue: str, **options: Any
) -> tuple[str, Any]:
    """``place_order`` charges, declares ``refund_payment.s(payment)`` on ``queue`` (with
    ``options``: stamps) and fails. Run in a worker that does not consume ``queue``: the
    parent's id and the refund task's record, still queued."""
    refund = shop.refund_call("shop.sig-refund")

    refund_payment = shop.refund_task(refund)

    place_order = shop.pay_failing_after_its_charge(
        lambda payment: refund_payment.s(payment).set(queue=queue, **options), "place_order"
    )

    def the_task() -> list[Any]:
        return [
            found
            for found in shop.agboss.executions.list_executions(None, limit=50)
            if found.task_name == "shop.refund_payment"
        ]

    parent = shop.deliver(place_order, order, states=("FAILED", "WAITING_OPERATOR"))
    [task] = wait_until(the_task, 10, message="the refund task recorded")
    return parent, task


def test_an_undo_task_revoked_before_it_started_waits_and_a_redrive_refunds_once(
    shop: PaymentShop,
) -> None:
    """The common case: the refund task is still in its queue (``refunds``, which the
    first worker does not consume) when it is revoked."""
    refunds = _refunds_queue()
    with shop.worker():
        parent, task = _an_order_whose_refund_task_is_queued(shop, "o-5", refunds)
        shop.app.control.revoke(task.id)
        wait_until(lambda: task.id in revoked_ids, 10, message="the worker's revoked set")
    assert_waits_for_an_operator(shop.execution(task.id), "undo task cancelled", parent)
    ran: list[str] = []

    def on_postrun(task_id: Any = None, **_: Any) -> None:
        ran.append(str(task_id))

    celery_signals.task_postrun.connect(on_postrun, weak=False)
    try:
        with shop.worker(queues=["celery", refunds]):
            # The revoked message reaches a worker: it runs nothing, and still waits.
            wait_until(lambda: task.id in ran, 10, message="the revoked message delivered")
            assert_waits_for_an_operator(shop.execution(task.id), "undo task cancelled")
            assert redrive(shop.app, task.id, "the customer is owed the refund", actor="test")
            shop.wait_state(task.id, "COMPLETED", timeout=20)
    finally:
        celery_signals.task_postrun.disconnect(on_postrun)
    assert len(shop.requests_of("refund")) == 1 and len(shop.gateway.refunds) == 1
    assert list_waits(shop.app) == []


def test_an_undo_task_revoked_by_a_stamp_waits_and_a_redrive_refunds_once(
    shop: PaymentShop,
) -> None:
    """A revoke by stamped headers names no execution: nothing records it when it is sent,
    the worker does when the message arrives. It is recorded for an undo's task too (the
    task waits, nothing refunded), and only a cancel an operator cleared to run the task
    (``redrive``) lets the message through while the worker still holds the stamp."""
    stamp = f"order-{uuid.uuid4().hex[:8]}"  # this test's only: the stamps are process-wide
    refunds = _refunds_queue()
    try:
        with shop.worker():
            parent, task = _an_order_whose_refund_task_is_queued(
                shop, "o-6", refunds, stamped_headers=[stamp], **{stamp: "o-6"}
            )
            shop.app.control.revoke_by_stamped_headers({stamp: "o-6"})
            wait_until(lambda: stamp in revoked_stamps, 10, message="the worker's stamps")
        with shop.worker(queues=["celery", refunds]):
            record = wait_until(
                lambda: shop.execution(task.id).cancel_requested and shop.execution(task.id),
                20,
                message="the stamped revoke recorded when its message arrived",
            )
            assert shop.gateway.refunds == [], "the revoke stopped the refund"
            shop.wait_state(task.id, "WAITING_OPERATOR", timeout=20)
            assert_waits_for_an_operator(shop.execution(task.id), "undo task cancelled", parent)
            assert record.cancel_requested
            assert redrive(shop.app, task.id, "the customer is owed the refund", actor="test")
            shop.wait_state(task.id, "COMPLETED", timeout=20)
    finally:
        revoked_stamps.pop(stamp, None)
    assert len(shop.requests_of("refund")) == 1 and len(shop.gateway.refunds) == 1
    assert list_waits(shop.app) == []
