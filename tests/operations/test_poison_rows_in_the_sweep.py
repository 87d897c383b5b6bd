"""The sweep's re-drive, held-messages and expiry steps, and one row no key opens
(design: re-drive, held messages, sweep expires, sealed at rest).

An older execution sealed with a key this process does not hold sorted first in every
listing, and the listing (or the claim, or the expiry's one transaction for every row)
opened it: each step failed on every run, naming no row, and nothing behind it was
re-driven (a dead worker's charge never continued) or expired. The steps list, claim
and expire by the columns never sealed; the row fails alone, by name, keeps its claim,
and the rows behind it are handled. Counted at the broker.
"""

from __future__ import annotations

import logging

import pytest
from sqlalchemy import select, update

from celery_agboss.core.executions import ExecutionState
from celery_agboss.core.protections import UNOPENED_REDRIVE_UNCOUNTED
from celery_agboss.store.held_messages import read_held, write_held
from celery_agboss.store.redrive_and_expiry import UNSEALED_COLUMNS
from celery_agboss.store.schema_executions import executions
from celery_agboss.store.sealed_columns import SEALED_COLUMNS
from celery_agboss.testing.switches import sabotage
from tests.operations.conftest import WorldFactory
from tests.operations.poison import poison, sealed_world, sweep_errors, swept_after
from tests.operations.world import CAP, GRACE_SECONDS, TTL_SECONDS, World

_e = executions.c


def _row(world: World, execution_id: str) -> tuple[ExecutionState, int, int | None]:
    """What an unopenable row shows: its state, recovery count and ``not_before``."""
    with world.agboss.store.engine.connect() as conn:
        row = conn.execute(
            select(_e.state, _e.recovery_count, _e.not_before_ms).where(_e.id == execution_id)
        ).one()
    return ExecutionState(row.state), int(row.recovery_count), row.not_before_ms


def _two(world: World, **options: object) -> tuple[str, str]:
    """An older execution sealed with a dropped key, and a healthy one behind it."""
    old = world.publish("o-old", **options)
    world.clock.advance(1)
    fresh = world.publish("o-fresh", **options)
    poison(world, executions, _e.id, old, "args")
    return old, fresh


def test_the_listing_reads_no_sealed_column() -> None:
    sealed = set(SEALED_COLUMNS[executions.name][1])
    assert not sealed & {column.name for column in UNSEALED_COLUMNS}


def test_redrive_a_row_no_key_opens_fails_alone_by_name_keeps_its_claim_and_parks_at_the_cap(
    world_factory: WorldFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    world = sealed_world(world_factory, monkeypatch)
    old, fresh = _two(world)
    report = swept_after(world, caplog, GRACE_SECONDS + 1)
    assert world.publishes_of(fresh) == 2, "the message lost behind it is published again"
    assert world.publishes_of(old) == 1
    assert (report.republished, report.errors) == (1, 1)
    assert sweep_errors(caplog, "execution_id") == [("redrive", old)], "named by its execution id"
    state, count, not_before = _row(world, old)
    assert (state, count) == (ExecutionState.REQUESTED, 1), "the claim stays, counted"
    assert not_before is not None and not_before > world.agboss.store.now_ms()

    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="celery_agboss"):
        assert world.sweep().errors == 0, "within its claim it is not read again"
        for _ in range(CAP - 1):
            world.clock.advance(GRACE_SECONDS + 1)
            world.sweep()
    assert sweep_errors(caplog, "execution_id") == [("redrive", old)] * (CAP - 1), (
        "it fails alone again"
    )
    world.clock.advance(GRACE_SECONDS + 1)
    assert world.sweep().parked == 2, "the healthy row, re-driven as often, parks too"
    assert _row(world, old)[:2] == (ExecutionState.PARKED, CAP), "parked as any other"
    assert world.publishes_of(old) == 1


