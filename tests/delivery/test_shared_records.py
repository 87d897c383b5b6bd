"""Records several executions share (design: records several executions share): a
business-keyed intent is one record for every execution that names its key — a double click,
a saga's later step, a duplicate publish — and every decision about it is the record's,
never its creator's.

The five ways a review charged twice or refunded a paid order on that seam, each on
both stores beside its sabotage twin, harm counted at the fake gateway:

1. a saga clicked twice: the first click's undo never refunds the charge the second
   click completed on (and its variants: a later click after the refund is told the
   step was undone; revoking the duplicate keeps the charge the paid order rests on);
2. a primary/backup body clicked twice: the second click replays the decline the first
   went past, never re-sends it;
3. every ``undo_with`` declared after one step runs;
4. a cancel of an execution that sent the winning attempt of another's intent undoes it;
5. a re-run that left for another path after sending another execution's intent waits
   for a person (a divergence), never completes with two charges.

A worker in a thread of this process (tests/delivery/conftest.py, with its speed-ups).
"""

from __future__ import annotations

import threading
from typing import Any

from celery_agboss import OutboundCallCompensatedError
from celery_agboss.core.compensation import UndoStep
from celery_agboss.core.executions import CANCELLED_AFTER_PAYMENT, DIVERGENCE, UNDO_WAITS
from celery_agboss.core.keys import business_key
from celery_agboss.core.protections import (
    DIVERGENCE_BY_CREATOR,
    ONE_UNDO_PER_STEP,
    PASSED_FAILURE_RESENT,
    PAYMENTS_BY_CREATOR,
    REPLAY_AFTER_UNDO,
    UNDO_IGNORES_OTHER_EXECUTIONS,
)
from celery_agboss.operator import cancel, list_shared_waits, list_waits
from celery_agboss.task import undo_function
from celery_agboss.testing.fault_arming import OUTBOUND_BEFORE_SEND, arm_raise
from celery_agboss.testing.gateway_types import FakeGatewayError, FakeGatewayFault
from celery_agboss.testing.switches import sabotage
from tests.delivery.conftest import PaymentShop, assert_waits_for_an_operator
from tests.engine.helpers import Crash
from tests.support.processes import wait_until

GATE_SECONDS = 30


def _refund_undo(shop: PaymentShop, ran: list[str] | None = None) -> None:
    refund = shop.refund_call()

    @undo_function(shop.app, "refund-charge")
    def refund_charge(task: Any, undo: UndoStep, payment: str) -> None:
        if ran is not None:
            ran.append(undo.name)
        task.outbound(refund, {"payment": payment})  # keyed <step key>:compensation


def _paid_with(shop: PaymentShop, order: str) -> Any:
    """The payment the order was marked paid with (its business-keyed fenced effect)."""
    key = business_key(shop.agboss.engine_settings.tenant, f"order:{order}", "mark-paid")
    record = shop.agboss.store.read_effect(key)
    return None if record is None else record.result


# --- 1. a saga clicked twice --------------------------------------------------------------


def _saga(shop: PaymentShop, charged: threading.Event, go_on: threading.Event) -> Any:
    """The docs' saga (docs/undo.md): charge the order, declare its refund, then a stock
    check that can fail; ``hold`` keeps a click between its charge and its stock check."""
    charge = shop.call()
    _refund_undo(shop)

    @shop.task()
    def place_order(self: Any, order: str, hold: bool = False) -> Any:
        request = {"amount": 1000, "order": order}
        try:
            receipt = self.outbound(charge, request, business_key=f"order:{order}")
        except OutboundCallCompensatedError:  # refunded: this click pays anew
            receipt = self.outbound(charge, request, business_key=f"order:{order}:attempt:2")
        self.undo_with("refund-charge", payment=receipt["id"])
        if hold:
            charged.set()
            assert go_on.wait(GATE_SECONDS)
            raise LookupError(f"order {order} is out of stock")
        self.fenced_effect(
            "mark-paid", lambda conn: {"payment": receipt["id"]}, business_key=f"order:{order}"
        )
        return receipt

    return place_order


def _first_fails_after_the_second_completed(shop: PaymentShop) -> tuple[str, str]:
    """A charges, B replays A's charge and ships (marked paid), then A's stock check fails."""
    charged, go_on = threading.Event(), threading.Event()
    place_order = _saga(shop, charged, go_on)
    with shop.worker():
        first = str(place_order.delay("o-1", True).id)
        assert charged.wait(GATE_SECONDS)
        second = shop.deliver(place_order, "o-1", states=("COMPLETED",))
        go_on.set()
        shop.wait_state(first, "FAILED", "WAITING_OPERATOR")
    return first, second


