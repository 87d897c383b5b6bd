"""``celery -A proj agboss answer-pause`` and ``pauses`` through click's CliRunner, on a real
app and store (SQLite and PostgreSQL), with deliveries cut short as the World makes them.

An answer moves the pause once and publishes the task again; a second one, an unknown
pause, and a pause whose execution no longer waits for it are refused with the exit
codes scripts rely on, and publish nothing. An answer that comes while the delivery
that paused still holds the lease is not lost: that delivery publishes it on release.
An answer before the pause is kept once (early), listed, and taken by a pause that
accepts early answers; one for an ended execution is refused; one nobody took goes
with its execution's records.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select

from celery_agboss import answer_pause, cancel
from celery_agboss.cli import EXIT_NOT_FOUND, EXIT_REFUSED
from celery_agboss.core.execution_context import ExecutionContext
from celery_agboss.core.executions import ExecutionState
from celery_agboss.operator import read_pause
from celery_agboss.store.schema_executions import pauses
from tests.operations.cli import run, run_json
from tests.operations.world import World


def _paused(world: World, name: str = "approve") -> tuple[str, ExecutionContext]:
    """A delivery that paused at ``name``; its lease still held (the caller releases)."""
    task_id = world.publish()
    ctx = world.start(task_id)
    with ctx.fenced() as tx:
        assert world.agboss.executions.pause_in(tx, name, '{"order": 1}') == (False, None)
    return task_id, ctx


def _paused_and_released(world: World) -> str:
    task_id, ctx = _paused(world)
    assert ctx.settle_all_and_release()
    return task_id


def test_answer_pause_answers_once_audits_and_publishes_again(world: World) -> None:
    task_id = _paused_and_released(world)
    pause_id = f"{task_id}:approve"
    assert run_json(world.app, "pauses")["pauses"] == [
        {"pause_id": pause_id, "execution": task_id, "status": "PENDING"}
    ]
    result = run(world.app, "answer-pause", pause_id, '{"approved": true}', "--actor", "ana")
    assert result.exit_code == 0, result.output
    assert f"Answered {pause_id}; its task is published again now." in result.output
    assert world.execution(task_id).state is ExecutionState.WAITING
    assert world.publishes_of(task_id) == 2, "published once, and once more by the answer"
    (entry,) = world.agboss.executions.list_audit(task_id)
    assert (entry.actor, entry.action) == ("ana", "answer-pause")
    assert run_json(world.app, "pauses")["pauses"] == []
    ctx = world.start(task_id)  # the re-run's pause() returns the answer
    with ctx.fenced() as tx:
        assert world.agboss.executions.pause_in(tx, "approve", None) == (
            True,
            '{"approved": true}',
        )


def test_show_lists_what_each_pause_asks_and_its_answer(world: World) -> None:
    """Whoever answers a pause sees what it asks: ``agboss show`` (and ``read_pause``)
    give the payload the body stored, then the answer once given."""
    task_id = _paused_and_released(world)
    pause_id = f"{task_id}:approve"
    (pending,) = run_json(world.app, "show", task_id)["pauses"]
    assert (pending["pause_id"], pending["status"]) == (pause_id, "PENDING")
    assert (pending["payload"], pending["answer"], pending["answered_at"]) == (
        {"order": 1},
        None,
        None,
    )
    shown = run(world.app, "show", task_id).output
    assert 'asks: {"order": 1}' in shown
    assert f"agboss answer-pause {pause_id} ANSWER" in shown
    assert "agboss show EXECUTION" in run(world.app, "pauses").output
    answer_pause(world.app, pause_id, {"approved": True})
    (answered,) = run_json(world.app, "show", task_id)["pauses"]
    assert (answered["status"], answered["answer"]) == ("ANSWERED", {"approved": True})
    found = read_pause(world.app, pause_id)
    assert found is not None and (found.name, found.execution_id) == ("approve", task_id)
    assert (found.payload, found.answer) == ('{"order": 1}', '{"approved": true}')
    assert found.answered_at_ms is not None and found.answered_at_ms >= found.created_at_ms
    assert read_pause(world.app, f"{task_id}:no-such-pause") is None


def test_a_second_answer_is_refused_and_publishes_nothing(world: World) -> None:
    task_id = _paused_and_released(world)
    pause_id = f"{task_id}:approve"
    assert run_json(world.app, "answer-pause", pause_id, "approve")["answered"] is True
    again = run_json(world.app, "answer-pause", pause_id, "reject")
    assert again["error"]["code"] == "not-paused"
    assert "already answered" in again["error"]["message"]
    assert run(world.app, "answer-pause", pause_id, "reject").exit_code == EXIT_REFUSED
    assert world.publishes_of(task_id) == 2


def test_an_unknown_pause_is_not_found(world: World) -> None:
    result = run(world.app, "answer-pause", "no-such-execution:approve", "yes")
    assert result.exit_code == EXIT_NOT_FOUND
    assert "agboss pauses" in result.output


def test_a_pause_of_a_cancelled_execution_is_no_longer_answered_nor_listed(world: World) -> None:
    task_id = _paused_and_released(world)
    assert cancel(world.app, task_id, "customer left").state is ExecutionState.CANCELLED
    assert run_json(world.app, "pauses")["pauses"] == []
    result = run(world.app, "answer-pause", f"{task_id}:approve", "yes")
    assert result.exit_code == EXIT_REFUSED
    assert "CANCELLED" in result.output
    assert world.execution(task_id).state is ExecutionState.CANCELLED
    assert world.publishes_of(task_id) == 1


def test_an_answer_while_the_pausing_delivery_holds_the_lease_is_published_on_release(
    world: World,
) -> None:
    task_id, ctx = _paused(world)
    assert answer_pause(world.app, f"{task_id}:approve", "yes") is False, "a lease is live"
    record = world.execution(task_id)
    assert record.state is ExecutionState.WAITING and record.wake_requested
    released = []
    ctx.release(lambda ref: released.append(world.agboss.executions.release_delivery(ref)))
    (outcome,) = released
    assert outcome.republish, "the delivery that paused publishes the answered task"


# --- early answers (design: early answers) ----------------------------------------------


def test_an_answer_before_the_pause_is_kept_listed_and_taken_by_an_accept_early_pause(
    world: World,
) -> None:
    task_id = world.publish()  # REQUESTED: no delivery has reached the pause
    pause_id = f"{task_id}:3ds"
    said = run_json(world.app, "answer-pause", pause_id, '{"source": "return-page"}')
    assert said == {"pause_id": pause_id, "answered": True, "early": True, "republished": False}
    assert world.publishes_of(task_id) == 1, "nothing to re-publish: the body has not paused"
    assert run_json(world.app, "pauses")["pauses"] == [
        {"pause_id": pause_id, "execution": task_id, "status": "EARLY"}
    ]
    ctx = world.start(task_id)
    with ctx.fenced() as tx:
        taken = world.agboss.executions.pause_in(tx, "3ds", None, accept_early=True)
    assert taken == (True, '{"source": "return-page"}'), "the body goes on with the answer"
    assert world.execution(task_id).state is ExecutionState.RUNNING
    assert run_json(world.app, "pauses")["pauses"] == []


def test_a_second_early_answer_is_refused_like_a_second_answer(world: World) -> None:
    task_id = world.publish()
    pause_id = f"{task_id}:3ds"
    result = run(world.app, "answer-pause", pause_id, "webhook")
    assert result.exit_code == 0, result.output
    assert "before its task reached the pause" in result.output
    again = run(world.app, "answer-pause", pause_id, "return-page")
    assert again.exit_code == EXIT_REFUSED and "already answered" in again.output


def test_an_early_answer_for_an_ended_execution_is_refused(world: World) -> None:
    task_id = world.publish()
    assert cancel(world.app, task_id, "customer left").state is ExecutionState.CANCELLED
    result = run(world.app, "answer-pause", f"{task_id}:3ds", "webhook")
    assert result.exit_code == EXIT_REFUSED and "CANCELLED" in result.output
    assert run_json(world.app, "pauses")["pauses"] == []


def test_a_pause_that_does_not_accept_early_answers_waits_for_one_given_after_it(
    world: World,
) -> None:
    """An approval's answerer must see what it approves: an answer that came first is
    dropped, and the pause waits (and is listed) as any pause does."""
    task_id = world.publish()
    pause_id = f"{task_id}:approve"
    assert answer_pause(world.app, pause_id, "yes, unseen") is False
    ctx = world.start(task_id)
    with ctx.fenced() as tx:
        assert world.agboss.executions.pause_in(tx, "approve", '{"order": 1}') == (False, None)
    assert ctx.settle_all_and_release()
    assert run_json(world.app, "pauses")["pauses"] == [
        {"pause_id": pause_id, "execution": task_id, "status": "PENDING"}
    ]
    assert answer_pause(world.app, pause_id, "yes, seen") is True
    ctx = world.start(task_id)
    with ctx.fenced() as tx:
        assert world.agboss.executions.pause_in(tx, "approve", None) == (True, '"yes, seen"')


def test_an_early_answer_nobody_took_goes_with_its_execution_s_records(world: World) -> None:
    task_id = world.publish()
    assert answer_pause(world.app, f"{task_id}:3ds", "webhook") is False  # kept early
    assert cancel(world.app, task_id, "customer left").state is ExecutionState.CANCELLED
    assert _pause_rows(world, task_id) == ["EARLY"]
    world.clock.advance(timedelta(days=8))  # past the execution retention (7 days)
    world.sweep()
    assert world.agboss.executions.read_execution(task_id) is None
    assert _pause_rows(world, task_id) == []


def _pause_rows(world: World, execution_id: str) -> list[str]:
    with world.agboss.store.engine.connect() as conn:
        rows = conn.execute(
            select(pauses.c.status).where(pauses.c.execution_id == execution_id)
        ).all()
    return [str(row.status) for row in rows]
