"""Two ``AGBoss`` apps in one process: the shop's, and another on a store of its own whose
``agboss_payment_tasks`` happen to match the shop's task names (``shop.*``).

A publish through the shop's own ``send_task`` of the shop's own ``PaymentTask`` is the
shop's: its app records and checks it. The other app took it too: the library's retry of
a charge whose answer was lost, published under the execution's own id from inside the
body, was refused there as "a new id from a body", so the paid order never completed
(found by a test that left such an app connected). Now the other app leaves it alone
(twin ``other-apps-own-publish-taken``: the execution stays ``WAITING``, paid). A body's
publish through another app of a task that app does not take for its own is still
refused (tests/delivery/test_publish_refusals_of_a_body.py). Both stores, counted at the
fake gateway.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_agboss import AGBoss
from celery_agboss.core.protections import OTHER_APPS_OWN_PUBLISH_TAKEN
from celery_agboss.store.migrate import migrate
from celery_agboss.testing import sabotage
from celery_agboss.testing.celery_app import close_test_app, make_test_app
from celery_agboss.testing.gateway_types import FakeGatewayFault
from celery_agboss.testing.stores import sqlite_store_url
from tests.delivery.conftest import PaymentShop
from tests.support.processes import assert_stays

STUCK_SECONDS = 3.0
"""How long the twin watches the paid execution not complete: the protected run
completes within about a second (a 1 s retry delay)."""


@pytest.fixture
def other_app(tmp_path: Path) -> Iterator[Celery]:
    """The other app, its settings read (as at its first publish)."""
    directory = tmp_path / "other"
    directory.mkdir()
    url = sqlite_store_url(directory)
    migrate(url)
    app = make_test_app(url, config={"agboss_payment_tasks": ["shop.*"]})
    AGBoss.of(app).settings  # noqa: B018 - read, so its patterns are live
    yield app
    close_test_app(app)


def _pay_with_its_answer_lost(shop: PaymentShop) -> Any:
    charge = shop.call()

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        return self.outbound(charge, {"amount": 1000, "order": order}, business_key=order)

    shop.gateway.inject_fault(FakeGatewayFault.ANSWER_THEN_DROP, operation="charge")
    return pay


def test_the_shops_retry_is_the_shops_and_the_paid_order_completes(
    shop: PaymentShop, other_app: Celery
) -> None:
    pay = _pay_with_its_answer_lost(shop)
    task_id = shop.run(pay, "o-1", states=("COMPLETED", "WAITING_OPERATOR", "FAILED"), timeout=30)
    assert shop.execution(task_id).state.value == "COMPLETED"
    assert len(shop.gateway.payments) == 1
    assert AGBoss.of(other_app).executions.read_execution(task_id) is None


def test_twin_taken_by_the_other_app_the_paid_order_never_completes(
    shop: PaymentShop, other_app: Celery
) -> None:
    pay = _pay_with_its_answer_lost(shop)
    with sabotage(OTHER_APPS_OWN_PUBLISH_TAKEN), shop.worker():
        task_id = shop.deliver(pay, "o-1", states=("WAITING",), timeout=30)
        assert_stays(lambda: shop.execution(task_id).state.value == "WAITING", STUCK_SECONDS)
    assert len(shop.gateway.payments) == 1, "charged, and never completed"
