"""A message past its ``expires`` by the worker's clock is dropped only when the database's
clock agrees (design: expires bounds the start): the worker and the sweep ask one rule.

The store here runs five minutes behind this process (``clock_offset_source``), as a
worker whose clock runs five minutes ahead of the database sees it.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from celery_agboss import PaymentTask
from celery_agboss.core.protections import EXPIRY_BY_THE_WORKERS_CLOCK
from celery_agboss.testing import FakeGateway
from celery_agboss.testing.celery_app import close_test_app, make_test_app
from celery_agboss.testing.switches import sabotage
from tests.delivery.conftest import PaymentShop

AHEAD = timedelta(minutes=5)


@pytest.fixture
def skewed(delivery_store_url: str) -> Iterator[PaymentShop]:
    """A shop whose database clock is ``AHEAD`` behind this process's."""
    behind_ms = -int(AHEAD.total_seconds() * 1000)
    app = make_test_app(delivery_store_url, clock_offset_source=lambda: behind_ms)
    gateway = FakeGateway(hold_timeout=20)
    shop = PaymentShop(app=app, clock=None, gateway=gateway)  # type: ignore[arg-type]
    try:
        yield shop
    finally:
        gateway.close()
        close_test_app(app)


def _pay(shop: PaymentShop) -> Any:
    charge = shop.call()

    @shop.app.task(base=PaymentTask, bind=True, shared=False, name="shop.pay")
    def pay(self: Any, order: str) -> Any:
        return self.outbound(charge, {"amount": 1000, "order": order}, business_key=order)

    return pay


def _published_expired_here(shop: PaymentShop, seconds_ago: float) -> str:
    pay = _pay(shop)
    expires = datetime.now(timezone.utc) - timedelta(seconds=seconds_ago)
    with shop.worker():
        task_id = str(pay.apply_async(("o-1",), expires=expires).id)
        shop.wait_state(task_id, "COMPLETED", "EXPIRED")
    return task_id


def test_a_payment_the_database_says_has_time_left_runs(skewed: PaymentShop) -> None:
    task_id = _published_expired_here(skewed, 10)  # 4 min 50 s left on the database
    assert skewed.execution(task_id).state.value == "COMPLETED"
    assert len(skewed.gateway.payments) == 1


def test_a_payment_expired_on_the_database_too_is_dropped(skewed: PaymentShop) -> None:
    task_id = _published_expired_here(skewed, 400)
    assert skewed.execution(task_id).state.value == "EXPIRED"
    assert skewed.gateway.payments == []


def test_twin_the_workers_clock_drops_a_payment_with_time_left(skewed: PaymentShop) -> None:
    with sabotage(EXPIRY_BY_THE_WORKERS_CLOCK):
        task_id = _published_expired_here(skewed, 10)
    assert skewed.execution(task_id).state.value == "EXPIRED"
    assert skewed.gateway.payments == [], "the customer's payment dropped with time left"
