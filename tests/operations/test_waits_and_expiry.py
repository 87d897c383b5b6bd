"""What a waiting execution is owed: its ``expires`` no longer applies once it started
(design: expires bounds the start), and its planned waits are no recoveries
(design: recovery cap).

A task published with ``expires`` that charged and then waits (a ``retry()``, a long
wait, an unknown outcome the sweep later settles) must go on: expiring it would leave
the customer charged and the rest of the body undone. Only take-overs of a dead lease
and re-publishes of lost messages count toward ``agboss_max_recovery_attempts``: an
hourly ``retry()`` wait, or an answered pause, never parks a healthy execution.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta, timezone

from celery_agboss import answer_pause
from celery_agboss.core.executions import ExecutionState
from celery_agboss.core.protections import (
    EXPIRY_DECIDED_BY_LISTING,
    PLANNED_WAITS_COUNTED,
    STARTED_EXECUTIONS_EXPIRE,
)
from celery_agboss.sweep import SweepReport
from celery_agboss.testing.fault_arming import SWEEP_BEFORE_EXPIRY, arm_fault
from celery_agboss.testing.switches import sabotage
from tests.operations.world import CAP, GRACE_SECONDS, TTL_SECONDS, World

HOUR_MS = 3_600_000


def _charged_then_waiting(world: World) -> str:
    """Published with ``expires`` a minute ahead; the delivery charges, then retries in
    two minutes (its retry message is on the way)."""
    task_id = world.publish(expires=datetime.now(timezone.utc) + timedelta(minutes=1))
    ctx = world.start(task_id)
    ctx.outbound(world.call, {"amount": 1000, "order": task_id}, business_key=f"order:{task_id}")
    with ctx.fenced() as tx:
        world.agboss.executions.wait_in(tx, 120_000, "retry")
    ctx.settle_all_and_release()
    world.clock.advance(120 + TTL_SECONDS + 1)  # past expires, and past the retry's time
    return task_id


def test_a_started_execution_that_charged_goes_on_past_its_expires(world: World) -> None:
    task_id = _charged_then_waiting(world)
    report = world.sweep()
    assert report.expired == 0
    assert world.execution(task_id).state is ExecutionState.WAITING
    assert report.republished == 1, "its retry message was lost: the sweep brings it back"
    ctx = world.start(task_id)
    ctx.outbound(world.call, {"amount": 1000, "order": task_id}, business_key=f"order:{task_id}")
    with ctx.fenced() as tx:
        world.agboss.executions.finish_in(tx, '{"json": "shipped"}')
    ctx.settle_all_and_release()
    assert world.execution(task_id).state is ExecutionState.COMPLETED
    assert len(world.gateway.payments) == 1


def test_when_expires_ends_a_started_execution_the_customer_is_charged_for_nothing(
    world: World,
) -> None:
    with sabotage(STARTED_EXECUTIONS_EXPIRE):
        task_id = _charged_then_waiting(world)
        report = world.sweep()
    assert report.expired == 1
    assert world.execution(task_id).state is ExecutionState.EXPIRED
    assert len(world.gateway.payments) == 1, "charged, and the rest never runs"


def _started_while_the_sweep_lists_it(world: World) -> tuple[str, SweepReport]:
    """A worker took the message just before its ``expires``; the sweep lists it just
    after, as never started. Between that listing and the sweep's row lock, the delivery
    starts, charges and asks for a retry (all committed)."""
    task_id = world.publish(expires=datetime.now(timezone.utc) + timedelta(minutes=1))
    world.clock.advance(61)

    def deliver(_context: Mapping[str, object]) -> None:
        ctx = world.start(task_id)
        order = {"amount": 1000, "order": task_id}
        ctx.outbound(world.call, order, business_key=f"order:{task_id}")
        with ctx.fenced() as tx:
            world.agboss.executions.wait_in(tx, 120_000, "retry")
        ctx.settle_all_and_release()

    reached = arm_fault(SWEEP_BEFORE_EXPIRY, deliver)
    report = world.sweep()
    assert reached.hits == 1, "the delivery ran between the listing and the lock"
    return task_id, report


def test_an_execution_started_after_the_sweep_listed_it_is_not_expired(world: World) -> None:
    task_id, report = _started_while_the_sweep_lists_it(world)
    assert report.expired == 0
    assert world.execution(task_id).state is ExecutionState.WAITING
    assert len(world.gateway.payments) == 1


def test_twin_expiring_what_the_listing_found_ends_a_charged_execution(world: World) -> None:
    with sabotage(EXPIRY_DECIDED_BY_LISTING):
        task_id, report = _started_while_the_sweep_lists_it(world)
    assert report.expired == 1
    assert world.execution(task_id).state is ExecutionState.EXPIRED
    assert len(world.gateway.payments) == 1, "charged, and the rest never runs"


def test_a_message_lost_before_it_started_still_expires(world: World) -> None:
    task_id = world.publish(expires=datetime.now(timezone.utc) + timedelta(seconds=30))
    world.clock.advance(GRACE_SECONDS + 1)
    assert world.sweep().expired == 1
    assert world.execution(task_id).state is ExecutionState.EXPIRED


# --- the recovery cap -------------------------------------------------------------------


def _planned_long_waits(world: World, times: int) -> str:
    """An execution that waits an hour, ``times`` times (a ``retry(countdown=3600)``
    loop): each wait is kept in the store and ended by the sweep's re-publish."""
    task_id = world.publish()
    for _ in range(times):
        if world.execution(task_id).state is ExecutionState.PARKED:
            break
        ctx = world.start(task_id)
        message = world.execution(task_id).message
        with ctx.fenced() as tx:
            world.agboss.executions.wait_in(tx, HOUR_MS, "retry", message)
        ctx.settle_all_and_release()
        world.clock.advance(HOUR_MS / 1000 + 1)
        world.sweep()
    return task_id


def test_planned_waits_never_count_toward_the_recovery_cap(world: World) -> None:
    task_id = _planned_long_waits(world, CAP + 2)
    record = world.execution(task_id)
    assert record.state is ExecutionState.WAITING and record.recovery_count == 0
    assert world.publishes_of(task_id) == 1 + CAP + 2, "each wait ended by its re-publish"


def test_counting_planned_waits_parks_a_healthy_execution(world: World) -> None:
    with sabotage(PLANNED_WAITS_COUNTED):
        task_id = _planned_long_waits(world, CAP + 2)
    assert world.execution(task_id).state is ExecutionState.PARKED


def test_answered_pauses_never_count_toward_the_recovery_cap(world: World) -> None:
    task_id = world.publish()
    for n in range(CAP + 2):
        ctx = world.start(task_id)
        with ctx.fenced() as tx:
            world.agboss.executions.pause_in(tx, f"approve-{n}", None)
        ctx.settle_all_and_release()
        assert answer_pause(world.app, f"{task_id}:approve-{n}", {"ok": True})
    record = world.execution(task_id)
    assert record.state is ExecutionState.WAITING and record.recovery_count == 0


def test_a_dead_delivery_still_counts_and_parks_at_the_cap(world: World) -> None:
    task_id = world.publish()
    for _ in range(CAP):
        world.start(task_id)
        world.die()
        world.sweep()
    world.start(task_id)
    world.die()
    assert world.sweep().parked == 1
    assert world.execution(task_id).state is ExecutionState.PARKED
