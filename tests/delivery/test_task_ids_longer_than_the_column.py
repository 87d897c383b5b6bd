"""A task id (an execution id) as long as the store keeps one is a payment; a longer one
is refused at publish, naming the limit, on both stores; one a publisher without
celery_agboss sent anyway fails its delivery, saying so, with nothing charged.

A user's ``task_id=`` of more than ``KEY_COLUMN_LENGTH`` characters once read as a store
outage on PostgreSQL (``StringDataRightTruncation``: "publish again once the store
answers", which never helps) and was kept on SQLite. The longest id the column holds
makes position keys (``<tenant>:t:<id>:<name>``) longer than the key column: they are
fitted to it (``core.step_identity``), so the body charges once.
"""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from celery_agboss.core.keys import fit_key, step_key
from celery_agboss.errors import ConfigurationError, PublishRefusedError
from celery_agboss.store.schema import outbound_calls
from celery_agboss.store.schema_executions import executions
from tests.delivery.conftest import PaymentShop
from tests.support.processes import wait_until

KEY_COLUMN_LENGTH = executions.c.id.type.length
"""The execution id column as the store declares it (512: ``core.keys.KEY_COLUMN_LENGTH``)."""
assert outbound_calls.c.idempotency_key.type.length == KEY_COLUMN_LENGTH, "one length"


def _charge_task(shop: PaymentShop) -> Any:
    charge = shop.call()

    @shop.task()
    def charge_order(self: Any, order: str) -> Any:
        return self.outbound(charge, {"amount": 1000, "order": order})  # keyed by position

    return charge_order


def test_a_task_id_longer_than_the_column_is_refused_naming_the_limit(
    shop: PaymentShop, published: list[str]
) -> None:
    charge_order = _charge_task(shop)
    too_long = "order-" + "x" * (KEY_COLUMN_LENGTH - 5)
    with pytest.raises(PublishRefusedError) as refused:
        charge_order.apply_async(("o-1",), task_id=too_long)
    text = str(refused.value)
    assert f"{KEY_COLUMN_LENGTH + 1} characters" in text and str(KEY_COLUMN_LENGTH) in text
    assert "shorter task_id" in text
    assert "once the store answers" not in text, "not a store outage: waiting never helps"
    assert too_long not in published, "nothing reached the broker"
    assert shop.agboss.executions.read_execution(too_long) is None
    assert shop.gateway.payments == []


def test_a_too_long_id_from_a_publisher_without_celery_agboss_fails_its_delivery(
    shop: PaymentShop,
) -> None:
    """Only a publisher that does not run celery_agboss can send such an id: its delivery
    fails at once, naming the limit, and is not retried (PostgreSQL's refusal of the row
    read as a store outage, handed back for ever; SQLite charged under it)."""
    too_long = "order-" + "z" * (KEY_COLUMN_LENGTH - 5)
    plain = Celery("plain-publisher", broker="memory://", set_as_current=False)
    try:  # before the task is declared here: this process's publish hook knows it not
        plain.send_task(
            "shop.charge_order",
            args=("o-1",),
            task_id=too_long,
            queue=shop.app.conf.task_default_queue,
        )
    finally:
        plain.close()
    _charge_task(shop)
    result = shop.app.AsyncResult(too_long)
    with shop.worker():
        wait_until(lambda: result.state == "FAILURE", 20, message="the delivery to fail")
    assert isinstance(result.result, ConfigurationError), result.result
    assert "shorter task_id" in str(result.result) and str(KEY_COLUMN_LENGTH) in str(result.result)
    assert shop.gateway.payments == []
    assert shop.agboss.executions.read_execution(too_long) is None


def test_a_task_id_as_long_as_the_column_charges_once(shop: PaymentShop) -> None:
    charge_order = _charge_task(shop)
    longest = "order-" + "x" * (KEY_COLUMN_LENGTH - 6)
    with shop.worker():
        charge_order.apply_async(("o-1",), task_id=longest)
        record = shop.wait_state(longest, "COMPLETED")
    assert record.state.value == "COMPLETED"
    assert [p["amount"] for p in shop.gateway.payments] == [1000]
    raw = step_key(shop.agboss.engine_settings.tenant, longest, "shop.charge", 1)
    assert len(raw) > KEY_COLUMN_LENGTH, "a position key longer than the key column"
    (intent,) = shop.intents(longest)
    assert intent.idempotency_key == fit_key(raw, KEY_COLUMN_LENGTH)
    assert shop.gateway.payments[0]["idempotency_key"] == intent.idempotency_key


def test_the_longest_id_declares_its_undo_and_a_failure_refunds_once(shop: PaymentShop) -> None:
    """An undo's declaration and started marks are keyed by the execution id too
    (``core.compensation``): fitted to the column, so a failure refunds once."""

    charge, refund = shop.call(), shop.refund_call()

    shop.refund_undo(refund)

    @shop.task()
    def pay_then_fail(self: Any, order: str) -> Any:
        receipt = self.outbound(charge, {"amount": 1000, "order": order})
        self.undo_with("refund-charge", payment=receipt["id"])
        raise RuntimeError("the warehouse said no")

    longest = "order-" + "y" * (KEY_COLUMN_LENGTH - 6)
    with shop.worker():
        pay_then_fail.apply_async(("o-1",), task_id=longest)
        record = shop.wait_state(longest, "FAILED", "WAITING_OPERATOR", timeout=30)
    assert record.state.value == "FAILED", record.reason
    assert len(shop.gateway.payments) == 1
    assert len(shop.gateway.refunds) == 1
