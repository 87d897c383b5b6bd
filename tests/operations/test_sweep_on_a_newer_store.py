"""A sweep whose code is older than its store (a rollback, an old beat left running),
on SQLite and PostgreSQL.

The store's revision is one this version does not ship: a newer version migrated it and
may keep rows by rules this code does not know (as retention now keeps a cancelled
scheduled charge until its ETA). The old sweep's retention went on deleting by its
own, older rules: the row of a scheduled charge cancelled before its ETA went, and at
the ETA the message charged the customer who cancelled. Now the retention step is
skipped on such a store, said once per pass (``sweep.error step=retention
reason=store-newer``); deliveries are unchanged (twin ``retention-on-a-newer-store``).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
from sqlalchemy import text

from celery_agboss.core.executions import ExecutionState
from celery_agboss.core.protections import (
    RETENTION_DELETES_A_SCHEDULED_EXECUTION,
    RETENTION_ON_A_NEWER_STORE,
)
from celery_agboss.testing import sabotage
from tests.delivery import conftest as delivery_world
from tests.delivery.conftest import PaymentShop
from tests.operations import test_retention_of_scheduled_charges as scheduled
from tests.operations.test_retention_of_scheduled_charges import (
    cancel_a_scheduled_renewal,
    deliver_at_its_eta,
)

# The delivery world's fixtures, with the scheduled-charge tests' settings and signal.
delivery_store_url = delivery_world.delivery_store_url
shop = delivery_world.shop
shop_config = scheduled.shop_config
finished = scheduled.finished

NEWER_REVISION = "9999"
"""A revision this version does not ship."""


def _migrated_by_a_newer_version(shop: PaymentShop) -> None:
    with shop.agboss.store.engine.begin() as conn:
        conn.execute(
            text("UPDATE agboss_alembic_version SET version_num = :revision"),
            {"revision": NEWER_REVISION},
        )


def _cancelled_renewal_swept_by_older_rules(shop: PaymentShop, *, skip_off: bool = False) -> str:
    """The sweep of this code, standing for an older version's: it lacks the newer keep
    rule for a scheduled charge (``retention-deletes-a-scheduled-execution``)."""
    with sabotage(RETENTION_DELETES_A_SCHEDULED_EXECUTION):
        if skip_off:
            with sabotage(RETENTION_ON_A_NEWER_STORE):
                return cancel_a_scheduled_renewal(shop)
        return cancel_a_scheduled_renewal(shop)


def test_an_older_sweep_on_a_newer_store_deletes_nothing_and_a_cancelled_charge_stays_unpaid(
    shop: PaymentShop, finished: dict[str, threading.Event], caplog: pytest.LogCaptureFixture
) -> None:
    _migrated_by_a_newer_version(shop)
    with caplog.at_level(logging.WARNING, logger="celery_agboss"):
        execution_id = _cancelled_renewal_swept_by_older_rules(shop)

    deliver_at_its_eta(shop, finished[execution_id])

    assert shop.gateway.requests == []
    assert shop.execution(execution_id).state is ExecutionState.CANCELLED
    skipped = [r for r in caplog.records if getattr(r, "reason", None) == "store-newer"]
    assert len(skipped) == 1, [r.getMessage() for r in caplog.records]  # one per pass
    said = skipped[0].getMessage()
    assert said.startswith("sweep.error") and "step=retention" in said
    assert f"revision={NEWER_REVISION}" in said and "retention skipped" in said


def test_twin_an_older_sweep_deleting_on_a_newer_store_charges_a_cancelled_renewal(
    shop: PaymentShop, finished: dict[str, threading.Event]
) -> None:
    _migrated_by_a_newer_version(shop)
    execution_id = _cancelled_renewal_swept_by_older_rules(shop, skip_off=True)

    deliver_at_its_eta(shop, finished[execution_id])

    assert len(shop.gateway.requests) == 1


def test_deliveries_on_a_newer_store_run_as_before(shop: PaymentShop) -> None:
    """Only retention stops: an order is charged once, as on any store."""
    _migrated_by_a_newer_version(shop)
    charge = shop.call()

    @shop.task()
    def order(self: Any, amount: int) -> Any:
        return self.outbound(charge, {"amount": amount, "order": self.request.id})

    shop.run(order, 500, states=("COMPLETED",))
    report = shop.sweep()

    assert len(shop.gateway.requests) == 1
    assert report.errors == 0
