"""Records other executions used: kept while they live, and their waits ended with it.

Two executions of one order (a double click) share a business key: the first charges, the
second replays its receipt. A record (design: retention) is never deleted while any
non-terminal execution used it (created, replayed, joined, took over or reconciled it);
retention counts from the last such use reaching a terminal state. An
intent (design: waiters re-driven) settled by an operator re-drives every execution waiting on it,
not only the one that created it — ``agboss pending`` never lists a wait nobody can end.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from celery_agboss.core.executions import ExecutionState
from celery_agboss.core.outbound import Outcome
from celery_agboss.core.protections import (
    RECORD_USE_NOT_NOTED,
    RECORD_USES_IGNORED_BY_RETENTION,
    RESOLVE_REDRIVES_CREATOR_ONLY,
)
from celery_agboss.core.store_protocol import IntentStatus
from celery_agboss.operator import list_waits, resolve
from celery_agboss.testing.switches import sabotage
from tests.operations.conftest import OnOneKey
from tests.operations.world import World

EIGHT_DAYS = timedelta(days=8)  # past the 7-day default retentions


def _charge(world: World, execution_id: str, order: str) -> tuple[Outcome | None, Any]:
    """A delivery of ``execution_id`` charges ``order``: how it got its result, and the
    delivery (still holding its lease)."""
    ctx = world.start(execution_id)
    ctx.outbound(world.call, {"amount": 1000, "order": order}, business_key=f"order:{order}")
    return ctx.last_outcome, ctx


def _a_replayed_charge_then_a_long_wait(world: World) -> tuple[str, str]:
    """A charges order o-1 and completes; B, a second execution of o-1, replays A's
    receipt, then waits eight days (a long retry, a pause)."""
    first, second = world.publish("o-1"), world.publish("o-1")
    outcome, ctx = _charge(world, first, "o-1")
    assert outcome is Outcome.SENT
    with ctx.fenced() as tx:
        world.agboss.executions.finish_in(tx, '{"json": "paid"}')
    ctx.settle_all_and_release()
    outcome, ctx = _charge(world, second, "o-1")
    assert outcome is Outcome.REPLAYED
    with ctx.fenced() as tx:
        world.agboss.executions.wait_in(tx, round(EIGHT_DAYS.total_seconds() * 1000), "retry")
    ctx.settle_all_and_release()
    world.clock.advance(EIGHT_DAYS + timedelta(hours=1))
    world.sweep()  # retention runs; A has been terminal for eight days
    return first, second


def test_a_receipt_another_execution_replayed_is_kept_while_that_one_waits(
    world: World,
) -> None:
    first, second = _a_replayed_charge_then_a_long_wait(world)
    assert [i.status for i in world.intents(first)] == [IntentStatus.COMPLETED]
    outcome, ctx = _charge(world, second, "o-1")  # B's body runs again after its wait
    ctx.settle_all_and_release()
    assert outcome is Outcome.REPLAYED
    assert len(world.gateway.requests) == 1, "charged once, for two executions of one order"


def _without(world: World, protection: str) -> None:
    """The harm of a twin: with ``protection`` off, retention deletes the replayed
    receipt under the waiting execution, which then charges the order again."""
    with sabotage(protection):
        first, second = _a_replayed_charge_then_a_long_wait(world)
    assert world.intents(first) == [], "deleted under a waiting execution"
    outcome, ctx = _charge(world, second, "o-1")
    ctx.settle_all_and_release()
    assert outcome is Outcome.SENT
    assert len(world.gateway.requests) == 2, "the order charged twice"


def test_without_its_users_retention_deletes_it_and_the_waiting_one_charges_again(
    world: World,
) -> None:
    _without(world, RECORD_USES_IGNORED_BY_RETENTION)


def test_a_replay_that_is_not_noted_as_a_use_lets_retention_delete_it_and_charge_again(
    world: World,
) -> None:
    """The other half of the rule: retention can only keep what the replay recorded."""
    _without(world, RECORD_USE_NOT_NOTED)


def test_once_every_user_is_terminal_past_retention_the_record_goes(world: World) -> None:
    first, second = _a_replayed_charge_then_a_long_wait(world)
    _, ctx = _charge(world, second, "o-1")
    with ctx.fenced() as tx:
        world.agboss.executions.finish_in(tx, '{"json": "paid"}')
    ctx.settle_all_and_release()
    report = world.sweep()
    assert [i.status for i in world.intents(first)] == [IntentStatus.COMPLETED]  # B: just now
    assert report.executions_deleted == 0, "A's row stays while its intent does"
    world.clock.advance(EIGHT_DAYS)
    report = world.sweep()
    assert report.intents_deleted == 1 and world.intents(first) == []
    assert report.executions_deleted == 2, "then both rows, with nothing left of them"
    assert world.agboss.executions.read_execution(first) is None


# --- an intent resolved by an operator ---------------------------------------------------


def test_resolving_an_intent_sends_on_every_execution_waiting_on_it(on_one_key: OnOneKey) -> None:
    world, first, second, key = on_one_key
    payment = world.gateway.payments[0]
    resolve(world.app, key, completed=payment, reason="seen at the gateway")
    for execution_id in (first, second):
        assert world.execution(execution_id).state is ExecutionState.WAITING
        assert world.publishes_of(execution_id) == 2, "published again now"
    assert [w.execution.id for w in list_waits(world.app)] == []


def test_resolving_for_the_creator_only_strands_the_other_for_ever(on_one_key: OnOneKey) -> None:
    world, first, second, key = on_one_key
    with sabotage(RESOLVE_REDRIVES_CREATOR_ONLY):
        resolve(world.app, key, completed=world.gateway.payments[0], reason="seen")
    assert world.execution(first).state is ExecutionState.WAITING
    assert world.execution(second).state is ExecutionState.WAITING_OPERATOR
    world.clock.advance(3600)
    world.sweep()
    assert world.execution(second).state is ExecutionState.WAITING_OPERATOR, "nobody ends it"


def test_pending_lists_every_wait_with_the_command_that_ends_it(on_one_key: OnOneKey) -> None:
    world, first, second, key = on_one_key
    waits = {w.execution.id: w for w in list_waits(world.app)}
    assert set(waits) == {first, second}
    for wait in waits.values():
        assert wait.intents == [key] and "resolve KEY" in wait.ends_with
