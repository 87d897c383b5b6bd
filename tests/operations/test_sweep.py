"""The sweep's decisions (design: sweep) against the real store, on SQLite and PostgreSQL.

Time moves on the virtual database clock; messages go to an in-memory broker and every
publish is counted. Guarantees: P4 (nothing lost: every execution ends or visibly
waits), P3 (the sweep never sends: the gateway's request count is the proof), P1.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import update

from celery_agboss.core.executions import ExecutionState
from celery_agboss.core.history import HistoryEvent
from celery_agboss.core.store_protocol import IntentStatus
from celery_agboss.signals import RECORDED_HEADER
from celery_agboss.store.schema_executions import executions
from celery_agboss.sweep import check_sweep_freshness, sweep_freshness
from celery_agboss.sweep.runner import DEFAULT_BATCH_SIZE
from celery_agboss.sweep.steps import SweepReport, SweepRun
from celery_agboss.testing.gateway_types import FakeGatewayFault
from tests.operations.conftest import WorldFactory
from tests.operations.world import CAP, GRACE_SECONDS, INTERVAL_SECONDS, TTL_SECONDS, World
from tests.support.processes import wait_until


def test_a_requested_execution_is_republished_only_after_its_grace(world: World) -> None:
    """A message lost before any worker started it comes back from the store
    (design: P4, trap 9)."""
    task_id = world.publish()
    assert world.execution(task_id).state is ExecutionState.REQUESTED
    assert world.sweep().republished == 0
    world.clock.advance(GRACE_SECONDS + 1)
    report = world.sweep()
    assert report.republished == 1
    assert world.publishes_of(task_id) == 2
    assert world.execution(task_id).recovery_count == 1


def test_a_republished_message_keeps_its_id_arguments_and_options(world: World) -> None:
    task_id = world.publish("order-7", priority=3, headers={"tenant-ref": "abc"})
    world.clock.advance(GRACE_SECONDS + 1)
    before = world.execution(task_id)
    world.sweep()
    after = world.execution(task_id)
    assert after.id == task_id
    assert json.loads(after.args) == json.loads(before.args) == ["order-7"]
    options = json.loads(after.options)
    assert options["priority"] == 3
    # The application's header, and why the publisher recorded it (read by a worker
    # whose task is not a PaymentTask: UNMANAGED).
    assert options["headers"] == {"tenant-ref": "abc", RECORDED_HEADER: "PaymentTask"}


def test_an_eta_execution_is_not_republished_before_its_eta_and_grace(world: World) -> None:
    """Trap 9: the grace counts from max(eta, requested_at)."""
    task_id = world.publish(countdown=100)
    world.clock.advance(GRACE_SECONDS + 1)
    assert world.sweep().republished == 0
    world.clock.advance(100)
    assert world.sweep().republished == 1
    assert world.publishes_of(task_id) == 2


def test_a_requested_execution_is_republished_once_per_grace_not_every_run(world: World) -> None:
    task_id = world.publish()
    world.clock.advance(GRACE_SECONDS + 1)
    assert world.sweep().republished == 1
    assert world.sweep().republished == 0
    world.clock.advance(GRACE_SECONDS + 1)
    assert world.sweep().republished == 1
    assert world.publishes_of(task_id) == 3


def test_an_execution_past_its_expires_becomes_expired_and_never_runs(world: World) -> None:
    """Trap 9: past ``expires`` a lost message is not re-published; it ends EXPIRED."""
    expires = datetime.now(timezone.utc) + timedelta(seconds=30)
    task_id = world.publish(expires=expires)
    world.clock.advance(GRACE_SECONDS + 1)
    report = world.sweep()
    assert report.expired == 1
    assert report.republished == 0
    assert world.execution(task_id).state is ExecutionState.EXPIRED
    assert world.publishes_of(task_id) == 1


def test_a_dead_delivery_is_republished_after_its_lease_expired(world: World) -> None:
    """P4, trap 4/5: a worker killed mid-body; the sweep, not the broker, brings it back."""
    task_id = world.publish()
    world.start(task_id)
    assert world.sweep().republished == 0  # the lease is live: nobody else touches it
    world.die()
    report = world.sweep()
    assert report.republished == 1
    assert world.publishes_of(task_id) == 2


def test_a_live_lease_is_never_republished(world: World) -> None:
    """A holder that is still alive is left alone, however long it runs (design: P1)."""
    task_id = world.publish()
    world.start(task_id)
    world.clock.advance(TTL_SECONDS - 2)
    assert world.sweep().republished == 0
    assert world.publishes_of(task_id) == 1


def test_an_execution_past_the_recovery_cap_is_parked_visibly(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    """A crash loop ends PARKED, logged ``execution.parked``, never silently retried
    (design: P4)."""
    task_id = world.publish()
    for _ in range(CAP):
        world.start(task_id)
        world.die()
        assert world.sweep().republished == 1
        world.clock.advance(2 * INTERVAL_SECONDS + 1)
    world.start(task_id)  # one more take-over: this one is counted too
    world.die()
    with caplog.at_level(logging.INFO, logger="celery_agboss"):
        report = world.sweep()
    assert report.parked == 1
    record = world.execution(task_id)
    assert record.state is ExecutionState.PARKED
    assert "recovery cap" in (record.reason or "")
    assert any("execution.parked" in r.getMessage() for r in caplog.records)
    world.clock.advance(10 * INTERVAL_SECONDS)
    assert world.sweep().republished == 0


def test_a_cancel_requested_execution_is_cancelled_not_republished(world: World) -> None:
    """A revoked execution whose worker died ends CANCELLED; a re-drive could send money."""
    task_id = world.publish()
    world.start(task_id)
    world.agboss.executions.request_cancel(task_id, "revoked with terminate")
    world.die()
    report = world.sweep()
    assert report.cancelled == 1
    assert report.republished == 0
    assert world.execution(task_id).state is ExecutionState.CANCELLED


def test_a_revoke_recorded_before_any_worker_started_means_it_never_runs(world: World) -> None:
    """Trap 9: ``revoke`` is recorded in the store, so the lost message is never re-published."""
    task_id = world.publish()
    world.app.control.revoke(task_id)
    assert world.execution(task_id).state is ExecutionState.CANCELLED
    world.clock.advance(GRACE_SECONDS + 1)
    assert world.sweep().republished == 0
    assert world.publishes_of(task_id) == 1


# --- stranded intents: reconcile, never send -------------------------------------------


def test_a_stranded_intent_found_at_the_gateway_is_stored_and_never_sent_again(
    world: World,
) -> None:
    """A worker died after the gateway charged; the sweep looks it up, sends nothing
    (design: P3, P5)."""
    task_id, _ = world.stranded(FakeGatewayFault.ANSWER_THEN_DROP)
    report = world.sweep_sending_nothing()
    assert report.reconciled == 1
    (intent,) = world.intents(task_id)
    assert intent.status is IntentStatus.COMPLETED
    assert intent.gateway_transaction_id == world.gateway.payments[0]["id"]
    assert len(world.gateway.payments) == 1
    assert report.republished == 1  # the execution goes on and replays the result


def test_a_lease_that_expires_during_a_run_is_left_whole_to_the_next_run(world: World) -> None:
    """One sweep run judges every lease at one reading of the database clock: a lease that
    expires between the stranded-intent step and the re-drive step is neither looked up nor
    re-published by that run (else the re-drive would go out before the sweep looked the
    charge up). The next run does both, lookup first."""
    task_id, _ = world.stranded(FakeGatewayFault.ANSWER_THEN_DROP, die=False)
    world.clock.advance(TTL_SECONDS - 1)
    run = SweepRun(world.agboss, DEFAULT_BATCH_SIZE, SweepReport())
    try:
        run.reconcile()
        world.clock.advance(2)  # the lease passes while the run goes on
        run.redrive()
    finally:
        run.release()
    assert (run.report.reconciled, run.report.republished) == (0, 0), run.report
    assert world.publishes_of(task_id) == 1
    report = world.sweep_sending_nothing()
    assert (report.reconciled, report.republished) == (1, 1), report


def test_a_stranded_intent_proven_not_sent_is_recorded_and_left_to_its_execution(
    world_factory: WorldFactory,
) -> None:
    """The sweep itself never sends money: NotSent is only recorded (``not_sent_confirmed``;
    counted there when the lookup proves absence: ``test_unproven_not_sent.py``)."""
    world = world_factory(proves_absence=True)
    task_id, _ = world.stranded(FakeGatewayFault.FAIL_BEFORE_PROCESSING)
    report = world.sweep_sending_nothing()
    assert report.not_sent_confirmed == 1
    (intent,) = world.intents(task_id)
    assert intent.status is IntentStatus.PENDING
    assert intent.not_sent_confirmed
    assert world.gateway.payments == []
    assert report.republished == 1


def test_an_unknown_lookup_flags_the_intent_and_the_execution_waits_for_an_operator(
    world_factory: WorldFactory,
) -> None:
    """A gateway without lookup: quarantined for an operator, never marked failed (design: P4)."""
    world = world_factory(lookup="none")
    task_id, key = world.stranded()
    report = world.sweep()
    assert report.unreconciled == 1
    assert report.republished == 0
    (intent,) = world.intents(task_id)
    assert intent.status is IntentStatus.PENDING
    assert intent.needs_operator
    record = world.execution(task_id)
    assert record.state is ExecutionState.WAITING_OPERATOR
    pending = world.agboss.executions.list_pending_intents(limit=10, operator_only=True)
    assert [p.idempotency_key for p in pending] == [key]


def test_lookups_of_the_same_intent_back_off(world_factory: WorldFactory) -> None:
    world = world_factory(lookup="none")
    world.stranded()
    assert world.sweep().unreconciled == 1
    assert world.sweep().unreconciled == 0  # not asked again right away
    world.clock.advance(3600)
    assert world.sweep().unreconciled == 1


def test_a_cancel_waits_until_the_pending_intent_is_settled_then_cancels(
    world_factory: WorldFactory,
) -> None:
    """Revoked (design: cancel request): the pending intent is settled first (reconcile only), then
    CANCELLED; nothing new is sent. Here the lookup proves absence."""
    world = world_factory(proves_absence=True)
    task_id, _ = world.stranded(FakeGatewayFault.FAIL_BEFORE_PROCESSING)
    world.agboss.executions.request_cancel(task_id, "revoked")
    report = world.sweep_sending_nothing()
    assert report.not_sent_confirmed == 1
    assert report.cancelled == 1
    assert report.republished == 0
    assert world.execution(task_id).state is ExecutionState.CANCELLED
    (intent,) = world.intents(task_id)
    assert intent.status is IntentStatus.FAILED  # proven never processed; never resent
    # Named for what it is: a lookup proved it was never processed (not a decline).
    events = [row.event for row in world.agboss.store.read_history(intent.idempotency_key)]
    assert HistoryEvent.NOT_SENT_PROVEN.value in events
    assert HistoryEvent.FAILED_DEFINITE.value not in events


def test_a_cancel_never_marks_an_intent_failed_on_a_not_sent_that_proves_nothing(
    world: World,
) -> None:
    """A replay-only NotSent means "a resend would be deduplicated", not "never charged":
    cancelling must not mark the payment failed (ambiguous is quarantined, never failed)."""
    task_id, _ = world.stranded(FakeGatewayFault.FAIL_BEFORE_PROCESSING)
    world.agboss.executions.request_cancel(task_id, "revoked")
    report = world.sweep_sending_nothing()
    assert report.cancelled == 0
    (intent,) = world.intents(task_id)
    assert intent.status is IntentStatus.PENDING
    assert intent.needs_operator
    assert world.execution(task_id).state is ExecutionState.WAITING_OPERATOR


# --- retention and last_sweep_at ------------------------------------------------------


def test_retention_deletes_settled_records_of_long_terminal_executions_only(
    world: World,
) -> None:
    """A pending intent and the rows of a non-terminal execution are never deleted (design: P4)."""
    done = world.publish()
    ctx = world.start(done)
    ctx.outbound(world.call, {"amount": 1000, "order": done}, business_key=f"order:{done}")
    ctx.fenced_effect("mark-paid", lambda conn: {"ok": True})
    with ctx.fenced() as tx:
        world.agboss.executions.finish_in(tx, '{"json": null}')
    running = world.publish()
    ctx2 = world.start(running)
    ctx2.outbound(world.call, {"amount": 1000, "order": running}, business_key=f"order:{running}")
    stranded, _ = world.stranded(FakeGatewayFault.FAIL_BEFORE_PROCESSING)
    world.clock.advance(timedelta(days=8))
    report = world.sweep()
    assert report.intents_deleted == 1
    assert report.effects_deleted == 1
    assert world.intents(done) == []
    assert len(world.intents(running)) == 1
    assert len(world.intents(stranded)) == 1


def test_retention_keeps_a_terminal_execution_republished_for_a_retention_after_its_claim(
    world: World,
) -> None:
    """The unsent-links step's claim puts ``not_before`` one grace ahead; its message may
    wait in a backlog far longer, and a replay that found no row would run the body again
    (design: retention, unsent links). Kept until ``not_before`` too is past the cutoff:
    as safe as any other message of its age. Then it goes."""
    done = world.publish()
    with world.start(done).fenced() as tx:
        world.agboss.executions.finish_in(tx, '{"json": null}')
    world.clock.advance(timedelta(days=8))
    with world.agboss.store.engine.begin() as conn:  # claimed one grace ago
        conn.execute(
            update(executions)
            .where(executions.c.id == done)
            .values(not_before_ms=world.agboss.store.now_ms())
        )
    assert world.sweep().executions_deleted == 0
    world.clock.advance(2 * GRACE_SECONDS + 1)  # the message still waits in a backlog
    assert world.sweep().executions_deleted == 0
    world.clock.advance(
        timedelta(seconds=world.agboss.settings.terminal_execution_retention_seconds)
    )
    assert world.sweep().executions_deleted == 1
    assert world.agboss.executions.read_execution(done) is None


def test_last_sweep_at_is_recorded_and_an_old_one_is_logged_stale(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    assert sweep_freshness(world.agboss).stale  # never ran
    world.sweep()
    fresh = sweep_freshness(world.agboss)
    assert not fresh.stale and fresh.last_sweep_age_seconds is not None
    world.clock.advance(3 * INTERVAL_SECONDS + 1)
    with caplog.at_level(logging.WARNING, logger="celery_agboss"):
        assert check_sweep_freshness(world.agboss).stale
    assert any("sweep.stale" in r.getMessage() for r in caplog.records)


def test_a_worker_logs_sweep_stale_when_no_sweep_ran_for_three_intervals(
    world_factory: WorldFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Section 6.4: a beat that is not running is noticed by the workers."""
    from celery import signals

    world = world_factory(sweep_interval=0.2)

    class Consumer:
        app = world.app

    with caplog.at_level(logging.WARNING, logger="celery_agboss"):
        signals.worker_ready.send(sender=Consumer())
        try:
            wait_until(
                lambda: any("sweep.stale" in r.getMessage() for r in caplog.records),
                10,
                message="sweep.stale in the log",
            )
        finally:
            signals.worker_shutdown.send(sender=None)


def test_a_waiting_execution_gets_one_ttl_for_its_own_retry_before_a_republish(
    world: World,
) -> None:
    """A retry's message (same id) is due at ``not_before``: the sweep does not race it."""
    task_id = world.publish()
    ctx = world.start(task_id)
    with ctx.fenced() as tx:
        world.agboss.executions.wait_in(tx, 10_000, "retry")
    ctx.settle_all_and_release()
    world.clock.advance(10 + TTL_SECONDS - 2)
    assert world.sweep().republished == 0
    world.clock.advance(3)
    assert world.sweep().republished == 1
