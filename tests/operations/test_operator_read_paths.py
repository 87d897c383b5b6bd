"""What ``agboss show``, ``executions`` and ``pending`` show of a row this process cannot
read whole, and what retention does with it (design: sealed at rest, retention).

An execution whose own sealed values no key of the process opens made ``show`` raise
(naming the table, column and key), as did one history row's sealed ``detail``; a state
written by a newer version of the package (unknown to this one) made ``executions``
and ``show`` raise ValueError, and retention read it as terminal and deleted the row: a
newer version's execution still running then found no record and ran the body again.
Now each page is shown, what did not open read as such, the state as its raw text; and
retention deletes only rows whose state this version knows to be terminal.
"""

from __future__ import annotations

import pytest
from sqlalchemy import select, text, update

from celery_agboss.core.executions import ExecutionState
from celery_agboss.errors import SealedValueUnopenableError
from celery_agboss.operator import describe, list_executions, read_pause
from celery_agboss.store.retention import delete_terminal_executions_before
from celery_agboss.store.schema import intent_history, outbound_calls
from celery_agboss.store.schema_executions import executions, pauses
from tests.operations.cli import run, run_json
from tests.operations.conftest import WorldFactory
from tests.operations.poison import poison, sealed_world, unopenable
from tests.operations.world import World

NOT_HELD = "[sealed under key 'k0', not held by this process]"
"""What an operator is shown of a value sealed under ``k0`` (``poison``'s key)."""

FUTURE_STATE = "SOME_FUTURE_STATE"
"""A state a newer version of the package may write; this one does not know it."""

_e = executions.c
_h = intent_history.c


def _raw_state(world: World, execution_id: str, state: str, **values: object) -> None:
    """Write ``state`` into the row by raw SQL, as a newer version's worker would."""
    with world.agboss.store.engine.begin() as conn:
        conn.execute(
            text("UPDATE agboss_executions SET state = :state WHERE id = :id"),
            {"state": state, "id": execution_id},
        )
        if values:
            conn.execute(update(executions).where(_e.id == execution_id).values(**values))


# --- show: values no key of this process opens --------------------------------------------


