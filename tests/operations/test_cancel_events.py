"""A cancel decided outside its delivery (the sweep's, an operator's) tells Flower: Celery's
``task-revoked`` under the execution's id, with the store's state, as a cancel inside a
delivery does. Both send it through one function (``send_cancelled_event``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from celery_agboss.core.executions import ExecutionState
from celery_agboss.operator import cancel
from tests.operations.world import World

REVOKED_AS_CANCELLED = {
    "type": "task-revoked",
    "terminated": False,
    "agboss_state": "CANCELLED",
}


@pytest.fixture
def sent(world: World, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The task events the world's app sends, recorded where its dispatcher sends them."""
    events: list[dict[str, Any]] = []

    class Recording:
        def send(self, type_: str, **fields: Any) -> None:
            events.append({"type": type_, **fields})

    @contextmanager
    def dispatcher(*args: Any, **kwargs: Any) -> Iterator[Recording]:
        yield Recording()

    monkeypatch.setattr(world.app.events, "default_dispatcher", dispatcher)
    return events


def test_the_sweeps_cancel_sends_task_revoked(world: World, sent: list[dict[str, Any]]) -> None:
    task_id = world.publish()
    world.start(task_id)
    world.agboss.executions.request_cancel(task_id, "revoked with terminate")
    world.die()
    assert world.sweep().cancelled == 1
    assert world.execution(task_id).state is ExecutionState.CANCELLED
    assert [e for e in sent if e["type"] == "task-revoked"] == [
        {**REVOKED_AS_CANCELLED, "uuid": task_id}
    ]


def test_an_operators_cancel_sends_task_revoked(world: World, sent: list[dict[str, Any]]) -> None:
    task_id = world.publish()
    assert cancel(world.app, task_id, "the customer called").state is ExecutionState.CANCELLED
    assert [e for e in sent if e["type"] == "task-revoked"] == [
        {**REVOKED_AS_CANCELLED, "uuid": task_id}
    ]
