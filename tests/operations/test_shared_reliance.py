"""Reliance lives on the record, not on the execution rows retention removes
(design: reliance, retention): an execution that completed on a shared charge keeps it for good,
even once its own row is gone.

A charges order o-1 and declares its refund; B, a second execution of the order,
replays A's charge and completes (the order is paid) and then, terminal for longer than
the execution retention and with no record of its own, B's row is deleted by the sweep.
A, which waited all that time (a long retry), then fails: its undo finds on the record
that B completed on the charge, and refunds nothing. The twin, which reads that from
B's execution row only, refunds the paid order.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from celery_agboss.core.compensation import (
    FAILURE,
    UndoContext,
    UndoStep,
    declare_undo,
    read_declarations,
    run_undos,
)
from celery_agboss.core.outbound import Outcome
from celery_agboss.core.protections import COMPLETION_READ_FROM_EXECUTION_ROWS
from celery_agboss.testing.switches import sabotage
from tests.operations.world import World

EIGHT_DAYS = timedelta(days=8)
ORDER = "o-1"
REQUEST = {"amount": 1000, "order": ORDER}


def _charge(world: World, execution_id: str) -> tuple[Any, Any]:
    ctx = world.start(execution_id)
    receipt = ctx.outbound(world.call, REQUEST, business_key=f"order:{ORDER}")
    return receipt, ctx


def _the_completed_one_is_gone_when_the_other_fails(world: World) -> tuple[str, UndoContext]:
    first, second = world.publish(ORDER), world.publish(ORDER)
    receipt, ctx = _charge(world, first)
    declare_undo(ctx, "refund", {"payment": receipt["id"]})
    with ctx.fenced() as tx:  # A waits eight days (a long retry)
        world.agboss.executions.wait_in(tx, round(EIGHT_DAYS.total_seconds() * 1000), "retry")
    ctx.settle_all_and_release()
    _, ctx = _charge(world, second)
    assert ctx.last_outcome is Outcome.REPLAYED
    with ctx.fenced() as tx:
        world.agboss.executions.finish_in(tx, '{"json": "paid"}')
    ctx.settle_all_and_release()
    world.clock.advance(EIGHT_DAYS + timedelta(hours=1))
    report = world.sweep()
    assert report.executions_deleted == 1 and world.agboss.executions.read_execution(second) is None
    assert world.intents(first), "A's charge stays: A still waits"
    ctx = world.start(first)  # A's body fails: its undos run
    undo = UndoContext.over(ctx)
    with ctx.fenced() as tx:
        declarations = read_declarations(tx, world.agboss.engine_settings, first)

    def refund(step: UndoStep) -> None:
        world.gateway.refund(step.arguments["payment"], None)

    run_undos(undo, declarations, refund, cause=FAILURE)
    undo.settle_all_and_release()
    return second, undo


def test_a_charge_the_deleted_execution_completed_on_is_never_refunded(world: World) -> None:
    second, undo = _the_completed_one_is_gone_when_the_other_fails(world)
    assert world.gateway.refunds == [], "kept for the order that completed on it"
    (decision,) = undo.decisions.values()
    assert decision.outcome.value == "KEEP" and decision.other == second


def test_twin_reading_completion_from_execution_rows_refunds_the_paid_order(
    world: World,
) -> None:
    with sabotage(COMPLETION_READ_FROM_EXECUTION_ROWS):
        _the_completed_one_is_gone_when_the_other_fails(world)
    assert len(world.gateway.refunds) == 1, "the paid order refunded"