def test_f1_a_click_whose_stock_check_fails_keeps_the_charge_the_other_click_shipped(
    shop: PaymentShop,
) -> None:
    first, second = _first_fails_after_the_second_completed(shop)
    [payment] = shop.gateway.payments
    assert shop.gateway.refunds == [], "the paid, shipped order keeps its payment"
    assert _paid_with(shop, "o-1") == {"payment": payment["id"]}
    failed = shop.execution(first)
    assert failed.state.value == "FAILED"
    assert f"kept for {second}" in (failed.reason or "")


def test_f1_twin_an_undo_that_ignores_the_other_click_refunds_a_paid_order(
    shop: PaymentShop,
) -> None:
    with sabotage(UNDO_IGNORES_OTHER_EXECUTIONS):
        _first_fails_after_the_second_completed(shop)
    assert _paid_with(shop, "o-1") is not None, "marked paid and shipped"
    assert shop.net_paid() == 0, "a paid, shipped order refunded"


def _a_click_after_the_refund(shop: PaymentShop) -> tuple[str, str]:
    """A charges, fails and refunds, alone on the order; then C, a later click of it."""
    charged, go_on = threading.Event(), threading.Event()
    go_on.set()
    place_order = _saga(shop, charged, go_on)
    with shop.worker():
        first = shop.deliver(place_order, "o-2", True, states=("FAILED",))
        later = shop.deliver(place_order, "o-2", states=("COMPLETED", "FAILED"))
    return first, later


def test_f1_a_later_click_is_told_the_refunded_step_was_undone_and_pays_anew(
    shop: PaymentShop,
) -> None:
    _, later = _a_click_after_the_refund(shop)
    first_payment, second_payment = shop.gateway.payments
    assert [r["payment"] for r in shop.gateway.refunds] == [first_payment["id"]]
    assert shop.execution(later).state.value == "COMPLETED"
    assert _paid_with(shop, "o-2") == {"payment": second_payment["id"]}
    assert shop.net_paid() == 1000


def test_f1_twin_a_replay_of_the_refunded_step_marks_the_order_paid_for_nothing(
    shop: PaymentShop,
) -> None:
    with sabotage(REPLAY_AFTER_UNDO):
        _a_click_after_the_refund(shop)
    [payment] = shop.gateway.payments
    assert _paid_with(shop, "o-2") == {"payment": payment["id"]}, "paid with a refunded charge"
    assert shop.net_paid() == 0


def _revoke_the_duplicate(shop: PaymentShop) -> tuple[str, str]:
    """A completes the order; B, a duplicate publish of it, replays A's charge, declares
    its refund, and is revoked before it marks the order paid."""
    charged, go_on = threading.Event(), threading.Event()
    charge = shop.call()
    _refund_undo(shop)

    @shop.task()
    def place_order(self: Any, order: str, hold: bool = False) -> Any:
        receipt = self.outbound(charge, {"amount": 1000}, business_key=f"order:{order}")
        self.undo_with("refund-charge", payment=receipt["id"])
        if hold:
            charged.set()
            assert go_on.wait(GATE_SECONDS)
        self.fenced_effect(
            "mark-paid", lambda conn: {"payment": receipt["id"]}, business_key=f"order:{order}"
        )
        return receipt

    with shop.worker():
        first = shop.deliver(place_order, "o-3", states=("COMPLETED",))
        duplicate = str(place_order.delay("o-3", True).id)
        shop.revoke_at(duplicate, charged, go_on, gate=GATE_SECONDS)
        shop.wait_state(duplicate, "CANCELLED", "WAITING_OPERATOR", "FAILED")
    return first, duplicate


def test_f1_revoking_the_duplicate_keeps_the_charge_the_completed_order_rests_on(
    shop: PaymentShop,
) -> None:
    _, duplicate = _revoke_the_duplicate(shop)
    assert shop.execution(duplicate).state.value == "CANCELLED"
    assert shop.gateway.refunds == [] and shop.net_paid() == 1000


def test_f1_twin_the_revoked_duplicate_refunds_the_completed_order(shop: PaymentShop) -> None:
    with sabotage(UNDO_IGNORES_OTHER_EXECUTIONS):
        _revoke_the_duplicate(shop)
    assert shop.net_paid() == 0, "the completed order's charge refunded"


