"""The sweep's reconcile meeting an execution whose state a newer version of the package
wrote (a rolling upgrade: an old beat still sweeping).

The lookup settled the stranded intent, then re-driving its waiter read a state this
version does not know and raised ``ValueError``: the whole reconcile step stopped there
(``sweep.error step=reconcile``, a traceback, counted as an error), and the stranded
intents after it in the batch waited for the next run. Now such an execution is left to
the newer version's sweep, said once as a WARNING naming it and its state, its row
untouched, and the step goes on with the others (design: sweep reconciles).
"""

from __future__ import annotations

import logging

import pytest
from sqlalchemy import text

from celery_agboss.core.executions import ExecutionState
from celery_agboss.core.store_protocol import IntentStatus
from celery_agboss.store.held_messages import write_held
from tests.operations.conftest import WorldFactory
from tests.operations.world import TTL_SECONDS, World
from tests.support.newer_states import FUTURE_STATE, write_raw_state


def _stored_state(world: World, execution_id: str) -> str:
    with world.agboss.store.engine.connect() as conn:
        found = conn.execute(
            text("SELECT state FROM agboss_executions WHERE id = :id"), {"id": execution_id}
        )
        return str(found.scalar())


def _left_to_newer(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "reason", None) == "state-of-a-newer-version"]


def _stranded_newer_then_ours(world: World) -> tuple[str, str, str, str]:
    """Two stranded charges, oldest first: one whose execution a newer version then
    moved on, and one of an execution this version knows."""
    newer, newer_key = world.stranded()
    write_raw_state(world.agboss.store.engine, newer, FUTURE_STATE)
    ours, our_key = world.stranded()
    return newer, newer_key, ours, our_key


def test_reconcile_leaves_a_newer_versions_execution_alone_and_settles_the_rest(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    newer, newer_key, ours, our_key = _stranded_newer_then_ours(world)

    with caplog.at_level(logging.WARNING, logger="celery_agboss"):
        report = world.sweep_sending_nothing()

    assert report.errors == 0
    assert report.reconciled == 2
    for key in (newer_key, our_key):
        intent = world.agboss.store.read_intent(key)
        assert intent is not None and intent.status is IntentStatus.COMPLETED
    assert _stored_state(world, newer) == FUTURE_STATE  # the newer version's to go on with
    assert world.execution(ours).state is not ExecutionState.WAITING_OPERATOR
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    (said,) = _left_to_newer(caplog)
    assert said.levelno == logging.WARNING
    line = said.getMessage()
    assert "step=reconcile" in line and f"execution_id={newer}" in line
    assert f"state={FUTURE_STATE}" in line and "newer version" in line
    assert len(world.gateway.requests) == 2  # the two first charges, none since


def test_an_unreconciled_intent_of_a_newer_versions_execution_is_flagged_and_its_row_kept(
    world_factory: WorldFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """The lookup cannot tell: the intent waits for a person, the execution's state is the
    newer version's to change (this version would have moved it to WAITING_OPERATOR)."""
    world = world_factory(lookup="none")
    execution_id, key = world.stranded()
    write_raw_state(world.agboss.store.engine, execution_id, FUTURE_STATE)

    with caplog.at_level(logging.WARNING, logger="celery_agboss"):
        report = world.sweep_sending_nothing()

    assert report.errors == 0 and report.unreconciled == 1
    intent = world.agboss.store.read_intent(key)
    assert intent is not None and intent.needs_operator
    assert _stored_state(world, execution_id) == FUTURE_STATE
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(_left_to_newer(caplog)) == 1


def test_a_dead_workers_held_message_of_a_newer_versions_execution_is_left_to_it(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    """The held-messages step read the row, a state it does not know, and logged an ERROR
    with a traceback on every run: now the one WARNING of the other steps, and the rest of
    the dead worker's messages go out."""
    newer, ours = sorted([world.publish("o-newer"), world.publish("o-ours")])
    write_raw_state(world.agboss.store.engine, newer, FUTURE_STATE)
    write_held(world.agboss.store, "dead-worker", [newer, ours])
    world.clock.advance(TTL_SECONDS + 1)

    with caplog.at_level(logging.WARNING, logger="celery_agboss"):
        report = world.sweep()

    assert report.errors == 0
    assert world.publishes_of(ours) == 2 and world.publishes_of(newer) == 1
    assert _stored_state(world, newer) == FUTURE_STATE
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    (said,) = _left_to_newer(caplog)
    assert "step=held" in said.getMessage() and f"execution_id={newer}" in said.getMessage()
