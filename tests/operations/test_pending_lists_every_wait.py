"""``agboss pending`` lists every wait for a person, whatever hides it.

A ``PARKED`` execution (a charge made, its deliveries dying) is a customer charged for
an order never done, or never refunded: it is listed with ``unpark``, as a
``WAITING_OPERATOR`` one is with its command. ``--operator-only`` never says every call
is settled while one that may be a payment is not. A limit never hides a shared wait
behind plain retries, nor the oldest operator wait behind a younger one.
"""

from __future__ import annotations

from typing import Any

from celery_agboss.core.compensation import UndoContext, UndoStep
from celery_agboss.core.executions import CANCEL_WAITS, ExecutionState, shared_wait_reason
from tests.operations.cli import run, run_json
from tests.operations.world import CAP, GRACE_SECONDS, INTERVAL_SECONDS, World


def _charged_then_parked(world: World, order: str) -> str:
    """A delivery charges, then every delivery of it dies (an OOM after the charge):
    PARKED at the recovery cap."""
    execution = world.publish(order)
    world.charge(world.start(execution), order)
    world.die()
    world.sweep()
    for _ in range(CAP + 1):  # bounded: the cap parks it
        if world.execution(execution).state is ExecutionState.PARKED:
            break
        world.clock.advance(2 * INTERVAL_SECONDS + 1)
        world.start(execution)
        world.die()
        world.sweep()
    assert world.execution(execution).state is ExecutionState.PARKED
    return execution


def _listed_wait(data: dict[str, Any], execution: str) -> dict[str, Any]:
    (found,) = [w for w in data["waiting_executions"] if w["id"] == execution]
    return found


def test_pending_lists_a_parked_execution_that_charged_with_unpark(world: World) -> None:
    execution = _charged_then_parked(world, "parked-1")
    assert len(world.gateway.requests) == 1, "charged once, the order never done"

    text = run(world.app, "pending")
    assert text.exit_code == 0  # as for every wait listed: the listing worked
    assert "1 execution(s) waiting for an operator" in text.output
    assert f"agboss unpark {execution} --reason TEXT" in text.output
    listed = _listed_wait(run_json(world.app, "pending"), execution)
    assert listed["state"] == "PARKED"
    assert f"agboss unpark {execution} --reason TEXT" in listed["ends_with"]


def test_pending_lists_a_failed_orders_parked_refund_task(world: World) -> None:
    """The refund is published as a task by an undo (``.delay()``), the order fails,
    and the refund task's message is lost until it parks: the customer is charged for
    a failed order, and ``pending`` lists the refund task to unpark."""
    refunds: list[str] = []

    def publish_the_refund(undo: UndoContext, step: UndoStep) -> None:
        refunds.append(world.publish(f"refund-{step.arguments['payment']}"))  # stands in

    world.failed_after_its_undo("undo-parked", publish_the_refund)
    (refund,) = refunds
    for _ in range(CAP + 2):  # bounded: the cap parks it
        if world.execution(refund).state is ExecutionState.PARKED:
            break
        world.clock.advance(GRACE_SECONDS + INTERVAL_SECONDS + 1)
        world.sweep()
    assert world.execution(refund).state is ExecutionState.PARKED
    assert len(world.gateway.payments) == 1 and world.gateway.refunds == []

    text = run(world.app, "pending")
    assert f"agboss unpark {refund} --reason TEXT" in text.output
    assert _listed_wait(run_json(world.app, "pending"), refund)["state"] == "PARKED"


def test_operator_only_says_how_many_calls_are_not_settled(world: World) -> None:
    """A charge whose answer was lost (the gateway charged), its holder dead: PENDING,
    not flagged for an operator yet. ``--operator-only`` says none waits for an
    operator and that one other is not settled, never that every call is."""
    execution = world.publish("lost-answer")
    key, _ = world.strand(execution)  # ANSWER_THEN_DROP: the gateway charged
    assert len(world.gateway.payments) == 1
    assert key in run(world.app, "pending").output

    only = run(world.app, "pending", "--operator-only")
    assert only.exit_code == 0
    assert "every outbound call is settled" not in only.output
    assert "No outbound call waits for an operator; 1 other(s) not settled" in only.output
    assert "agboss pending` lists them" in only.output
    data = run_json(world.app, "pending", "--operator-only")
    assert data["pending"] == [] and data["unsettled_not_listed"] == 1
    assert run_json(world.app, "pending")["unsettled_not_listed"] == 0


def test_shared_waits_are_found_past_plain_retries_within_the_limit(world: World) -> None:
    """Plain retries with smaller ids, more than --limit: the shared wait is listed."""
    for n in range(3):
        retry = world.publish(f"retry-{n}", task_id=f"0000000{n}-retry")
        ctx = world.start(retry)
        with ctx.fenced() as tx:
            world.agboss.executions.wait_in(tx, 3_600_000, "retry")
        ctx.settle_all_and_release()
    waiter = world.publish("waiter", task_id="ffffffff-waiter")
    ctx = world.start(waiter)
    with ctx.fenced() as tx:
        world.agboss.executions.wait_in(
            tx, 3_600_000, shared_wait_reason(CANCEL_WAITS, "other-exec", "still uses a payment")
        )
    ctx.settle_all_and_release()

    limited = run_json(world.app, "pending", "--limit", "2")
    assert [w["id"] for w in limited["waiting_on_executions"]] == [waiter]
    assert "waiting_on_executions" not in limited["limit_reached"]
    one = run_json(world.app, "pending", "--limit", "1")
    assert [w["id"] for w in one["waiting_on_executions"]] == [waiter]
    assert "waiting_on_executions" in one["limit_reached"]
    text = run(world.app, "pending", "--limit", "2").output
    assert "1 execution(s) waiting for another execution" in text


def test_operator_waits_are_listed_oldest_first(world: World) -> None:
    """With --limit reached, the youngest wait is left out, never the oldest (whose id
    sorts last)."""

    def wait(task_id: str) -> str:
        execution = world.publish(task_id, task_id=task_id)
        ctx = world.start(execution)
        with ctx.fenced() as tx:
            world.agboss.executions.waiting_operator_in(tx, "undo refund failed: RuntimeError")
        ctx.settle_all_and_release()
        return execution

    oldest = wait("ffff-oldest")
    world.clock.advance(3600)
    younger = wait("0000-younger")
    data = run_json(world.app, "pending", "--limit", "1")
    assert [w["id"] for w in data["waiting_executions"]] == [oldest]
    assert "waiting_executions" in data["limit_reached"]
    both = run_json(world.app, "pending")
    assert [w["id"] for w in both["waiting_executions"]] == [oldest, younger]
