"""The sweep's outbox step and one row no key opens (design: outbox leftovers, sealed at rest).

A paid order's follow-up (ship, receipt, ledger post) committed with the payment and
whose own publish was lost is the sweep's to publish. An older row sealed with a key
this process does not hold sorted first in every claim; opening it inside the claim
rolled the claim back, so the step failed on every run, named no row, published none of
the rows behind it and never reached the deletion of published rows: paid, never
shipped, nobody told. The claim reads nothing sealed; the row fails alone, by name,
keeps its claim, and the rows behind it are published. Counted at the broker.
"""

from __future__ import annotations

import logging

import pytest
from sqlalchemy import select

from celery_agboss import outbox
from celery_agboss.store.schema_executions import outbox as outbox_table
from tests.operations.conftest import WorldFactory
from tests.operations.poison import poison, sealed_world, sweep_errors, swept_after
from tests.operations.world import World

GRACE_SECONDS = 30
"""The rows' own grace (``enqueue(grace=…)``)."""


def _enqueue(world: World, order: str) -> str:
    """A follow-up committed in the application's transaction, its publish lost."""
    with world.agboss.store.transaction() as tx:
        return outbox.enqueue(
            tx.connection, "shop.ship", [order], key=f"ship:{order}", grace=GRACE_SECONDS
        )


def _retry_after_seconds(world: World) -> float:
    """How far the sweep's claim moves a row on (``sweep_outbox``)."""
    settings = world.agboss.settings
    return max(2 * settings.sweep_period_ms, settings.lease_ttl_ms) / 1000


def test_a_row_no_key_opens_fails_alone_by_name_and_the_follow_up_behind_it_is_published(
    world_factory: WorldFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    world = sealed_world(world_factory, monkeypatch)
    old = _enqueue(world, "o-old")
    world.clock.advance(1)
    fresh = _enqueue(world, "o-fresh")
    poison(world, outbox_table, outbox_table.c.task_id, old, "args")
    report = swept_after(world, caplog, GRACE_SECONDS + 1)
    assert world.publishes_of(fresh) == 1, "the paid order's follow-up is published"
    assert world.publishes_of(old) == 0
    assert (report.outbox_published, report.errors) == (1, 1)
    assert sweep_errors(caplog, "task_id") == [("outbox", old)], "named by its task id, its key"
    with world.agboss.store.engine.connect() as conn:
        kept = conn.execute(
            select(outbox_table.c.sweep_publishes, outbox_table.c.publish_after_ms).where(
                outbox_table.c.task_id == old
            )
        ).one()
    assert kept.sweep_publishes == 1, "the claim stays"
    assert kept.publish_after_ms > world.agboss.store.now_ms(), "off the head of the claim"

    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="celery_agboss"):
        assert world.sweep().errors == 0, "within its claim it is not read again"
        world.clock.advance(_retry_after_seconds(world) + 1)
        again = world.sweep()
    assert again.errors == 1 and sweep_errors(caplog, "task_id") == [("outbox", old)], (
        "it fails alone again"
    )
    assert world.publishes_of(fresh) == 1, "the published follow-up is never sent again"


def test_published_rows_are_deleted_past_a_row_no_key_opens(
    world_factory: WorldFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = sealed_world(world_factory, monkeypatch)
    done = _enqueue(world, "o-done")
    assert outbox.publish(world.app, done) == [done]
    stuck = _enqueue(world, "o-stuck")
    poison(world, outbox_table, outbox_table.c.task_id, stuck, "kwargs")
    world.clock.advance(world.agboss.settings.fenced_effect_retention_ms / 1000 + 1)
    report = world.sweep()
    assert report.outbox_deleted == 1, "retention still runs"
    assert outbox.read(world.app, done) is None
    assert outbox.count_unpublished(world.app) == 1, "the unopenable row is never deleted"