def test_a_taken_over_or_planned_row_no_key_opens_is_counted_each_run_and_parks_at_the_cap(
    world_factory: WorldFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A dead worker's ``RUNNING`` row, and an undo's planned wait: their claim counts no
    recovery (a take-over is counted when its delivery starts; a planned end is none),
    and their message is never published, so nothing counted them: claimed and failing
    every run, never parked. Each failed read counts one (design: recovery cap)."""
    world = sealed_world(world_factory, monkeypatch)
    dead = world.publish("o-dead")
    world.start(dead)
    world.die()
    undo = world.publish("o-undo")
    now = world.agboss.store.now_ms()
    with world.agboss.store.engine.begin() as conn:
        conn.execute(
            update(executions)
            .where(_e.id == undo)
            .values(
                state=ExecutionState.COMPENSATING.value,
                started_at_ms=now,
                redrive_planned=True,
                not_before_ms=now,
            )
        )
    for execution_id in (dead, undo):
        poison(world, executions, _e.id, execution_id, "args")
    with caplog.at_level(logging.ERROR, logger="celery_agboss"):
        for _ in range(CAP):
            world.clock.advance(GRACE_SECONDS + TTL_SECONDS + 1)
            assert world.sweep().errors == 2
    assert sorted(sweep_errors(caplog, "execution_id")) == sorted(
        [("redrive", dead), ("redrive", undo)] * CAP
    )
    assert _row(world, dead)[:2] == (ExecutionState.RUNNING, CAP), "each failed read counted"
    assert _row(world, undo)[:2] == (ExecutionState.COMPENSATING, CAP)
    world.clock.advance(GRACE_SECONDS + TTL_SECONDS + 1)
    assert world.sweep().parked == 2
    assert _row(world, dead)[:2] == (ExecutionState.PARKED, CAP), "parked as any other"
    assert _row(world, undo)[:2] == (ExecutionState.PARKED, CAP)
    assert (world.publishes_of(dead), world.publishes_of(undo)) == (1, 1)


def test_twin_an_uncounted_row_no_key_opens_fails_every_run_and_never_parks(
    world_factory: WorldFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sabotage twin: the failed read counts nothing; the dead worker's execution is
    claimed and fails every run, and never reaches ``PARKED``, where an operator sees it."""
    world = sealed_world(world_factory, monkeypatch)
    dead = world.publish("o-dead")
    world.start(dead)
    world.die()
    poison(world, executions, _e.id, dead, "args")
    with sabotage(UNOPENED_REDRIVE_UNCOUNTED):
        for _ in range(CAP + 1):
            world.clock.advance(GRACE_SECONDS + TTL_SECONDS + 1)
            report = world.sweep()
            assert (report.errors, report.parked) == (1, 0)
    assert _row(world, dead)[:2] == (ExecutionState.RUNNING, 0), "never counted, never parked"


def test_a_dead_workers_charge_is_continued_past_a_row_no_key_opens(
    world_factory: WorldFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The charge was sent, its answer lost, its worker died: the sweep looks it up and
    publishes the execution again, though an older row sorts first."""
    world = sealed_world(world_factory, monkeypatch)
    old = world.publish("o-old")
    world.clock.advance(GRACE_SECONDS + 1)
    world.sweep()  # the older row's own re-drive: it sorts first from now on
    fresh = world.publish("o-fresh")
    world.strand(fresh)
    poison(world, executions, _e.id, old, "args")
    before = world.publishes_of(fresh)
    with caplog.at_level(logging.ERROR, logger="celery_agboss"):
        world.clock.advance(GRACE_SECONDS + 1)
        world.sweep()
    assert world.publishes_of(fresh) == before + 1, "the dead worker's charge goes on"
    assert sweep_errors(caplog, "execution_id") == [("redrive", old)]


def test_a_dead_workers_held_messages_go_out_past_a_row_no_key_opens(
    world_factory: WorldFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    world = sealed_world(world_factory, monkeypatch)
    first, second = sorted([world.publish("o-a"), world.publish("o-b")])
    poison(world, executions, _e.id, first, "args")  # the first of the dead worker's row
    write_held(world.agboss.store, "dead-worker", [first, second])
    world.clock.advance(TTL_SECONDS + 1)  # dead; well within the requested grace
    with caplog.at_level(logging.ERROR, logger="celery_agboss"):
        report = world.sweep()
    assert world.publishes_of(second) == 2, "published at once, not after the grace"
    assert world.publishes_of(first) == 1
    assert (report.errors, sweep_errors(caplog, "execution_id")) == (1, [("held", first)])
    assert read_held(world.agboss.store) == [], "the dead worker's row is forgotten"
    assert world.sweep().errors == 0, "not read again before its grace"


def test_expiry_goes_on_past_a_row_no_key_opens(
    world_factory: WorldFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing sealed decides an expiry: the unopenable row expires too."""
    world = sealed_world(world_factory, monkeypatch)
    old, fresh = _two(world, expires=5)
    world.clock.advance(10)
    report = world.sweep()
    assert (report.expired, report.errors) == (2, 0)
    assert world.execution(fresh).state is ExecutionState.EXPIRED
    assert _row(world, old)[0] is ExecutionState.EXPIRED


def test_one_expiry_that_fails_rolls_none_of_the_others_back(
    world: World, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    old = world.publish("o-old", expires=5)
    world.clock.advance(1)
    fresh = world.publish("o-fresh", expires=5)
    world.clock.advance(10)
    executions_ = world.agboss.executions
    expire_if_due = executions_.expire_if_due

    def failing(execution_id: str) -> object:
        if execution_id == old:
            raise RuntimeError("the store failed on this row")
        return expire_if_due(execution_id)

    monkeypatch.setattr(executions_, "expire_if_due", failing)
    with caplog.at_level(logging.ERROR, logger="celery_agboss"):
        report = world.sweep()
    assert (report.expired, report.errors) == (1, 1)
    assert world.execution(fresh).state is ExecutionState.EXPIRED
    assert world.execution(old).state is ExecutionState.REQUESTED, "the next run's"
    failed = [r for r in caplog.records if getattr(r, "event", None) == "sweep.error"]
    assert [(r.__dict__.get("step"), r.__dict__.get("execution_id")) for r in failed] == [
        ("expire", old)
    ]