def _gated_saga(shop: PaymentShop, gates: dict[str, threading.Event]) -> Any:
    """The saga, each click held at its own gate (``hold``) after its charge and its
    declared refund, then failing its stock check (``fail``) or marking the order paid."""
    charge = shop.call()
    _refund_undo(shop)
    reached: dict[str, threading.Event] = {name: threading.Event() for name in gates}

    @shop.task()
    def place_order(self: Any, order: str, hold: str, fail: bool) -> Any:
        receipt = self.outbound(charge, {"amount": 1000}, business_key=f"order:{order}")
        self.undo_with("refund-charge", payment=receipt["id"])
        reached[hold].set()
        assert gates[hold].wait(GATE_SECONDS)
        if fail:
            raise LookupError(f"order {order} is out of stock")
        self.fenced_effect(
            "mark-paid", lambda conn: {"payment": receipt["id"]}, business_key=f"order:{order}"
        )
        return receipt

    place_order.reached = reached
    return place_order


def _one_fails_while_the_other_still_uses_the_charge(
    shop: PaymentShop, *, other_fails: bool
) -> tuple[str, str]:
    """A and B both hold on the order's one charge; A fails first while B still runs: A's
    undo waits for B. Then B completes (or fails too), and A is re-driven."""
    gates = {"a": threading.Event(), "b": threading.Event()}
    place_order = _gated_saga(shop, gates)
    with shop.worker():
        first = str(place_order.delay("o-4", "a", True).id)
        assert place_order.reached["a"].wait(GATE_SECONDS)
        second = str(place_order.delay("o-4", "b", other_fails).id)
        assert place_order.reached["b"].wait(GATE_SECONDS)
        gates["a"].set()
        wait_until(
            lambda: (shop.execution(first).reason or "").startswith(UNDO_WAITS),
            20,
            message="A's undo to wait for B",
        )
        waiting = shop.execution(first)
        assert [w.other for w in list_shared_waits(shop.app)] == [second], waiting.reason
        assert shop.gateway.refunds == [], "nothing undone while B still uses the charge"
        gates["b"].set()
        shop.wait_state(second, "COMPLETED" if not other_fails else "FAILED")

        def redriven() -> bool:
            if shop.execution(first).state.value in ("FAILED", "WAITING_OPERATOR"):
                return True
            shop.clock.advance(shop.agboss.executions.shared_wait_ms / 1000 + 1)
            shop.sweep()  # re-drives A once its wait is over
            return False

        wait_until(redriven, 30, interval=0.3, message="A re-driven after its wait")
    return first, second


def test_f1_an_undo_waits_while_another_click_still_uses_the_charge_then_keeps_it(
    shop: PaymentShop,
) -> None:
    first, second = _one_fails_while_the_other_still_uses_the_charge(shop, other_fails=False)
    failed = shop.execution(first)
    assert failed.state.value == "FAILED", failed.reason
    assert f"kept for {second}" in (failed.reason or "")
    assert shop.gateway.refunds == [] and shop.net_paid() == 1000
    assert _paid_with(shop, "o-4") is not None


def test_f1_two_clicks_failing_one_after_the_other_undo_the_charge_once(
    shop: PaymentShop,
) -> None:
    """B sees A undoing (never waits for it in turn), undoes the charge itself; A, re-driven,
    finds it undone by B: one refund, both FAILED."""
    first, second = _one_fails_while_the_other_still_uses_the_charge(shop, other_fails=True)
    assert shop.execution(second).state.value == "FAILED"
    failed = shop.execution(first)
    assert failed.state.value == "FAILED", failed.reason
    assert f"claimed for undo by {second}" in (failed.reason or "")
    assert len(shop.gateway.refunds) == 1 and shop.net_paid() == 0


# --- 2. a primary/backup body clicked twice --------------------------------------------------


def _primary_then_backup_clicked_twice(shop: PaymentShop) -> tuple[str, str]:
    primary, backup = shop.call("shop.primary"), shop.call("shop.backup")

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        request = {"amount": 1000, "order": order}
        try:
            return self.outbound(primary, request, business_key=f"order:{order}")
        except FakeGatewayError:  # declined: "nothing processed"
            return self.outbound(backup, request, business_key=f"order:{order}")

    shop.gateway.inject_fault(FakeGatewayFault.DECLINE, operation="charge")  # once
    with shop.worker():
        first = shop.deliver(pay, "o-5", states=("COMPLETED",))
        second = shop.deliver(pay, "o-5", states=("COMPLETED", "FAILED", "WAITING_OPERATOR"))
    return first, second


