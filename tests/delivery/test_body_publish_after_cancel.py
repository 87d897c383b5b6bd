"""A PaymentTask published alone from a body whose cancel was recorded is refused
(design: publishes from a body, cancel request).

The order's task is revoked while its body waits at a gate; the body then publishes the
shipping task, as ``delay``, ``apply_async``, ``send_task`` by name, with a ``task_id`` of
its own, or run in process with ``apply()``. The publish reads the cancel request, as
the body's next call would: ``CancelRequestedError`` before anything of the shipping is
recorded or sent, so the order ends ``CANCELLED`` and nobody is charged.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from celery_agboss.core.protections import BODY_PUBLISH_IGNORES_CANCEL
from celery_agboss.signals.body_publishes import derived_task_id
from celery_agboss.testing.switches import sabotage
from tests.delivery.conftest import PaymentShop
from tests.support.processes import wait_until

SHIPPING = 100
ORDER = 1000
MINE = "ship-of-order-o1"

PUBLISHES: dict[str, Callable[[Any, Any, str], Any]] = {
    "delay": lambda app, ship, order: ship.delay(order),
    "apply_async": lambda app, ship, order: ship.apply_async((order,)),
    "send_task": lambda app, ship, order: app.send_task("shop.ship", args=[order]),
    "own_task_id": lambda app, ship, order: ship.apply_async((order,), task_id=MINE),
    "apply": lambda app, ship, order: ship.apply((order,)),
}


def _cancelled_order_ships(shop: PaymentShop, how: str) -> tuple[str, list[str]]:
    """``pay`` is revoked at its gate, then publishes ``ship`` and charges the order;
    ``pay``'s id and the orders ``ship`` ran for."""
    shipped: list[str] = []
    ship_charge = shop.call("shop.ship-charge")
    charge = shop.call()
    reached, go_on = threading.Event(), threading.Event()

    @shop.task()
    def ship(self: Any, order: str) -> str:
        shipped.append(order)
        self.outbound(ship_charge, {"amount": SHIPPING, "order": order})
        return order

    @shop.task()
    def pay(self: Any, order: str) -> str:
        reached.set()
        go_on.wait(20)
        PUBLISHES[how](shop.app, ship, order)
        self.outbound(charge, {"amount": ORDER, "order": order}, business_key=order)
        return order

    with shop.worker():
        pay_id = str(pay.delay("o1").id)
        shop.revoke_at(pay_id, reached, go_on)
        record = shop.wait_state(pay_id, "CANCELLED", "FAILED", "COMPLETED")
        assert record.state.value == "CANCELLED", record
        if shipped:  # the sabotaged twin: let the child finish its charge
            wait_until(lambda: shop.gateway.payments, 10, message="the shipping charge")
    return pay_id, shipped


def _child_id(pay_id: str, how: str) -> str:
    return MINE if how == "own_task_id" else derived_task_id(pay_id, "publish/shop.ship#1")


@pytest.mark.parametrize("how", sorted(PUBLISHES))
def test_a_cancelled_body_publishes_no_payment_task(
    shop: PaymentShop, how: str, published: list[str]
) -> None:
    pay_id, shipped = _cancelled_order_ships(shop, how)
    assert shipped == []
    assert shop.gateway.payments == []
    child = _child_id(pay_id, how)
    assert shop.agboss.executions.read_execution(child) is None
    assert child not in published


@pytest.mark.parametrize("how", ["delay", "apply"])
def test_without_the_cancel_check_the_cancelled_order_is_charged_its_shipping(
    shop: PaymentShop, how: str
) -> None:
    with sabotage(BODY_PUBLISH_IGNORES_CANCEL):
        pay_id, shipped = _cancelled_order_ships(shop, how)
    assert shipped == ["o1"]
    assert [payment["amount"] for payment in shop.gateway.payments] == [SHIPPING]
    assert shop.agboss.executions.read_execution(_child_id(pay_id, how)) is not None
