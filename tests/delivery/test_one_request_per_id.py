"""One request per execution id (design: one task per id), on both stores, in a real worker.

A task id reused for another order is refused at its publish, like a gateway refusing
an idempotency key reused with other parameters: accepted, its caller would be handed
the first order's receipt and its own order never charged.

- The first order finished, or still queued, or the id reused by another task's publish:
  the second ``apply_async`` raises ``ExecutionIdConflictError`` naming the id (never
  the arguments), and the gateway holds one payment, the first order's. Sealed at
  rest too: the stored arguments are compared opened.
- The same arguments again (a double click) are the same request: accepted, one payment.
- A ``self.retry(args=…)`` with other arguments, and a child a re-run parent sends
  again with other arguments (its ``parent_id``), stay the recorded execution; the
  rule itself is also shown on the store's publish record (keyword order, ``retries``).
- The twin accepts the reused id: the second caller gets the first order's receipt as
  SUCCESS, and the gateway never charged its order.

Speed-ups (the delivery conftest's): Celery's in-memory broker, a worker in a thread.
"""

from __future__ import annotations

import base64
import os
from typing import Any

import pytest

from celery_agboss.core.executions import ExecutionMessage
from celery_agboss.core.protections import REUSED_ID_OTHER_ARGS_ACCEPTED
from celery_agboss.core.sealing import key_variable
from celery_agboss.errors import ExecutionIdConflictError
from celery_agboss.runtime.messages import dumps
from celery_agboss.testing.switches import sabotage
from tests.delivery.conftest import PaymentShop
from tests.support.processes import wait_until

FIRST, SECOND = "ord-4242-first", "ord-5555-second"
CLEAR: dict[str, Any] = {}
SEALED = {"agboss_encryption_keys": ["k1"]}
BOTH = pytest.mark.parametrize("shop_config", [CLEAR, SEALED], ids=["clear", "sealed"])


@pytest.fixture(autouse=True)
def _key_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(key_variable("k1"), base64.b64encode(os.urandom(32)).decode())


def _pay(shop: PaymentShop) -> Any:
    charge = shop.call()

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        return self.outbound(
            charge, {"amount": 1000, "order": order}, business_key=f"order:{order}"
        )

    return pay


def _charged(shop: PaymentShop) -> list[Any]:
    return [payment["reference"] for payment in shop.gateway.payments]


def _assert_refused(error: ExecutionIdConflictError, task_id: str) -> None:
    text = str(error)
    assert repr(task_id) in text and "differ" in text, text
    assert "id of its own" in text and "same arguments" in text, text
    assert FIRST not in text and SECOND not in text, "the arguments may hold card data"


@BOTH
def test_an_id_reused_for_another_order_after_the_first_finished_is_refused(
    shop: PaymentShop,
) -> None:
    pay = _pay(shop)
    with shop.worker():
        first = pay.apply_async((FIRST,), task_id="order-x")
        shop.wait_state("order-x", "COMPLETED")
        receipt = first.get(timeout=10)
        with pytest.raises(ExecutionIdConflictError) as refused:
            pay.apply_async((SECOND,), task_id="order-x")
    _assert_refused(refused.value, "order-x")
    assert receipt["reference"] == FIRST
    assert _charged(shop) == [FIRST]
    assert shop.execution("order-x").args == f'["{FIRST}"]', "the stored request is kept"


def test_an_id_reused_while_the_first_order_is_queued_is_refused(shop: PaymentShop) -> None:
    pay = _pay(shop)
    pay.apply_async((FIRST,), task_id="order-q")  # no worker yet: it waits in the broker
    with pytest.raises(ExecutionIdConflictError) as refused:
        pay.apply_async((SECOND,), task_id="order-q")
    _assert_refused(refused.value, "order-q")
    with shop.worker():
        shop.wait_state("order-q", "COMPLETED")
    assert _charged(shop) == [FIRST]


@BOTH
def test_the_same_arguments_again_are_the_same_request(shop: PaymentShop) -> None:
    pay = _pay(shop)
    queued = pay.apply_async((FIRST,), task_id="order-d")
    again = pay.apply_async((FIRST,), task_id="order-d")  # a double click, still queued
    with shop.worker():
        assert queued.get(timeout=10)["reference"] == FIRST
        later = pay.apply_async((FIRST,), task_id="order-d").get(timeout=10)
        assert again.get(timeout=10) == later
    assert later["reference"] == FIRST
    assert _charged(shop) == [FIRST]


def test_a_retry_may_change_the_arguments(shop: PaymentShop) -> None:
    charge = shop.call()

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        if self.request.retries == 0:
            raise self.retry(args=(SECOND,), countdown=0.1)
        return self.outbound(
            charge, {"amount": 1000, "order": order}, business_key=f"order:{order}"
        )

    with shop.worker():
        result = pay.apply_async((FIRST,), task_id="order-r")
        shop.wait_state("order-r", "COMPLETED", "FAILED")
        assert result.get(timeout=10)["reference"] == SECOND
    assert _charged(shop) == [SECOND]


