"""The application's retry budget after a re-publish (design: what Celery records).

The package's own retries (an unknown outcome's) are counted in the ``agboss_retries``
header, outside the application's ``max_retries``. Once they are spent, the stored
``WAITING`` and the sweep continue the execution; the sweep's re-publish starts the
package's budget again but keeps the count, so the application's first ``self.retry()``
after it is still its first: the payment completes, charged once. Dropping the count on
re-publish (the twin) counts every earlier package retry as the application's, whose
first ``self.retry()`` then gives up and fails a paid order.
"""

from __future__ import annotations

from typing import Any

from celery import signals as celery_signals

from celery_agboss.core.protections import REPUBLISH_FORGETS_OWN_RETRIES
from celery_agboss.delivery.waits import PACKAGE_RETRY_BUDGET
from celery_agboss.testing.switches import sabotage
from tests.delivery.conftest import PaymentShop
from tests.support.processes import wait_until


def _unknown_past_the_budget_then_redriven_then_retried(shop: PaymentShop) -> str:
    """Every send times out before the gateway processes it until the package's own
    retries are spent and the last delivery leaves the execution ``WAITING``; the sweep
    re-drives it. Its send times out once more: the re-publish started the package's
    budget again, so that is retried through the broker (no second sweep runs here). The
    next delivery pays, and the body then asks for its one retry (``max_retries=1``: e.g.
    the warehouse is not ready yet)."""
    charge = shop.call()
    asked: list[int] = []
    seen: list[int] = []

    @shop.task(max_retries=1)
    def pay(self: Any, order: str) -> Any:
        receipt = self.outbound(charge, {"amount": 1000, "order": order}, business_key=order)
        seen.append(int(self.request.retries or 0))
        if not asked:
            asked.append(1)
            raise self.retry(countdown=0.1)
        return receipt

    ended: list[str] = []

    def record_the_end(task_id: Any = None, **_: Any) -> None:
        ended.append(str(task_id))

    unknown = PACKAGE_RETRY_BUDGET + 1  # five retried through the broker, one left waiting
    shop.gateway.hold(before_processing=True, operation="charge", times=unknown + 1, timeout=0.3)
    celery_signals.task_postrun.connect(record_the_end, weak=False)
    try:
        with shop.worker():
            task_id = str(pay.delay("o-redriven").id)
            wait_until(
                lambda: ended.count(task_id) == unknown,
                40,
                message="the package's own retries to be spent",
            )
            assert shop.execution(task_id).state.value == "WAITING"
            assert shop.gateway.payments == [], "nothing processed yet"
            shop.clock.advance(3600)
            assert shop.sweep().republished == 1
            shop.wait_state(task_id, "COMPLETED", "FAILED", timeout=30)
    finally:
        celery_signals.task_postrun.disconnect(record_the_end)
    assert asked, "the re-driven delivery paid and asked for its retry"
    # What the body sees in ``self.request.retries`` counts every retry, as before it.
    assert seen[0] == PACKAGE_RETRY_BUDGET + 1, seen
    return task_id


def test_a_redriven_execution_keeps_the_applications_retry(shop: PaymentShop) -> None:
    task_id = _unknown_past_the_budget_then_redriven_then_retried(shop)
    assert shop.execution(task_id).state.value == "COMPLETED"
    assert len(shop.gateway.payments) == 1


def test_forgetting_the_packages_retries_fails_a_paid_order(shop: PaymentShop) -> None:
    with sabotage(REPUBLISH_FORGETS_OWN_RETRIES):
        task_id = _unknown_past_the_budget_then_redriven_then_retried(shop)
    assert shop.execution(task_id).state.value == "FAILED", "its first retry was refused"
    assert len(shop.gateway.payments) == 1