def test_show_an_execution_whose_own_values_no_key_opens(
    world_factory: WorldFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every value that opens is shown, each one that does not says so; exit 0 as for
    ``executions`` and ``pending`` with such a row."""
    world = sealed_world(world_factory, monkeypatch)
    execution_id, key = world.stranded(order="o-sealed")
    poison(world, executions, _e.id, execution_id, "args", "reason")

    shown = describe(world.app, execution_id)

    assert shown.execution is not None
    assert shown.execution.id == execution_id and shown.execution.reason == NOT_HELD
    assert shown.execution.args == NOT_HELD
    assert [i.idempotency_key for i in shown.intents] == [key]
    result = run(world.app, "show", execution_id)
    assert result.exit_code == 0, result.output
    assert f"Execution {execution_id}" in result.output and NOT_HELD in result.output
    assert f"Intent {key}" in result.output
    data = run_json(world.app, "show", execution_id)
    assert data["execution"]["unopened"] == {"args": NOT_HELD, "reason": NOT_HELD}
    assert data["execution"]["task_name"] == world.task.name


def test_show_an_intent_by_its_key_whose_request_no_key_opens(
    world_factory: WorldFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = sealed_world(world_factory, monkeypatch)
    _, key = world.stranded(order="o-sealed")
    poison(world, outbound_calls, outbound_calls.c.idempotency_key, key, "request")

    result = run(world.app, "show", key)

    assert result.exit_code == 0, result.output
    assert f"Intent {key} <-" in result.output and NOT_HELD in result.output
    data = run_json(world.app, "show", key)
    (intent,) = data["intents"]
    assert intent["unopened"] == {"request": NOT_HELD}


def test_show_a_history_row_whose_detail_no_key_opens_and_the_rest_of_the_history(
    world_factory: WorldFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The row is shown as not opened, every other row whole; its chain is said not
    checked from that row on, never broken (nothing was changed)."""
    world = sealed_world(world_factory, monkeypatch)
    execution_id, key = world.stranded(order="o-sealed")
    before = world.agboss.store.read_history(key)
    assert len(before) >= 2, before
    with world.agboss.store.engine.begin() as conn:
        conn.execute(
            update(intent_history)
            .where(_h.idempotency_key == key, _h.seq == 2)
            .values(detail=unopenable())
        )

    shown = describe(world.app, execution_id)

    rows = shown.history[key]
    assert [r.seq for r in rows] == [r.seq for r in before]
    assert rows[1].detail == NOT_HELD
    assert [r.detail for r in rows if r.seq != 2] == [r.detail for r in before if r.seq != 2]
    chain = shown.chains[key]
    assert not chain.ok and chain.first_broken_seq is None, chain
    assert "row 2's detail" in chain.reason and NOT_HELD in chain.reason
    result = run(world.app, "show", execution_id)
    assert result.exit_code == 0, result.output
    assert "CHAIN BROKEN" not in result.output and "chain not checked" in result.output
    data = run_json(world.app, "show", execution_id)
    assert data["history"][key][1]["unopened"] == {"detail": NOT_HELD}
    assert "unopened" not in data["history"][key][0]


# --- a state this version does not know --------------------------------------------------


def test_show_a_pause_whose_payload_no_key_opens_and_an_approver_is_refused_it(
    world_factory: WorldFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The execution's page shows the pause, what it asks said not opened; whoever
    answers it (``read_pause``) is refused: nobody approves what they cannot read."""
    world = sealed_world(world_factory, monkeypatch)
    execution_id = world.publish("o-paused")
    ctx = world.start(execution_id)
    with ctx.fenced() as tx:
        assert world.agboss.executions.pause_in(tx, "approve", '{"order": 1}') == (False, None)
    assert ctx.settle_all_and_release()
    pause_id = f"{execution_id}:approve"
    poison(world, pauses, pauses.c.id, pause_id, "payload")

    result = run(world.app, "show", execution_id)

    assert result.exit_code == 0, result.output
    assert NOT_HELD in result.output
    (shown,) = run_json(world.app, "show", execution_id)["pauses"]
    assert (shown["pause_id"], shown["payload"]) == (pause_id, NOT_HELD)
    with pytest.raises(SealedValueUnopenableError, match="k0"):
        read_pause(world.app, pause_id)


def test_executions_show_and_pending_show_a_state_this_version_does_not_know(
    world: World,
) -> None:
    future, known = sorted([world.publish("o-future"), world.publish("o-known")])
    _raw_state(world, future, FUTURE_STATE)

    listed = {r.id: r for r in list_executions(world.app)}

    assert set(listed) == {future, known}
    assert listed[future].state.value == FUTURE_STATE and not listed[future].terminal
    assert listed[known].state is ExecutionState.REQUESTED
    listing = run(world.app, "executions")
    assert listing.exit_code == 0, listing.output
    assert FUTURE_STATE in listing.output and known in listing.output
    data = run_json(world.app, "executions")
    assert {v["id"]: v["state"] for v in data["executions"]}[future] == FUTURE_STATE
    shown = run(world.app, "show", future)
    assert shown.exit_code == 0, shown.output
    assert f"state: {FUTURE_STATE}" in shown.output and "newer version" in shown.output
    assert run_json(world.app, "show", future)["execution"]["state"] == FUTURE_STATE
    pending = run(world.app, "pending")
    assert pending.exit_code == 0, pending.output


# --- retention ----------------------------------------------------------------------------


def test_retention_never_deletes_an_execution_in_a_state_this_version_does_not_know(
    world: World,
) -> None:
    """A newer version's execution may still be running: a delivery of it that found no
    record would run the body (and charge) again. Only known terminal states go."""
    future, done = world.publish("o-future"), world.publish("o-done")
    now = world.agboss.store.now_ms()
    _raw_state(world, future, FUTURE_STATE, terminal_at_ms=now)
    _raw_state(world, done, ExecutionState.COMPLETED.value, terminal_at_ms=now)
    world.clock.advance(400 * 86400)  # past every retention

    deleted = delete_terminal_executions_before(
        world.agboss.store, world.agboss.store.now_ms(), 100
    )

    assert deleted == 1
    with world.agboss.store.engine.connect() as conn:
        left = dict(conn.execute(select(_e.id, _e.state)).all())
    assert left == {future: FUTURE_STATE}
