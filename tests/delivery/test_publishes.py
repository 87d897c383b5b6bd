"""Every ``PaymentTask`` publish (design: trap 9, execution states) leaves a record, or fails.

A publisher that never imported the task's module knows it by name through
``agboss_payment_tasks``; a publish the store cannot record raises
``PublishRefusedError`` to the caller and nothing reaches the broker (a message the
broker then lost would otherwise be gone without trace); a worker that finds a message
nobody recorded says how to fix the publisher. An execution id belongs to one task: a
publish or delivery of another task under it is refused, naming both.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_agboss import PaymentTask
from celery_agboss.core.protections import PUBLISH_WITHOUT_RECORD, TASK_NAME_NOT_CHECKED
from celery_agboss.errors import ExecutionIdConflictError, PublishRefusedError
from celery_agboss.testing.celery_app import close_test_app, make_test_app
from celery_agboss.testing.switches import sabotage
from tests.delivery.conftest import PaymentShop
from tests.support.processes import wait_until


def _publisher(database_url: str, **config: Any) -> Celery:
    """A web process's app: AGBoss on the store, and none of the task modules imported."""
    return make_test_app(database_url, config=config)


def test_a_publish_by_name_is_recorded_when_the_name_is_declared(
    delivery_store_url: str, shop: PaymentShop
) -> None:
    web = _publisher(delivery_store_url, agboss_payment_tasks=["shop.charge_*"])
    try:
        task_id = str(web.send_task("shop.charge_order", args=("o-1",)).id)
        record = shop.agboss.executions.read_execution(task_id)
        assert record is not None and record.state.value == "REQUESTED"
        assert record.task_name == "shop.charge_order"
        assert web.send_task("shop.ship_order") and True  # not a payment task: not recorded
    finally:
        close_test_app(web)


def test_a_publish_by_an_unknown_name_leaves_no_record(
    delivery_store_url: str, shop: PaymentShop
) -> None:
    """Why the setting exists: without it the publisher cannot tell a PaymentTask."""
    web = _publisher(delivery_store_url)
    try:
        task_id = str(web.send_task("shop.charge_order", args=("o-1",)).id)
        assert shop.agboss.executions.read_execution(task_id) is None
    finally:
        close_test_app(web)


def _unreachable_store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path.resolve() / 'no-such-directory' / 'agboss.db'}"


def test_a_publish_the_store_cannot_record_fails_and_nothing_is_published(
    tmp_path: Path, published: list[str]
) -> None:
    web = _publisher(_unreachable_store_url(tmp_path), agboss_payment_tasks=["shop.*"])
    try:
        with pytest.raises(PublishRefusedError, match="could not be recorded") as refused:
            web.send_task("shop.charge_order", args=("o-1",), task_id="t-refused")
        assert isinstance(refused.value, Exception), "a web handler catches it as usual"
        assert "t-refused" not in published, "nothing reached the broker"
    finally:
        close_test_app(web)


def test_a_publish_refused_for_a_configuration_error_says_what_to_fix(
    delivery_store_url: str, published: list[str]
) -> None:
    """Not "publish again once the store answers": the store is fine, this process's
    settings are not, and waiting would never help."""
    web = _publisher(delivery_store_url, agboss_lease_ttl=1)
    try:

        @web.task(base=PaymentTask, bind=True, name="shop.charge_order")  # type: ignore[untyped-decorator]
        def charge_order(self: PaymentTask, order: str) -> str:
            return order

        with pytest.raises(PublishRefusedError) as refused:
            charge_order.apply_async(args=("o-1",), task_id="t-misconfigured")
        message = str(refused.value)
        assert "celery_agboss is not configured" in message and "agboss_lease_ttl" in message
        assert "fix that setting" in message and "once the store answers" not in message
        assert "t-misconfigured" not in published
    finally:
        close_test_app(web)


def test_without_the_refusal_an_unrecorded_message_goes_to_the_broker(
    tmp_path: Path, published: list[str]
) -> None:
    web = _publisher(_unreachable_store_url(tmp_path), agboss_payment_tasks=["shop.*"])
    try:
        with sabotage(PUBLISH_WITHOUT_RECORD):
            web.send_task("shop.charge_order", args=("o-1",), task_id="t-unrecorded")
        assert "t-unrecorded" in published, "on the broker, and nowhere in the store"
    finally:
        close_test_app(web)


def test_a_worker_says_how_to_fix_a_publisher_that_recorded_nothing(
    shop: PaymentShop, caplog: pytest.LogCaptureFixture
) -> None:
    plain = Celery("plain-publisher", broker="memory://", set_as_current=False)
    try:
        task_id = str(
            plain.send_task(
                "shop.charge_later", args=("o-3",), queue=shop.app.conf.task_default_queue
            ).id
        )
    finally:
        plain.close()
    charge = shop.call()

    @shop.task()
    def charge_later(self: Any, order: str) -> Any:
        return self.outbound(charge, {"amount": 100, "order": order}, business_key=order)

    with caplog.at_level(logging.WARNING, logger="celery_agboss"), shop.worker():
        shop.wait_state(task_id, "COMPLETED")
        wait_until(
            lambda: "execution.not-recorded-at-publish" in caplog.text, 10, message="the warning"
        )
    assert "agboss_payment_tasks" in caplog.text


# --- one task per execution id ------------------------------------------------------------


def _charged_under(shop: PaymentShop, task_id: str) -> Any:
    charge = shop.call()

    @shop.task()
    def charge_order(self: Any, order: str) -> Any:
        return self.outbound(
            charge, {"amount": 1000, "order": order}, business_key=f"order:{order}"
        )

    @shop.task()
    def refund_order(self: Any, order: str) -> Any:
        raise AssertionError("the refund body must not run under the charge's id")

    assert charge_order.apply(("o-42",), task_id=task_id).get()["id"]
    return refund_order


def test_an_execution_id_belongs_to_one_task(shop: PaymentShop) -> None:
    refund_order = _charged_under(shop, "order-42")
    result = refund_order.apply(("o-42",), task_id="order-42")
    assert result.failed()
    error = result.result
    assert isinstance(error, ExecutionIdConflictError)
    assert "shop.charge_order" in str(error) and "shop.refund_order" in str(error)
    with pytest.raises(ExecutionIdConflictError):
        refund_order.apply_async(("o-42",), task_id="order-42")
    assert shop.execution("order-42").task_name == "shop.charge_order"


def test_without_the_check_the_refund_is_handed_the_charges_receipt(shop: PaymentShop) -> None:
    refund_order = _charged_under(shop, "order-43")
    with sabotage(TASK_NAME_NOT_CHECKED):
        result = refund_order.apply(("o-43",), task_id="order-43")
    assert result.successful() and result.result["object"] == "charge"
