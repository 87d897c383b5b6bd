"""Refused publishes from a body (design: publishes from a body), after a review of the
refusals, on both stores.

- The store failing for a moment while a body records its child (through its own app or
  another): a store outage is handed over, never the body's failure. It failed the
  execution, which ran its undo: the good charge was refunded.
- Another app of the process bound to ``AGBoss`` too: its ``send_task`` is not this
  app's, and a random id through it is refused as through a plain producer (it was taken
  for this app's publish: a retried body charged the shipping twice).
- An undo function whose publish through another app is refused reaches a person with
  the refusal (it was abandoned, again on every re-drive, no reason stored).
"""

from __future__ import annotations

from typing import Any

import pytest

from celery_agboss.errors import PublishRefusedError, StoreUnavailableError
from celery_agboss.task import undo_function
from celery_agboss.testing.celery_app import close_test_app, make_test_app
from tests.delivery.conftest import (
    PaymentShop,
    assert_waits_for_an_operator,
    lease_lapses_in_real_time,
)

ORDER, SHIPPING = 1000, 100


@pytest.fixture
def shop_config() -> dict[str, Any]:
    return lease_lapses_in_real_time()


def _the_store_fails_once_recording(shop: PaymentShop, name: str) -> list[str]:
    """The first record of a ``name`` publish raises as a store outage would."""
    executions = shop.agboss.executions
    original = executions.record_requested
    failed: list[str] = []

    def record_requested(message: Any) -> bool:
        if message.task_name == name and not failed:
            failed.append(str(message.execution_id))
            raise StoreUnavailableError("the store did not answer (test)")
        return original(message)

    executions.record_requested = record_requested  # type: ignore[method-assign]
    return failed


@pytest.mark.parametrize("through", ["another-app", "own-app"])
def test_a_store_outage_recording_a_child_is_retried_and_the_charge_kept(
    shop: PaymentShop, through: str
) -> None:
    charge, refund = shop.call(), shop.refund_call()
    producer, queue = shop.producer()

    shop.refund_undo(refund)

    @shop.task()
    def ship(self: Any, order: str) -> str:
        return order

    @shop.task()
    def pay(self: Any, order: str) -> str:
        receipt = self.outbound(charge, {"amount": ORDER, "order": order}, business_key=order)
        self.undo_with("refund-charge", payment=receipt["id"])
        if through == "another-app":
            producer.send_task("shop.ship", args=[order], queue=queue, task_id=f"ship-{order}")
        else:
            ship.apply_async((order,), task_id=f"ship-{order}")
        return order

    failed = _the_store_fails_once_recording(shop, "shop.ship")
    try:
        pay_id = shop.run(pay, "o1", states=("COMPLETED", "FAILED", "WAITING_OPERATOR"))
    finally:
        producer.close()
    assert failed, "the outage was met"
    assert shop.execution(pay_id).state.value == "COMPLETED"
    assert len(shop.gateway.payments) == 1 and shop.gateway.refunds == []


def test_a_random_id_through_another_agboss_app_is_refused(
    shop: PaymentShop, delivery_store_url: str
) -> None:
    ship_charge, charge = shop.call("shop.ship-charge"), shop.call()
    queue = shop.app.conf.task_default_queue
    other = make_test_app(delivery_store_url)
    other.conf.broker_url = shop.app.conf.broker_url
    raised: list[BaseException] = []

    @shop.task()
    def ship(self: Any, order: str) -> str:
        self.outbound(ship_charge, {"amount": SHIPPING, "order": order})
        return order

    @shop.task()
    def pay(self: Any, order: str) -> str:
        try:
            other.send_task("shop.ship", args=[order], queue=queue)
        except PublishRefusedError as refused:  # that app's send_task gives the error
            raised.append(refused)
        if self.request.retries == 0:
            raise self.retry(countdown=0)
        return self.outbound(charge, {"amount": ORDER, "order": order}, business_key=order)

    try:
        shop.run(pay, "o1", states=("COMPLETED",))
    finally:
        close_test_app(other)
    assert len(raised) == 2 and all(isinstance(e, PublishRefusedError) for e in raised)
    assert [p["amount"] for p in shop.gateway.payments] == [ORDER]


def test_an_undo_refused_through_another_app_waits_for_a_person(shop: PaymentShop) -> None:
    charge = shop.call()
    producer, queue = shop.producer()

    @shop.task()
    def refund_task(self: Any, payment: str) -> str:
        return payment

    @undo_function(shop.app, "refund-through-a-producer")
    def refund_through_a_producer(task: Any, undo: Any, payment: str) -> None:
        producer.send_task("shop.refund_task", args=[payment], queue=queue)

    @shop.task()
    def pay(self: Any, order: str) -> str:
        receipt = self.outbound(charge, {"amount": ORDER, "order": order}, business_key=order)
        self.undo_with("refund-through-a-producer", payment=receipt["id"])
        raise LookupError("out of stock")

    try:
        pay_id = shop.run(pay, "o1", states=("WAITING_OPERATOR", "FAILED"))
    finally:
        producer.close()
    assert_waits_for_an_operator(
        shop.execution(pay_id), "undo refund-through-a-producer failed: PublishRefusedError"
    )
    assert len(shop.gateway.payments) == 1
