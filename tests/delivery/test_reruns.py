"""What a re-run replays (design: what a re-run replays): the body runs again from the top
on every delivery, and wherever money is involved it must follow the path the first runs
took.

- A definite failure the body went past (it caught the decline and charged a backup
  card, or tried the next step of a loop) is raised again on the re-run, never sent
  again; one that ended the delivery (``autoretry_for``) is sent again: that is the
  retry the user asked for.
- An intent an earlier delivery created that the re-run's body no longer reaches is a
  divergence: the execution waits for an operator, named as such, never completes.
- A ``PaymentTask`` published from a body gets an id derived from its parent and the
  publish's position, so every re-run publishes the same execution.

Each re-run here is forced the way it happens: a later call's answer is lost
(``ANSWER_THEN_DROP``), so the delivery ends unknown and its retry runs the body again.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from celery import signals as celery_signals

from celery_agboss import NotSent, OutboundCall
from celery_agboss.core.executions import DIVERGENCE
from celery_agboss.core.outbound import CallContext
from celery_agboss.core.protections import (
    BODY_PUBLISHES_GET_NEW_IDS,
    DIVERGENCE_COMPLETED,
    PASSED_FAILURE_RESENT,
)
from celery_agboss.operator import accept, list_waits
from celery_agboss.testing.gateway_types import FakeGatewayError, FakeGatewayFault
from celery_agboss.testing.switches import sabotage
from tests.delivery.conftest import PaymentShop, assert_waits_for_an_operator
from tests.support.processes import wait_until


def _declined_then_answer_lost(shop: PaymentShop, pay: Any, order: str) -> str:
    """Runs ``pay(order)`` with the first charge declined and the next charge's answer
    lost, so the body runs again past its decline."""
    shop.gateway.inject_fault(FakeGatewayFault.DECLINE, operation="charge")
    shop.gateway.inject_fault(FakeGatewayFault.ANSWER_THEN_DROP, operation="charge")
    return shop.run(pay, order, states=("COMPLETED", "WAITING_OPERATOR"), timeout=30)


def _backup_after_a_decline(shop: PaymentShop) -> str:
    """The primary card is declined (a definite failure, caught); the backup's charge
    goes through but its answer is lost, so the body runs again."""
    primary, backup = shop.call("shop.primary"), shop.call("shop.backup")

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        request = {"amount": 1000, "order": order}
        try:
            return self.outbound(primary, request, business_key=order)
        except FakeGatewayError:  # declined: "nothing processed"
            return self.outbound(backup, request, business_key=order)

    return _declined_then_answer_lost(shop, pay, "o-1")


def test_a_decline_the_body_went_past_is_raised_again_never_resent(shop: PaymentShop) -> None:
    task_id = _backup_after_a_decline(shop)
    assert shop.execution(task_id).state.value == "COMPLETED"
    assert shop.times_sent("shop.primary") == 1, "declined once, never resent"
    assert len(shop.gateway.payments) == 1
    assert shop.execution(task_id).deliveries == 2


def test_resending_a_failure_the_body_went_past_charges_both_cards(shop: PaymentShop) -> None:
    with sabotage(PASSED_FAILURE_RESENT):
        task_id = _backup_after_a_decline(shop)
    assert len(shop.gateway.payments) == 2, "primary and backup both charged"
    # (The divergence rule then keeps it from completing: the re-run no longer reached
    # the backup. A second line of defence, too late for the money.)
    assert shop.execution(task_id).state.value == "WAITING_OPERATOR"


def _a_retry_loop_in_the_body(shop: PaymentShop) -> str:
    """Step 1 declined ("nothing processed"), step 2 charged with its answer lost."""
    charge = shop.call()

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        for _ in range(3):
            try:
                return self.outbound(charge, {"amount": 1000, "order": order})
            except FakeGatewayError:
                continue
        raise RuntimeError("declined three times")

    return _declined_then_answer_lost(shop, pay, "o-2")


def test_an_in_body_retry_loop_replays_its_declined_step(shop: PaymentShop) -> None:
    task_id = _a_retry_loop_in_the_body(shop)
    assert shop.execution(task_id).state.value == "COMPLETED"
    assert len(shop.gateway.payments) == 1 and len(shop.gateway.requests) == 2


def test_resending_the_declined_step_pays_the_order_twice(shop: PaymentShop) -> None:
    with sabotage(PASSED_FAILURE_RESENT):
        _a_retry_loop_in_the_body(shop)
    assert len(shop.gateway.payments) == 2


def test_a_decline_that_ended_the_delivery_is_sent_again_by_autoretry(
    shop: PaymentShop,
) -> None:
    charge = shop.call()

    @shop.task(autoretry_for=(FakeGatewayError,), max_retries=2, default_retry_delay=0.1)
    def pay(self: Any, order: str) -> Any:
        return self.outbound(charge, {"amount": 1000, "order": order}, business_key=order)

    shop.gateway.inject_fault(FakeGatewayFault.DECLINE, operation="charge")
    shop.run(pay, "o-3", states=("COMPLETED",), timeout=30)
    assert len(shop.gateway.requests) == 2 and len(shop.gateway.payments) == 1


def _a_passed_failure_of_a_class_that_cannot_be_rebuilt(shop: PaymentShop) -> str:
    """As above, but the primary's decline is raised to the body as an exception class
    defined in a function: the store keeps its type and text, but the re-run cannot
    raise it again as it was."""

    class CardDeclined(Exception):  # not importable: qualname has <locals>
        pass

    def send(call: CallContext) -> Any:
        try:
            return shop.gateway.charge(call.request["amount"], call.idempotency_key)
        except FakeGatewayError as exc:
            raise CardDeclined(str(exc)) from exc

    primary = shop.agboss.register(
        OutboundCall(
            name="shop.primary",
            send=send,
            reconcile=lambda call, lookup: NotSent(),
            key_retention=timedelta(hours=24),
            is_definite_failure=lambda exc: isinstance(exc, CardDeclined),
            transaction_id=lambda result: result.get("id"),
        )
    )
    backup = shop.call("shop.backup")

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        request = {"amount": 1000, "order": order}
        try:
            return self.outbound(primary, request, business_key=order)
        except CardDeclined:
            return self.outbound(backup, request, business_key=order)

    return _declined_then_answer_lost(shop, pay, "o-6")


def test_a_passed_failure_that_cannot_be_raised_again_waits_for_an_operator(
    shop: PaymentShop,
) -> None:
    task_id = _a_passed_failure_of_a_class_that_cannot_be_rebuilt(shop)
    record = shop.execution(task_id)
    assert_waits_for_an_operator(
        record, "", "OutboundCallFailureNotReplayableError", "CardDeclined"
    )
    assert shop.times_sent("shop.primary") == 1, "never resent"
    assert len(shop.gateway.payments) == 1


def test_resending_it_instead_charges_both_cards(shop: PaymentShop) -> None:
    with sabotage(PASSED_FAILURE_RESENT):
        _a_passed_failure_of_a_class_that_cannot_be_rebuilt(shop)
    assert len(shop.gateway.payments) == 2


# --- a divergence -----------------------------------------------------------------------


def _a_circuit_breaker(shop: PaymentShop) -> str:
    """Process memory decides the path: the first delivery's primary charge loses its
    answer and opens the breaker; the re-run takes the backup path and completes."""
    primary, backup = shop.call("shop.primary"), shop.call("shop.backup")
    breaker = {"open": False}

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        request = {"amount": 1000, "order": order}
        if breaker["open"]:
            return self.outbound(backup, request, business_key=order)
        breaker["open"] = True
        return self.outbound(primary, request, business_key=order)

    shop.gateway.inject_fault(FakeGatewayFault.ANSWER_THEN_DROP, operation="charge")
    return shop.run(pay, "o-4", states=("WAITING_OPERATOR", "COMPLETED"), timeout=30)


def test_a_rerun_that_no_longer_reaches_a_charge_waits_for_an_operator(
    shop: PaymentShop,
) -> None:
    task_id = _a_circuit_breaker(shop)
    record = shop.execution(task_id)
    assert_waits_for_an_operator(record, DIVERGENCE, "shop.primary")
    # The reason is stored and logged: a business key is never in it (design: R17).
    assert "o-4" not in (record.reason or "") and "a business-keyed record" in record.reason
    (wait,) = [w for w in list_waits(shop.app) if w.execution.id == task_id]
    assert f"accept {task_id}" in wait.ends_with
    report = shop.sweep()  # the primary charge, pending, is looked up
    assert report.reconciled == 1
    assert shop.execution(task_id).state.value == "WAITING_OPERATOR", "a person decides"
    # Once the extra payment is dealt with, the operator accepts the body's result.
    assert accept(shop.app, task_id, "refunded the primary charge")
    assert shop.execution(task_id).state.value == "COMPLETED"


def test_completing_a_divergence_hides_a_second_payment(shop: PaymentShop) -> None:
    with sabotage(DIVERGENCE_COMPLETED):
        task_id = _a_circuit_breaker(shop)
    assert shop.execution(task_id).state.value == "COMPLETED"
    assert len(shop.gateway.payments) == 2, "primary and backup, silently"


# --- a PaymentTask published from a body -------------------------------------------------


def _ship_then_a_lost_answer(shop: PaymentShop) -> str:
    """``pay`` publishes ``ship`` and then loses its charge's answer, so its re-run
    publishes ``ship`` again. The worker stays up until every ``ship`` that reached the
    broker has run (counted by Celery's own signals), so a second shipping charge has
    had its chance whichever id it was published under."""
    charge, ship = shop.call("shop.charge"), shop.ship_task()

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        ship.delay(order)  # before a call whose answer is lost: the re-run publishes again
        return self.outbound(charge, {"amount": 1000, "order": order}, business_key=order)

    published: list[str] = []
    ran: list[str] = []

    def on_publish(sender: Any = None, headers: Any = None, **_: Any) -> None:
        if sender == ship.name:
            published.append(str((headers or {}).get("id")))

    def on_postrun(sender: Any = None, task_id: Any = None, **_: Any) -> None:
        if getattr(sender, "name", None) == ship.name:
            ran.append(str(task_id))

    celery_signals.after_task_publish.connect(on_publish, weak=False)
    celery_signals.task_postrun.connect(on_postrun, weak=False)
    try:
        shop.gateway.inject_fault(FakeGatewayFault.ANSWER_THEN_DROP, operation="charge", times=1)
        with shop.worker():
            task_id = shop.deliver(pay, "o-5", states=("COMPLETED",), timeout=30)
            wait_until(
                lambda: len(published) >= 2,
                10,
                message=lambda: f"both publishes of ship (saw {published})",
            )
            wait_until(
                lambda: len(ran) >= len(published),
                20,
                message=lambda: f"every ship published {published} to run (ran {ran})",
            )
    finally:
        celery_signals.after_task_publish.disconnect(on_publish)
        celery_signals.task_postrun.disconnect(on_postrun)
    return task_id


def test_a_payment_task_published_from_a_body_is_one_execution_on_every_rerun(
    shop: PaymentShop,
) -> None:
    _ship_then_a_lost_answer(shop)
    assert shop.times_sent("shop.shipping") == 1


def test_a_new_id_on_every_rerun_charges_the_shipping_twice(shop: PaymentShop) -> None:
    with sabotage(BODY_PUBLISHES_GET_NEW_IDS):
        _ship_then_a_lost_answer(shop)
    assert shop.times_sent("shop.shipping") == 2