def test_f2_a_second_click_replays_the_decline_the_first_went_past_and_pays_once(
    shop: PaymentShop,
) -> None:
    _, second = _primary_then_backup_clicked_twice(shop)
    assert shop.execution(second).state.value == "COMPLETED"
    primary_sends = [r for r in shop.gateway.requests if "shop.primary" in r.idempotency_key]
    assert len(primary_sends) == 1, "declined once, never sent again"
    assert len(shop.gateway.payments) == 1


def test_f2_twin_re_sending_the_failure_by_default_charges_both_cards(
    shop: PaymentShop,
) -> None:
    with sabotage(PASSED_FAILURE_RESENT):
        _primary_then_backup_clicked_twice(shop)
    assert len(shop.gateway.payments) == 2, "the backup for the first click, the primary too"


# --- 3. every undo declared after one step runs ------------------------------------------------


def _hold_then_refund_then_fail(shop: PaymentShop) -> list[str]:
    charge = shop.call()
    ran: list[str] = []
    _refund_undo(shop, ran)

    @undo_function(shop.app, "release-hold")
    def release_hold(task: Any, undo: UndoStep, payment: str) -> None:
        ran.append(undo.name)

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        receipt = self.outbound(charge, {"amount": 1000}, business_key=f"order:{order}")
        self.undo_with("release-hold", payment=receipt["id"])
        self.undo_with("refund-charge", payment=receipt["id"])
        raise LookupError(f"order {order} is out of stock")

    with shop.worker():
        task_id = str(pay.delay("o-6").id)
        record = shop.wait_state(task_id, "FAILED", "WAITING_OPERATOR")
    assert record.state.value == "FAILED", record.reason
    return ran


def test_f3_every_undo_declared_after_one_step_runs_last_declared_first(
    shop: PaymentShop,
) -> None:
    assert _hold_then_refund_then_fail(shop) == ["refund-charge", "release-hold"]
    assert shop.net_paid() == 0


def test_f3_twin_a_second_undo_with_dropped_leaves_the_charge(shop: PaymentShop) -> None:
    with sabotage(ONE_UNDO_PER_STEP):
        ran = _hold_then_refund_then_fail(shop)
    assert ran == ["release-hold"]
    assert shop.net_paid() == 1000, "FAILED, the customer still charged"


# --- 4. a cancel of an execution that sent another's intent --------------------------------


def _dies_before_its_send(shop: PaymentShop, task: Any, execution_id: str, order: str) -> None:
    """A delivery of ``execution_id`` records its charge's intent, then dies right before
    the send (nothing reached the gateway); its lease is left to expire, and expires."""
    arm_raise(OUTBOUND_BEFORE_SEND, Crash, only={"execution_id": execution_id})
    task.apply_async((order,), task_id=execution_id)
    wait_until(lambda: shop.intents(execution_id), 10, message=f"{execution_id}'s intent")
    shop.clock.advance(shop.agboss.settings.lease_ttl_seconds + 1)
    wait_until(
        lambda: not getattr(shop.agboss.store.read_lease(execution_id), "live", True),
        10,
        message=f"{execution_id}'s lease to expire",
    )


def _waits_released(shop: PaymentShop, execution_id: str) -> None:
    """WAITING, and its delivery let the lease go (a cancel is refused under a live one)."""
    shop.wait_state(execution_id, "WAITING")
    wait_until(
        lambda: not getattr(shop.agboss.store.read_lease(execution_id), "live", False),
        10,
        message=f"{execution_id}'s lease to be released",
    )


def _sent_through_another_execution_s_intent(shop: PaymentShop, *, twin: bool = False) -> str:
    """A, the first click, records the order's charge and dies before sending it; B, the
    second, takes A's intent over, finds it not sent, sends it (the winning attempt) and
    then waits (a long retry). A is cancelled; then B is cancelled (``twin``: with
    "did it move money?" counting only the intents it created)."""
    charge = shop.call()
    _refund_undo(shop)

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        receipt = self.outbound(charge, {"amount": 1000}, business_key=f"order:{order}")
        self.undo_with("refund-charge", payment=receipt["id"])
        raise self.retry(countdown=3600)  # waits in the store

    first, second = "exec-f4-a", "exec-f4-b"
    with shop.worker():
        _dies_before_its_send(shop, pay, first, "o-7")
        pay.apply_async(("o-7",), task_id=second)
        _waits_released(shop, second)
        assert cancel(shop.app, first, "the first click").state.value == "CANCELLED"
        with sabotage(*([PAYMENTS_BY_CREATOR] if twin else [])):
            moved = cancel(shop.app, second, "the customer changed their mind")
        if moved.state.value == "COMPENSATING":
            shop.sweep()  # a delivery runs its undo
        shop.wait_state(second, "CANCELLED", "WAITING_OPERATOR")
    [payment] = shop.gateway.payments
    intent = shop.agboss.store.read_intent(payment["idempotency_key"])
    assert intent is not None and intent.execution_id == first and intent.sent_by == second
    return second


