"""``agboss_executions`` counts an execution in a state a newer version of the package
wrote (a rolling upgrade) as ``state="other"``: before, only this version's live states
were counted, so such an execution was in no series and every state read 0 while it
was live (it may wait for a person under the newer version's name). Read from the
store as a scrape reads it (``exposition``), on each backend.
"""

from __future__ import annotations

import pytest
from sqlalchemy import text

from celery_agboss.core.executions import ExecutionState
from celery_agboss.metrics.catalogue import OTHER
from celery_agboss.metrics.exporter import exposition
from celery_agboss.store import counts
from tests.operations.cli import run
from tests.operations.test_metrics import samples, value
from tests.operations.world import World

NEWER_STATE = "SOME_FUTURE_STATE"


def executions_gauge(world: World) -> dict[str, float]:
    out = exposition(world.app, directory=None).decode("utf-8")
    return {labels["state"]: v for n, labels, v in samples(out) if n == "agboss_executions"}


def written_by_a_newer_version(world: World, execution_id: str, state: str) -> None:
    with world.agboss.store.engine.begin() as conn:
        conn.execute(
            text("UPDATE agboss_executions SET state = :s WHERE id = :id"),
            {"s": state, "id": execution_id},
        )


def test_an_execution_in_a_newer_versions_state_is_counted_as_other(world: World) -> None:
    assert executions_gauge(world)[OTHER] == 0, "zero is a value"
    newer = world.publish()
    other_newer = world.publish()
    finished = world.publish()
    waiting = world.publish()
    written_by_a_newer_version(world, newer, NEWER_STATE)
    written_by_a_newer_version(world, other_newer, NEWER_STATE + "_TOO")
    written_by_a_newer_version(world, finished, ExecutionState.COMPLETED.value)

    gauge = executions_gauge(world)
    assert gauge[OTHER] == 2, gauge
    assert gauge[ExecutionState.REQUESTED.value] == 1, gauge  # ``waiting``, as before
    assert NEWER_STATE not in gauge, "a state's name is never a label: closed set"
    assert ExecutionState.COMPLETED.value not in gauge, "terminal states are not counted"
    assert world.execution(waiting).state is ExecutionState.REQUESTED


def test_the_metrics_command_shows_the_other_state(world: World) -> None:
    """``agboss metrics`` (a cron's textfile) says it too."""
    written_by_a_newer_version(world, world.publish(), NEWER_STATE)
    result = run(world.app, "metrics")
    assert result.exit_code == 0, result.output
    assert value(result.output, "agboss_executions", state=OTHER) == 1


def test_a_newer_state_is_counted_up_to_its_cap(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each state a newer version wrote is counted on the state index up to the cap, so
    the statement is never planned as a large count; the live states stay exact."""
    monkeypatch.setattr(counts, "NEWER_STATE_CAP", 2)
    for _ in range(3):
        written_by_a_newer_version(world, world.publish(), NEWER_STATE)
    written_by_a_newer_version(world, world.publish(), NEWER_STATE + "_TOO")
    for _ in range(3):
        world.publish()
    gauge = executions_gauge(world)
    assert (gauge[OTHER], gauge[ExecutionState.REQUESTED.value]) == (2 + 1, 3), gauge
