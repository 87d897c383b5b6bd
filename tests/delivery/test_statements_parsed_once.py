"""Every statement a delivery sends on PostgreSQL is short enough for psycopg to keep its
parsing: psycopg turns a statement's named placeholders into PostgreSQL's own once per
text, but only for texts up to ``MAX_CACHED_STATEMENT_LENGTH`` bytes (4,096); a longer
one is parsed again on every call (about 0.1 ms of the worker's CPU, on each delivery).
The claim grew past it unnoticed once; this keeps the hot path's texts under it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg._queries
import pytest

from celery_agboss.testing.gateway_types import FakeGatewayError, FakeGatewayFault
from tests.delivery.conftest import PaymentShop
from tests.support.lock_waits import sent_statements
from tests.support.stores import fresh_store_url

PARSE_CACHED_UP_TO = int(getattr(psycopg._queries, "MAX_CACHED_STATEMENT_LENGTH", 4096))


@pytest.fixture(params=[pytest.param("postgresql", marks=pytest.mark.postgres)])
def delivery_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return fresh_store_url(request, tmp_path, "delivery-migrated")


def test_a_charge_a_decline_and_an_effect_send_only_texts_psycopg_keeps_parsed(
    shop: PaymentShop,
) -> None:
    charge = shop.call()

    @shop.task()
    def pay(task: Any, order: str) -> Any:
        receipt = task.outbound(charge, {"amount": 500, "order": order}, business_key=order)
        task.fenced_effect("mark-paid", lambda conn: None, business_key=order)
        return receipt["id"]

    @shop.task()
    def pay_declined(task: Any, order: str) -> Any:
        try:
            task.outbound(charge, {"amount": 700, "order": order}, business_key=order)
        except FakeGatewayError:
            return "declined"
        return "charged"

    def deliveries() -> None:
        # Published first (the publish record), then delivered here: what a worker runs.
        for task, order in ((pay, "order-1"), (pay_declined, "order-2")):
            task_id = str(task.apply_async((order,)).id)
            if task is pay_declined:
                shop.gateway.inject_fault(FakeGatewayFault.DECLINE, operation="charge")
            result = task.apply((order,), task_id=task_id)
            assert result.state == "SUCCESS", result.result

    sent = [text for text, _ in sent_statements(shop.agboss.store.engine, deliveries)]
    assert len(sent) >= 8  # two publishes, two starts, two claims, two settles, ...
    too_long = {len(s): s[:120] for s in sent if len(s.encode()) > PARSE_CACHED_UP_TO}
    assert too_long == {}, f"longer than {PARSE_CACHED_UP_TO} bytes: {too_long}"
