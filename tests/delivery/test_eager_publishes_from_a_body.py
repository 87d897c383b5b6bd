"""A PaymentTask published from a body under ``task_always_eager``, or run from a body with
``apply()``, is one execution on every re-run (design: publishes from a body).

Eager, Celery's ``apply_async`` runs ``apply()`` in process and never reaches
``send_task``, where a body's publish gets its derived id; ``apply()`` in a body never
does, eager or not. Both take the publish's position and its derived id here too, so a
re-run of the parent (its retry after a lost answer) replays the child's completed
execution instead of running a new one: the shipping is charged once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from celery import chain, chord, group

from celery_agboss import OutboundCall
from celery_agboss.core.outbound import CallContext
from celery_agboss.core.protections import EAGER_BODY_PUBLISH_UNKEYED
from celery_agboss.signals.body_publishes import derived_task_id
from celery_agboss.testing.switches import sabotage
from tests.delivery.conftest import PaymentShop

ORDER = 1000
SHIPPING = 500


@pytest.fixture
def shop_config() -> dict[str, Any]:
    return {"task_always_eager": True}


def _charge_losing_the_first_order_answer(shop: PaymentShop) -> OutboundCall:
    """A charge whose first answer for the order (not the shipping) is lost after the
    gateway took it: the parent's delivery retries, and its body runs again."""
    gateway = shop.gateway
    lost = {"n": 0}

    def send(call: CallContext) -> Any:
        receipt = gateway.charge(
            call.request["amount"], call.idempotency_key, reference=call.request.get("order")
        )
        if call.request["amount"] == ORDER and lost["n"] == 0:
            lost["n"] += 1
            raise ConnectionError("answer lost")
        return receipt

    return shop.looked_up_call("shop.charge_eager", send)


PUBLISHES: dict[str, Callable[[Any, str], Any]] = {
    "delay": lambda ship, order: ship.delay(order),
    "apply_async": lambda ship, order: ship.apply_async((order,)),
    "apply": lambda ship, order: ship.apply((order,)),
    "signature": lambda ship, order: ship.s(order).apply(),
}


CANVASES: dict[str, Callable[[Any, str], Any]] = {
    "chain": lambda ship, order: chain(ship.s(order), ship.si(f"{order}-b")).apply_async(),
    "group": lambda ship, order: group(ship.s(order), ship.s(f"{order}-b")).apply_async(),
    "chord": lambda ship, order: chord([ship.s(order)], ship.si(f"{order}-b")).apply_async(),
}
"""Run in process too: Celery's eager canvas applies each task with ``apply()``."""


def _pay_publishing_ship(shop: PaymentShop, publish: Callable[[Any, str], Any]) -> Any:
    """``pay`` publishes ``ship`` with ``publish`` (run in process), then charges the
    order, whose answer is lost once: ``pay`` runs again from the top."""
    charge = _charge_losing_the_first_order_answer(shop)

    @shop.task()
    def ship(self: Any, order: str) -> Any:
        return self.outbound(charge, {"amount": SHIPPING, "order": f"ship-{order}"})

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        publish(ship, order)
        return self.outbound(charge, {"amount": ORDER, "order": order})

    return pay


def _ship_then_a_lost_answer(shop: PaymentShop, publish: Callable[[Any, str], Any]) -> str:
    """``_pay_publishing_ship`` run eagerly. The id of ``pay``'s execution."""
    result = _pay_publishing_ship(shop, publish).delay("o1")
    assert result.get(timeout=10)["amount"] == ORDER
    return str(result.id)


def _amounts(shop: PaymentShop) -> list[int]:
    return [payment["amount"] for payment in shop.gateway.payments]


@pytest.mark.parametrize("how", sorted(PUBLISHES))
def test_an_eager_child_published_before_a_lost_answer_charges_once(
    shop: PaymentShop, how: str
) -> None:
    pay_id = _ship_then_a_lost_answer(shop, PUBLISHES[how])
    assert sorted(_amounts(shop)) == [SHIPPING, ORDER], _amounts(shop)
    # The id the send_task hook gives a body's first publish of ship: one derivation.
    child = derived_task_id(pay_id, "publish/shop.ship#1")
    assert shop.execution(child).state.value == "COMPLETED"


@pytest.mark.parametrize("how", sorted(CANVASES))
def test_the_payment_tasks_of_an_eager_canvas_in_a_body_charge_once(
    shop: PaymentShop, how: str
) -> None:
    _ship_then_a_lost_answer(shop, CANVASES[how])
    assert sorted(_amounts(shop)) == [SHIPPING, SHIPPING, ORDER], _amounts(shop)


@pytest.mark.parametrize("shop_config", [{}], ids=["worker"])
def test_a_child_applied_in_a_body_on_a_worker_charges_once(shop: PaymentShop) -> None:
    """Not eager: the parent runs on a worker, its retry is a message; ``apply()`` in its
    body runs the child in process all the same."""
    pay = _pay_publishing_ship(shop, PUBLISHES["apply"])
    pay_id = shop.run(pay, "o3", states=("COMPLETED",))
    assert sorted(_amounts(shop)) == [SHIPPING, ORDER], _amounts(shop)
    child = derived_task_id(pay_id, "publish/shop.ship#1")
    assert shop.execution(child).state.value == "COMPLETED"


@pytest.mark.parametrize("how", ["delay", "apply"])
def test_without_the_derived_id_an_eager_child_charges_the_shipping_twice(
    shop: PaymentShop, how: str
) -> None:
    with sabotage(EAGER_BODY_PUBLISH_UNKEYED):
        _ship_then_a_lost_answer(shop, PUBLISHES[how])
    assert sorted(_amounts(shop)) == [SHIPPING, SHIPPING, ORDER], _amounts(shop)


def test_each_eager_publish_of_a_body_takes_its_own_position_and_a_given_id_is_kept(
    shop: PaymentShop,
) -> None:
    mine = shop.new_id()

    def three_publishes(ship: Any, order: str) -> None:
        ship.delay(f"{order}-a")
        ship.apply((f"{order}-b",))
        ship.apply_async((f"{order}-c",), task_id=mine)

    pay_id = str(_pay_publishing_ship(shop, three_publishes).delay("o2").id)
    assert sorted(_amounts(shop)) == [SHIPPING, SHIPPING, SHIPPING, ORDER], _amounts(shop)
    for n, order in enumerate(("o2-a", "o2-b"), start=1):
        child = shop.execution(derived_task_id(pay_id, f"publish/shop.ship#{n}"))
        assert child.state.value == "COMPLETED"
        assert order in str(child.args), child.args
    assert shop.execution(mine).state.value == "COMPLETED"
