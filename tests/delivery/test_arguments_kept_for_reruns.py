"""Every re-run of a PaymentTask is sent from the arguments the store kept (a long
retry, a take-over, the sweep's re-drive), as kombu's JSON. Under the JSON serializer
the first run gets exactly that; under pickle it got the originals, and a dict with int
keys came back with str keys: another request, its replay refused, the paid execution
FAILED and its undo refunding the good charge. Now every run, the first included, gets
the store's copy (a chain step built from a result too). Arguments JSON cannot hold at
all (a set) were published unrecorded: refused at publish.
"""

from __future__ import annotations

from typing import Any

import pytest
from celery import chain

from celery_agboss.core.protections import FIRST_RUN_GETS_UNKEPT_ARGUMENTS
from celery_agboss.errors import PublishRefusedError
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


def _pay_with_a_long_retry(shop: PaymentShop, seen: list[Any]) -> Any:
    charge, refund = shop.call(), shop.refund_call()

    shop.refund_undo(refund)

    @shop.task()
    def pay(self: Any, order: str, lines: dict[Any, int]) -> Any:
        seen.append(lines)
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


def _paid_retried_and_redriven(shop: PaymentShop, lines: dict[Any, int]) -> tuple[Any, list[Any]]:
    seen: list[Any] = []
    pay = _pay_with_a_long_retry(shop, seen)
    with shop.worker():
        task_id = str(pay.delay("o-1", lines).id)
        shop.wait_state(task_id, "WAITING")
        shop.clock.advance(7300)
        assert shop.sweep().republished == 1
        record = shop.wait_state(task_id, "COMPLETED", "FAILED", "WAITING_OPERATOR", timeout=30)
    return record, seen


@pytest.mark.parametrize("lines", [{101: 2, 205: 1}, {"101": 2, "205": 1}], ids=["int", "str"])
def test_a_re_run_under_pickle_gets_what_the_first_run_got(
    shop: PaymentShop, lines: dict[Any, int]
) -> None:
    record, seen = _paid_retried_and_redriven(shop, lines)
    assert record.state.value == "COMPLETED", record.reason
    assert seen == [{"101": 2, "205": 1}] * 2, "every run gets the store's copy"
    assert len(shop.gateway.payments) == 1
    assert shop.gateway.refunds == []


def test_a_chain_step_built_from_an_int_keyed_result_runs(shop: PaymentShop) -> None:
    charge = shop.call()

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        self.outbound(charge, {"amount": 1000, "order": order}, business_key=order)
        return {101: 2}

    @shop.task()
    def ship(self: Any, items: Any) -> Any:
        return self.outbound(charge, {"amount": 7, "order": f"ship-{sorted(items)}"})

    with shop.worker():
        result = chain(pay.s("o-1"), ship.s()).apply_async()
        shop.wait_state(str(result.id), "COMPLETED")
    assert sorted(p["amount"] for p in shop.gateway.payments) == [7, 1000]


def test_arguments_json_cannot_hold_are_refused_not_published_unrecorded(
    shop: PaymentShop,
) -> None:
    pay = _pay_with_a_long_retry(shop, [])
    with pytest.raises(PublishRefusedError, match="cannot be kept in the store as JSON"):
        pay.delay("o-1", {"skus": {"a", "b"}})
    assert shop.gateway.requests == []


def test_twin_the_first_run_given_the_originals_refunds_the_good_charge(
    shop: PaymentShop,
) -> None:
    with sabotage(FIRST_RUN_GETS_UNKEPT_ARGUMENTS):
        record, seen = _paid_retried_and_redriven(shop, {101: 2, 205: 1})
    assert seen[0] == {101: 2, 205: 1} and seen[1] == {"101": 2, "205": 1}
    assert record.state.value == "FAILED", "its replay refused: another request"
    assert len(shop.gateway.payments) == 1
    assert len(shop.gateway.refunds) == 1, "the good charge refunded"
