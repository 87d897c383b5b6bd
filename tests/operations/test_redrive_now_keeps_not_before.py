"""An operator's verb publishes an execution again "now" only once its time has come
(design: re-driven when due): a ``WAITING`` execution's ``not_before`` is the retry its
body asked for (a charge of the balance an hour after the deposit: a cooling-off the
customer may still cancel in), or the spacing the sweep keeps while a message of it may
still be queued. ``redrive_now`` (behind ``resolve``'s "every waiter goes on", ``redrive``,
``unpark`` and ``answer-pause``) leaves such a row to the sweep, which publishes it when
due; the verbs that mean "now" make it due first, in their own transaction.

Twin ``redrive-now-ignores-not-before``: the message goes out at once, an hour early, and
a worker would charge the balance inside the cooling-off.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import signals as celery_signals

from celery_agboss.core.executions import ExecutionState
from celery_agboss.core.protections import REDRIVE_NOW_IGNORES_NOT_BEFORE
from celery_agboss.operator.acting import redrive_now
from celery_agboss.runtime.app_runtime import Runtime
from celery_agboss.testing import sabotage
from tests.operations.world import World, connected

COOLING_OFF_SECONDS = 3600


@pytest.fixture
def etas() -> Iterator[dict[str, list[Any]]]:
    """The ``eta`` header of every message published, by task id: None runs at once."""
    seen: dict[str, list[Any]] = {}

    def on_publish(sender: Any = None, headers: Any = None, **_: Any) -> None:
        headers = headers or {}
        seen.setdefault(str(headers.get("id")), []).append(headers.get("eta"))

    with connected(celery_signals.after_task_publish, on_publish):
        yield seen


def _deposit_then_cooling_off(world: World) -> str:
    """A delivery charges the deposit, then its body asks for a retry in an hour: a long
    wait in the store (what ``retry(countdown=3600)`` past the broker's limit writes), with
    the message the sweep publishes then. Its id, released and waiting."""
    execution_id = world.publish("o-1")
    ctx = world.start(execution_id)
    ctx.outbound(world.call, {"amount": 100, "order": "o-1"}, business_key="deposit:o-1")
    message = world.execution(execution_id).message
    with ctx.fenced() as tx:
        world.agboss.executions.wait_in(tx, COOLING_OFF_SECONDS * 1000, "retry", message)
    ctx.settle_all_and_release()
    assert world.execution(execution_id).state is ExecutionState.WAITING
    assert world.publishes_of(execution_id) == 1
    return execution_id


def test_redrive_now_leaves_a_body_s_own_wait_to_its_time(world: World) -> None:
    execution_id = _deposit_then_cooling_off(world)
    runtime = Runtime.of(world.app)
    assert not redrive_now(runtime, execution_id, reason="an intent it used was resolved")
    assert world.publishes_of(execution_id) == 1, "nothing published inside the cooling-off"
    assert world.execution(execution_id).state is ExecutionState.WAITING
    world.clock.advance(COOLING_OFF_SECONDS)
    assert redrive_now(runtime, execution_id, reason="due now")
    assert world.publishes_of(execution_id) == 2, "published once its time came"
    assert len(world.gateway.payments) == 1, "the deposit alone; no worker runs here"


def test_twin_redrive_now_publishes_inside_the_cooling_off(
    world: World, etas: dict[str, list[Any]]
) -> None:
    execution_id = _deposit_then_cooling_off(world)
    runtime = Runtime.of(world.app)
    with sabotage(REDRIVE_NOW_IGNORES_NOT_BEFORE):
        assert redrive_now(runtime, execution_id, reason="an intent it used was resolved")
    assert world.publishes_of(execution_id) == 2, "published an hour early"
    assert etas[execution_id][-1] is None, "with no ETA: a worker runs it at once"
