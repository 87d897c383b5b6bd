"""A recorded execution whose message ran as a plain task ends ``UNMANAGED``, and the
sweep never publishes it again (design: unmanaged, sweep), on both stores, in a worker
thread.

``shop.plain_charge`` is a plain Celery task whose name matches ``agboss_payment_tasks``
(a task being ported, as in a rolling deploy): its publish is recorded ``REQUESTED``, and
the worker that runs it ends it ``UNMANAGED`` before its body charges. Past the requested
grace, sweep after sweep reports nothing republished and the gateway sees one charge.
The twin (``PLAIN_TASK_LEFT_REQUESTED``) leaves it ``REQUESTED``: the first sweep past the
grace reports it republished, and the worker charges the order a second time.
(Real workers and Redis, up to the recovery cap: integration/test_body_publishes.py.)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from celery_agboss.core.protections import PLAIN_TASK_LEFT_REQUESTED
from celery_agboss.testing.celery_app import close_test_app, make_test_app
from celery_agboss.testing.switches import sabotage
from tests.delivery.conftest import PaymentShop
from tests.support.processes import wait_until

GRACE_SECONDS = 60
PATTERNS = ["shop.plain_*"]


@pytest.fixture
def shop_config() -> dict[str, Any]:
    return {"agboss_payment_tasks": PATTERNS, "agboss_requested_grace": GRACE_SECONDS}


@pytest.fixture
def web(delivery_store_url: str, shop: PaymentShop) -> Iterator[Celery]:
    """A web process's app on the shop's store and queue, none of its tasks imported: it
    knows ``shop.plain_charge`` only by the pattern, so its publish is recorded."""
    app = make_test_app(
        delivery_store_url,
        clock_offset_source=shop.clock.offset_ms,
        config={
            "agboss_payment_tasks": PATTERNS,
            "task_default_queue": shop.app.conf.task_default_queue,
        },
    )
    try:
        yield app
    finally:
        close_test_app(app)


def _plain_charge(shop: PaymentShop) -> Any:
    gateway = shop.gateway

    @shop.app.task(shared=False, name="shop.plain_charge")
    def plain_charge(order: str) -> str:
        """Not a PaymentTask: it charges on every run, under a new key each time."""
        runs = sum(1 for p in gateway.payments if p["reference"] == order)
        return str(gateway.charge(1000, f"{order}-run-{runs}", reference=order)["id"])

    return plain_charge


def _charges(shop: PaymentShop, order: str) -> int:
    return sum(1 for p in shop.gateway.payments if p["reference"] == order)


def _ran_once_recorded(shop: PaymentShop, web: Celery, state: str) -> str:
    """The web app publishes the plain task (recorded ``REQUESTED`` by its name); once the
    worker ran it, its execution is ``state``."""
    task_id = str(web.send_task("shop.plain_charge", args=("o-1",)).id)
    assert shop.execution(task_id).task_name == "shop.plain_charge", "recorded at publish"
    wait_until(lambda: _charges(shop, "o-1") == 1, 10, message="the plain task's charge")
    shop.wait_state(task_id, state)
    return task_id


def test_a_plain_task_run_ends_unmanaged_and_the_sweep_never_republishes_it(
    shop: PaymentShop, web: Celery
) -> None:
    _plain_charge(shop)
    with shop.worker():
        task_id = _ran_once_recorded(shop, web, "UNMANAGED")
        for _ in range(3):  # past the grace, again and again
            shop.clock.advance(GRACE_SECONDS + 1)
            report = shop.sweep(claim_tick=False)
            assert report.republished == 0 and task_id not in report.republished_ids
            assert shop.execution(task_id).state.value == "UNMANAGED"
    assert _charges(shop, "o-1") == 1, "one publish, one run"


def test_twin_a_plain_task_left_requested_is_republished_and_charges_twice(
    shop: PaymentShop, web: Celery
) -> None:
    _plain_charge(shop)
    with sabotage(PLAIN_TASK_LEFT_REQUESTED), shop.worker():
        task_id = _ran_once_recorded(shop, web, "REQUESTED")
        assert shop.sweep(claim_tick=False).republished == 0, "within the grace"
        shop.clock.advance(GRACE_SECONDS + 1)
        report = shop.sweep(claim_tick=False)
        assert report.republished == 1 and report.republished_ids == [task_id]
        wait_until(lambda: _charges(shop, "o-1") == 2, 10, message="the re-published run")
        assert shop.execution(task_id).task_name == "shop.plain_charge", "recorded at publish"
    assert _charges(shop, "o-1") == 2, "one publish, two charges"