def test_f4_cancelling_the_execution_that_sent_the_charge_refunds_it(shop: PaymentShop) -> None:
    second = _sent_through_another_execution_s_intent(shop)
    assert shop.execution(second).state.value == "CANCELLED"
    assert shop.net_paid() == 0, "the cancelled order refunded"


def test_f4_without_an_undo_the_cancel_waits_for_a_person(shop: PaymentShop) -> None:
    charge = shop.call()

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        self.outbound(charge, {"amount": 1000}, business_key=f"order:{order}")
        raise self.retry(countdown=3600)

    first, second = "exec-f4-c", "exec-f4-d"
    with shop.worker():
        _dies_before_its_send(shop, pay, first, "o-8")
        pay.apply_async(("o-8",), task_id=second)
        _waits_released(shop, second)
        cancel(shop.app, first, "the first click")
        moved = cancel(shop.app, second, "changed their mind")
    assert_waits_for_an_operator(moved, CANCELLED_AFTER_PAYMENT)
    assert [w.execution.id for w in list_waits(shop.app)] == [second]


def test_f4_twin_counting_only_created_intents_cancels_and_keeps_the_money(
    shop: PaymentShop,
) -> None:
    second = _sent_through_another_execution_s_intent(shop, twin=True)
    assert shop.execution(second).state.value == "CANCELLED"
    assert shop.gateway.refunds == [] and shop.net_paid() == 1000, "cancelled, the customer charged"
    assert list_waits(shop.app) == [], "and nothing for a person to see"


# --- 5. a divergence through another execution's intent --------------------------------------


def _left_another_execution_s_intent_for_the_backup(shop: PaymentShop) -> str:
    """Y records the primary charge of the order and dies before sending it. X takes it
    over, finds it not sent and sends it; the answer is lost, and the sweep settles it
    later (completed). X's re-run then takes the backup path."""
    primary, backup = shop.call("shop.primary"), shop.call("shop.backup")
    runs: dict[str, int] = {}
    settled = threading.Event()

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        request = {"amount": 1000, "order": order}
        runs[self.request.id] = runs.get(self.request.id, 0) + 1
        if runs[self.request.id] == 1:  # the path a flag chose, changed between runs
            return self.outbound(primary, request, business_key=f"order:{order}")
        assert settled.wait(GATE_SECONDS)
        return self.outbound(backup, request, business_key=f"order:{order}:backup")

    creator, execution = "exec-f5-y", "exec-f5-x"
    with shop.worker():
        _dies_before_its_send(shop, pay, creator, "o-9")
        shop.gateway.inject_fault(FakeGatewayFault.ANSWER_THEN_DROP, operation="charge")
        pay.apply_async(("o-9",), task_id=execution)
        wait_until(lambda: runs.get(execution, 0) >= 2, 20, message="X's re-run")
        [intent] = shop.intents(creator)

        def swept_and_settled() -> bool:
            shop.sweep()  # reconciles the primary X left pending (no live owner)
            found = shop.agboss.store.read_intent(intent.idempotency_key)
            return found is not None and found.status.value == "COMPLETED"

        wait_until(swept_and_settled, 10, message="the sweep to settle the primary")
        settled.set()
        shop.wait_state(execution, "COMPLETED", "WAITING_OPERATOR")
    return execution


def test_f5_a_re_run_that_left_another_execution_s_charge_waits_for_a_person(
    shop: PaymentShop,
) -> None:
    execution = _left_another_execution_s_intent_for_the_backup(shop)
    record = shop.execution(execution)
    assert_waits_for_an_operator(record, DIVERGENCE)
    assert len(shop.gateway.payments) == 2, "both charges exist: a person refunds one"


def test_f5_twin_counting_only_created_intents_completes_with_two_charges(
    shop: PaymentShop,
) -> None:
    with sabotage(DIVERGENCE_BY_CREATOR):
        execution = _left_another_execution_s_intent_for_the_backup(shop)
    assert shop.execution(execution).state.value == "COMPLETED"
    assert len(shop.gateway.payments) == 2, "two charges, nothing flagged"
