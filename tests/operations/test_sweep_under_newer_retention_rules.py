"""A sweep whose retention rules are older than its store's, with no migration between
them (an old beat left running through an upgrade whose keep rules changed alone, as the
ETA keep rule did), on SQLite and PostgreSQL.

The guard "a sweep older than its store skips retention" compared Alembic revisions
only: the store's revision was one the old version ships, so its retention deleted by
its older rules: the row of a scheduled charge cancelled before its ETA went, and at the
ETA the message charged the customer who cancelled. Now every version records its
retention-rules generation in ``agboss_meta`` (``migrate``, and its sweep), and a sweep
that finds a higher one skips retention, said once per pass (``sweep.error
step=retention reason=rules-newer``; twin ``retention-on-a-newer-store``).
"""

from __future__ import annotations

import logging
import threading

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


def _cancelled_renewal_swept_by_older_rules(shop: PaymentShop, *, skip_off: bool = False) -> str:
    """The sweep of this code, standing for an older version's: it lacks the keep rule
    for a scheduled charge (``retention-deletes-a-scheduled-execution``)."""
    with sabotage(RETENTION_DELETES_A_SCHEDULED_EXECUTION):
        if skip_off:
            with sabotage(RETENTION_ON_A_NEWER_STORE):
                return cancel_a_scheduled_renewal(shop)
        return cancel_a_scheduled_renewal(shop)


def test_an_older_sweep_under_newer_keep_rules_deletes_nothing_and_a_cancelled_charge_stays_unpaid(
    shop: PaymentShop, finished: dict[str, threading.Event], caplog: pytest.LogCaptureFixture
) -> None:
    _recorded(shop, NEWER)  # the store's revision is this version's own
    with caplog.at_level(logging.WARNING, logger="celery_agboss"):
        execution_id = _cancelled_renewal_swept_by_older_rules(shop)

    deliver_at_its_eta(shop, finished[execution_id])

    assert shop.gateway.requests == []
    assert shop.execution(execution_id).state is ExecutionState.CANCELLED
    skipped = [r for r in caplog.records if getattr(r, "reason", None) == "rules-newer"]
    assert len(skipped) == 1, [r.getMessage() for r in caplog.records]  # one per pass
    said = skipped[0].getMessage()
    assert said.startswith("sweep.error") and "step=retention" in said
    assert f"generation={NEWER}" in said and f"ours={RETENTION_RULES_GENERATION}" in said
    assert _generation(shop) == str(NEWER)  # never lowered


def test_twin_an_older_sweep_deleting_under_newer_keep_rules_charges_a_cancelled_renewal(
    shop: PaymentShop, finished: dict[str, threading.Event]
) -> None:
    _recorded(shop, NEWER)
    execution_id = _cancelled_renewal_swept_by_older_rules(shop, skip_off=True)

    deliver_at_its_eta(shop, finished[execution_id])

    assert len(shop.gateway.requests) == 1


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
