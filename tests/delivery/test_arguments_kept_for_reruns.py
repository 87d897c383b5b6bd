"""Every re-run of a PaymentTask is sent from the arguments the store kept (a long
retry, a take-over, the sweep's re-drive), as kombu's JSON. Under the JSON serializer
the first run gets exactly that; under pickle it got the originals, and a dict with int
keys came back with str keys: another request, its replay refused, the paid execution
FAILED and its undo refunding the good charge. Such arguments are refused at publish
(nothing sent); JSON-shaped ones run and re-run alike. Arguments JSON cannot hold at all
(a set) were published unrecorded: refused too.
"""

from __future__ import annotations

from typing import Any

import pytest

from celery_agboss.core.protections import ARGUMENTS_CHANGED_BY_JSON_ACCEPTED
from celery_agboss.errors import PublishRefusedError
from celery_agboss.task import undo_function
from celery_agboss.testing.switches import sabotage
from tests.delivery.conftest import PaymentShop

PICKLE = {
    "task_serializer": "pickle",
    "accept_content": ["pickle", "json"],
    "result_accept_content": ["pickle", "json"],
}


@pytest.fixture
def shop_config() -> dict[str, Any]:
    return PICKLE


def _pay_with_a_long_retry(shop: PaymentShop) -> Any:
    charge, refund = shop.call(), shop.refund_call()

    @undo_function(shop.app, "refund-charge")
    def refund_charge(task: Any, undo: Any, payment: str) -> None:
        task.outbound(refund, {"payment": payment})

    @shop.task()
    def pay(self: Any, order: str, lines: dict[Any, int]) -> Any:
        request = {
            "amount": 1000,
            "order": order,
            "lines": [{"sku": sku, "qty": qty} for sku, qty in sorted(lines.items())],
        }
        receipt = self.outbound(charge, request, business_key=order)
        self.undo_with("refund-charge", payment=receipt["id"])
        if self.request.retries == 0:
            raise self.retry(countdown=7200)  # the shipping API is down: in two hours
        return receipt

    return pay


def test_arguments_json_changes_are_refused_at_publish_under_pickle(shop: PaymentShop) -> None:
    pay = _pay_with_a_long_retry(shop)
    with pytest.raises(PublishRefusedError, match="do not come back the same"):
        pay.delay("o-1", {101: 2, 205: 1})
    assert shop.gateway.requests == []


def test_json_shaped_arguments_re_run_as_the_first_run_under_pickle(shop: PaymentShop) -> None:
    pay = _pay_with_a_long_retry(shop)
    with shop.worker():
        task_id = str(pay.delay("o-1", {"101": 2, "205": 1}).id)
        shop.wait_state(task_id, "WAITING")
        shop.clock.advance(7300)
        assert shop.sweep().republished == 1
        record = shop.wait_state(task_id, "COMPLETED", "FAILED", "WAITING_OPERATOR", timeout=30)
    assert record.state.value == "COMPLETED", record.reason
    assert len(shop.gateway.payments) == 1
    assert shop.gateway.refunds == []


def test_arguments_json_cannot_hold_are_refused_not_published_unrecorded(
    shop: PaymentShop,
) -> None:
    pay = _pay_with_a_long_retry(shop)
    with pytest.raises(PublishRefusedError, match="cannot be kept in the store as JSON"):
        pay.delay("o-1", {"skus": {"a", "b"}})
    assert shop.gateway.requests == []


def test_twin_accepted_the_re_run_refunds_the_good_charge(shop: PaymentShop) -> None:
    pay = _pay_with_a_long_retry(shop)
    with sabotage(ARGUMENTS_CHANGED_BY_JSON_ACCEPTED), shop.worker():
        task_id = str(pay.delay("o-1", {101: 2, 205: 1}).id)
        shop.wait_state(task_id, "WAITING")
        shop.clock.advance(7300)
        assert shop.sweep().republished == 1
        record = shop.wait_state(task_id, "COMPLETED", "FAILED", "WAITING_OPERATOR", timeout=30)
    assert record.state.value == "FAILED", "its replay refused: another request"
    assert len(shop.gateway.payments) == 1
    assert len(shop.gateway.refunds) == 1, "the good charge refunded"
