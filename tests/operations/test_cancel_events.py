"""An execution ended by a cancel or an expiry tells Flower: Celery's ``task-revoked``
under the execution's id, with the store's state, and the same fields whoever decided it
(its own delivery, the sweep, an operator): ``runtime.task_events.revoked_fields``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from celery_agboss.core.executions import ExecutionState
from celery_agboss.operator import cancel
from celery_agboss.runtime.task_events import send_revoked_in_delivery
from tests.operations.world import GRACE_SECONDS, World

REVOKED_AS_CANCELLED = {
    "type": "task-revoked",
    "terminated": False,
    "expired": False,
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


def test_the_sweeps_expiry_sends_task_revoked_as_expired(
    world: World, sent: list[dict[str, Any]]
) -> None:
    task_id = world.publish(expires=datetime.now(timezone.utc) + timedelta(seconds=30))
    world.clock.advance(GRACE_SECONDS + 1)
    assert world.sweep().expired == 1
    assert [e for e in sent if e["type"] == "task-revoked"] == [
        {**REVOKED_AS_CANCELLED, "uuid": task_id, "expired": True, "agboss_state": "EXPIRED"}
    ]


def test_a_cancel_in_its_delivery_sends_the_same_fields() -> None:
    """What the delivery's task sends for its own request (``retry=False``: a broker
    outage must not hold the delivery up)."""
    sent: list[dict[str, Any]] = []

    class Task:
        def send_event(self, type_: str, **fields: Any) -> None:
            sent.append({"type": type_, **fields})

    send_revoked_in_delivery(Task())
    assert sent == [{**REVOKED_AS_CANCELLED, "retry": False}]
