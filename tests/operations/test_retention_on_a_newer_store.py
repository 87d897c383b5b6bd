"""A sweep whose retention rules are older than its store's (a rollback, an old beat
left running through an upgrade), on SQLite and PostgreSQL.

A newer version may keep rows by rules this code does not know (as retention now keeps
a cancelled scheduled charge until its ETA). An old sweep's retention went on deleting
by its own, older rules: the row of a scheduled charge cancelled before its ETA went,
and at the ETA the message charged the customer who cancelled. Two ways a sweep learns
its store is newer, and both now skip the retention step, said once per pass:
- the store's Alembic revision is one this version does not ship (``sweep.error
  step=retention reason=store-newer``);
- the revision is one it ships, but the retention-rules generation every version
  records in ``agboss_meta`` (``migrate``, and its sweep) is higher than its own: a keep
  rule changed alone, as the ETA keep rule did (``reason=rules-newer``).
Deliveries are unchanged (twin ``retention-on-a-newer-store``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import text

from celery_agboss.core.executions import ExecutionState
from celery_agboss.core.protections import (
    RETENTION_DELETES_A_SCHEDULED_EXECUTION,
    RETENTION_ON_A_NEWER_STORE,
)
from celery_agboss.store.migrate import RETENTION_GENERATION_KEY
from celery_agboss.store.retention import RETENTION_RULES_GENERATION
from celery_agboss.testing import sabotage
from tests.delivery.conftest import PaymentShop
from tests.operations import test_retention_of_scheduled_charges as scheduled
from tests.operations.test_retention_of_scheduled_charges import (
    cancel_a_scheduled_renewal,
    deliver_at_its_eta,
)

# The scheduled-charge tests' settings and signal, with the delivery folder's shop.
shop_config = scheduled.shop_config
finished = scheduled.finished

NEWER_REVISION = "9999"
"""A revision this version does not ship."""
NEWER = RETENTION_RULES_GENERATION + 1
"""The generation of a version whose keep rules this one lacks."""


def _generation(shop: PaymentShop) -> str | None:
    with shop.agboss.store.engine.connect() as conn:
        found = conn.execute(
            text("SELECT value FROM agboss_meta WHERE key = :key"),
            {"key": RETENTION_GENERATION_KEY},
        )
        value = found.scalar()
    return None if value is None else str(value)


def _recorded(shop: PaymentShop, generation: int | None) -> None:
    """The store's generation row as ``generation`` (None: no row, a store from before)."""
    with shop.agboss.store.engine.begin() as conn:
        conn.execute(
            text("DELETE FROM agboss_meta WHERE key = :key"), {"key": RETENTION_GENERATION_KEY}
        )
        if generation is not None:
            conn.execute(
                text("INSERT INTO agboss_meta (key, value, updated_at_ms) VALUES (:k, :v, 0)"),
                {"k": RETENTION_GENERATION_KEY, "v": str(generation)},
            )


def _migrated_by_a_newer_version(shop: PaymentShop) -> None:
    with shop.agboss.store.engine.begin() as conn:
        conn.execute(
            text("UPDATE agboss_alembic_version SET version_num = :revision"),
            {"revision": NEWER_REVISION},
        )


@dataclass(frozen=True)
class Newer:
    """One way a store is newer than the sweep: how it is made so, and what is said."""

    make: Callable[[PaymentShop], None]
    reason: str
    said: tuple[str, ...]


NEWER_STORES = {
    "by-revision": Newer(
        _migrated_by_a_newer_version,
        "store-newer",
        (f"revision={NEWER_REVISION}", "retention skipped"),
    ),
    "by-rules-generation": Newer(
        lambda shop: _recorded(shop, NEWER),  # the store's revision is this version's own
        "rules-newer",
        (f"generation={NEWER}", f"ours={RETENTION_RULES_GENERATION}"),
    ),
}


@pytest.fixture(params=sorted(NEWER_STORES))
def newer(request: pytest.FixtureRequest, shop: PaymentShop) -> Newer:
    chosen = NEWER_STORES[request.param]
    chosen.make(shop)
    return chosen


def _cancelled_renewal_swept_by_older_rules(shop: PaymentShop, *, skip_off: bool = False) -> str:
    """The sweep of this code, standing for an older version's: it lacks the keep rule
    for a scheduled charge (``retention-deletes-a-scheduled-execution``)."""
    with sabotage(RETENTION_DELETES_A_SCHEDULED_EXECUTION):
        if skip_off:
            with sabotage(RETENTION_ON_A_NEWER_STORE):
                return cancel_a_scheduled_renewal(shop)
        return cancel_a_scheduled_renewal(shop)


def test_an_older_sweep_on_a_newer_store_deletes_nothing_and_a_cancelled_charge_stays_unpaid(
    shop: PaymentShop,
    newer: Newer,
    finished: dict[str, threading.Event],
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="celery_agboss"):
        execution_id = _cancelled_renewal_swept_by_older_rules(shop)

    deliver_at_its_eta(shop, finished[execution_id])

    assert shop.gateway.requests == []
    assert shop.execution(execution_id).state is ExecutionState.CANCELLED
    skipped = [r for r in caplog.records if getattr(r, "reason", None) == newer.reason]
    assert len(skipped) == 1, [r.getMessage() for r in caplog.records]  # one per pass
    said = skipped[0].getMessage()
    assert said.startswith("sweep.error") and "step=retention" in said
    assert all(words in said for words in newer.said), said


def test_twin_an_older_sweep_deleting_on_a_newer_store_charges_a_cancelled_renewal(
    shop: PaymentShop, newer: Newer, finished: dict[str, threading.Event]
) -> None:
    execution_id = _cancelled_renewal_swept_by_older_rules(shop, skip_off=True)

    deliver_at_its_eta(shop, finished[execution_id])

    assert len(shop.gateway.requests) == 1


def test_a_newer_generation_is_never_lowered(shop: PaymentShop) -> None:
    _recorded(shop, NEWER)

    shop.sweep()

    assert _generation(shop) == str(NEWER)


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


def test_a_store_from_before_the_generation_is_retained_and_given_this_versions(
    shop: PaymentShop, finished: dict[str, threading.Event]
) -> None:
    """No row: the rules of the version before, older than this one's; retention runs
    (by this version's rules: the cancelled renewal keeps its row) and the row is
    recorded, so an older sweep still running stops deleting."""
    _recorded(shop, None)
    execution_id = cancel_a_scheduled_renewal(shop)

    assert _generation(shop) == str(RETENTION_RULES_GENERATION)
    deliver_at_its_eta(shop, finished[execution_id])
    assert shop.gateway.requests == []


def test_a_lower_generation_is_raised_and_retention_runs(shop: PaymentShop) -> None:
    _recorded(shop, RETENTION_RULES_GENERATION - 1)

    report = shop.sweep()

    assert report.errors == 0
    assert _generation(shop) == str(RETENTION_RULES_GENERATION)