def test_the_rule_at_the_publish_record(shop: PaymentShop) -> None:
    """The rule at the publish record, without Celery: keyword order is not another
    request; a fresh message with other arguments (another order, or ``1000.0`` for
    ``1000``) is refused and leaves the stored one alone; one with more ``retries`` than
    the stored one is a retry of it, whose arguments replace the stored ones."""
    executions = shop.agboss.executions

    def message(order: str, retries: int = 0, **kwargs: Any) -> ExecutionMessage:
        options = {"queue": "celery", **({"retries": retries} if retries else {})}
        return ExecutionMessage(
            "order-m", "shop.pay", dumps([order]), dumps(kwargs), dumps(options)
        )

    assert executions.record_requested(message(FIRST, amount=1000, currency="EUR"))
    assert not executions.record_requested(message(FIRST, currency="EUR", amount=1000))
    for other in (
        message(SECOND, amount=1000, currency="EUR"),
        message(FIRST, amount=1000.0, currency="EUR"),
    ):
        with pytest.raises(ExecutionIdConflictError):
            executions.record_requested(other)
    assert shop.execution("order-m").args == dumps([FIRST])
    assert not executions.record_requested(message(SECOND, 1, amount=1000))
    assert shop.execution("order-m").args == dumps([SECOND]), "the retry's arguments"


def test_a_re_run_parent_sends_its_child_again_with_other_arguments(shop: PaymentShop) -> None:
    charge = shop.call()
    children: list[str] = []

    @shop.task()
    def pay(self: Any, order: str, attempt: int) -> Any:
        return self.outbound(
            charge, {"amount": 1000, "order": order}, business_key=f"order:{order}"
        )

    @shop.task()
    def checkout(self: Any, order: str) -> str:
        # The same child (the id derived from this execution and the position), sent
        # again by the re-run with another argument: deduplicated, never refused.
        children.append(str(pay.delay(order, self.request.retries).id))
        if self.request.retries == 0:
            raise self.retry(countdown=0.1)
        return "sent"

    with shop.worker():
        checkout.apply_async((FIRST,), task_id="checkout-c")
        parent = shop.wait_state("checkout-c", "COMPLETED", "FAILED")
        assert parent.state.value == "COMPLETED", parent.error
        assert len(children) == 2 and children[0] == children[1], children
        shop.wait_state(children[0], "COMPLETED")
        wait_until(lambda: _charged(shop), 10, message="the child's charge")
    assert _charged(shop) == [FIRST]


def test_another_task_reusing_the_id_for_another_order_is_refused(shop: PaymentShop) -> None:
    """Celery gives every publish from inside a worker task a ``parent_id``: a plain task
    publishing the payment under a reused id is not its parent sending it again."""
    pay = _pay(shop)
    refused: list[ExecutionIdConflictError] = []

    @shop.app.task(shared=False, name="shop.checkout_plain")
    def checkout(order: str) -> str:
        try:
            pay.apply_async((order,), task_id="order-p")
        except ExecutionIdConflictError as exc:
            refused.append(exc)
            return "refused"
        return "published"

    with shop.worker():
        assert checkout.delay(FIRST).get(timeout=10) == "published"
        shop.wait_state("order-p", "COMPLETED")
        assert checkout.delay(SECOND).get(timeout=10) == "refused"
    _assert_refused(refused[0], "order-p")
    assert _charged(shop) == [FIRST]


def test_one_task_publishing_two_orders_under_one_id_gets_the_second_refused(
    shop: PaymentShop,
) -> None:
    """Both publishes of one run carry that run's ``parent_id``: only an id celery_agboss
    derived for a body's publish (``DERIVED_ID_HEADER``) is its parent's to send again."""
    pay = _pay(shop)
    outcomes: list[str] = []

    @shop.app.task(shared=False, name="shop.bill_customer")
    def bill_customer(orders: list[str]) -> list[str]:
        for order in orders:
            try:
                outcomes.append(str(pay.apply_async((order,), task_id="cust-7-today").id))
            except ExecutionIdConflictError:
                outcomes.append("refused")
        return outcomes

    with shop.worker():
        bill_customer.delay([FIRST, SECOND]).get(timeout=10)
        shop.wait_state("cust-7-today", "COMPLETED")
    assert outcomes == ["cust-7-today", "refused"]
    assert _charged(shop) == [FIRST]


def test_without_the_check_the_second_order_gets_the_first_receipt(shop: PaymentShop) -> None:
    pay = _pay(shop)
    with shop.worker():
        pay.apply_async((FIRST,), task_id="order-t")
        shop.wait_state("order-t", "COMPLETED")
        with sabotage(REUSED_ID_OTHER_ARGS_ACCEPTED):
            second = pay.apply_async((SECOND,), task_id="order-t").get(timeout=10)
    assert second["reference"] == FIRST, "the second caller is handed the first receipt"
    assert _charged(shop) == [FIRST], "the second order looks paid and was never charged"
