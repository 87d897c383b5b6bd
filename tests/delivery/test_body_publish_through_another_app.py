"""A PaymentTask a body publishes through another Celery app (a plain producer on the same
broker) is refused unless its id is the caller's (design: publishes from a body).

Only the task's own app gives a body's publish an id that is the same on every re-run.
Through another app's ``send_task`` Celery makes a new id on every re-run of the body:
recorded as it was, a retried body charged the shipping twice. It is refused now (the
caller gets ``PublishNotRecorded`` carrying the ``PublishRefusedError``, the one error
Celery lets out of ``before_task_publish``); a ``task_id`` the caller gives is kept.
"""

from __future__ import annotations

from typing import Any

from celery_agboss.core.protections import BODY_PUBLISH_THROUGH_ANOTHER_APP_ALLOWED
from celery_agboss.errors import PublishNotRecorded, PublishRefusedError
from celery_agboss.testing.switches import sabotage
from tests.delivery.conftest import PaymentShop
from tests.support.processes import wait_until

SHIPPING = 100
ORDER = 1000


def _retried_body_ships_through(
    shop: PaymentShop, task_id: str | None
) -> tuple[list[str], list[BaseException]]:
    """``pay`` publishes ``ship`` through a producer app, then retries once before it
    charges the order; the ids ``ship`` ran under and what the publishes raised."""
    ran: list[str] = []
    raised: list[BaseException] = []
    ship_charge = shop.call("shop.ship-charge")
    charge = shop.call()
    producer, queue = shop.producer()

    @shop.task()
    def ship(self: Any, order: str) -> str:
        ran.append(str(self.request.id))
        self.outbound(ship_charge, {"amount": SHIPPING, "order": order})
        return order

    @shop.task()
    def pay(self: Any, order: str) -> str:
        try:
            producer.send_task("shop.ship", args=[order], queue=queue, task_id=task_id)
        except PublishNotRecorded as refused:
            raised.append(refused.error)
        if self.request.retries == 0:
            raise self.retry(countdown=0)
        self.outbound(charge, {"amount": ORDER, "order": order}, business_key=order)
        return order

    try:
        with shop.worker():
            pay_id = str(pay.delay("o1").id)
            shop.wait_state(pay_id, "COMPLETED")
            if task_id is not None or not raised:
                wait_until(
                    lambda: len(shop.gateway.payments) >= 3 - (task_id is not None),
                    10,
                    message="the shipping charges",
                )
    finally:
        producer.close()
    return ran, raised


def _shipping(shop: PaymentShop) -> list[int]:
    return [p["amount"] for p in shop.gateway.payments if p["amount"] == SHIPPING]


def test_a_new_id_through_another_app_is_refused_naming_what_to_do(shop: PaymentShop) -> None:
    ran, raised = _retried_body_ships_through(shop, None)
    assert ran == [] and _shipping(shop) == []
    assert len(raised) == 2
    for error in raised:
        assert isinstance(error, PublishRefusedError)
        assert "shop.ship" in str(error)
        assert "shop.ship.delay / app.send_task" in str(error)
        assert "task_id=" in str(error)


def test_an_id_the_caller_gives_through_another_app_is_kept(shop: PaymentShop) -> None:
    ran, raised = _retried_body_ships_through(shop, "ship-of-order-o1")
    assert raised == []
    assert set(ran) == {"ship-of-order-o1"}
    assert _shipping(shop) == [SHIPPING]


def test_without_the_refusal_a_retried_body_charges_the_shipping_twice(
    shop: PaymentShop,
) -> None:
    with sabotage(BODY_PUBLISH_THROUGH_ANOTHER_APP_ALLOWED):
        ran, raised = _retried_body_ships_through(shop, None)
    assert raised == []
    assert len(set(ran)) == 2
    assert _shipping(shop) == [SHIPPING, SHIPPING]


def test_a_body_that_does_not_catch_the_refusal_fails_as_through_its_own_app(
    shop: PaymentShop,
) -> None:
    """Uncaught, the refusal (a ``BaseException`` out of Celery's signal) left the execution
    ``RUNNING`` until its lease expired, then re-ran it into the same refusal: it fails
    with the ``PublishRefusedError``, as a publish through its own app does."""
    charge = shop.call()
    producer, queue = shop.producer()

    @shop.task()
    def ship(self: Any, order: str) -> str:
        return order

    @shop.task()
    def pay(self: Any, order: str) -> str:
        self.outbound(charge, {"amount": ORDER, "order": order}, business_key=order)
        producer.send_task("shop.ship", args=[order], queue=queue)
        return order

    try:
        pay_id = shop.run(pay, "o1", states=("FAILED", "WAITING_OPERATOR"))
    finally:
        producer.close()
    record = shop.execution(pay_id)
    assert record.state.value == "FAILED", record
    assert "PublishRefusedError" in (record.error or "") and "shop.ship" in (record.error or "")
    assert len(shop.gateway.payments) == 1
