"""What operators are shown, retention, the metrics and ``rotate-keys``, with one row no
key of the process opens (design: sealed at rest, retention).

Each of them opened every sealed value of every row it read, outside any per-row try:
one such row made ``agboss pending``, ``executions`` and ``show`` raise, the retention
step fail on every run (it reads "failed after a payment" first), the exporter say
``store_up 0``, and ``rotate-keys`` stop at the same row on every run. Now the row is
listed, its values that do not open shown as such, naming the key, and the rows behind
it are handled; a payment it left behind is never deleted by retention.
"""

from __future__ import annotations

import base64
import logging
import os

import pytest
from sqlalchemy import insert, select

from celery_agboss.core import compensation
from celery_agboss.core.executions import ExecutionState
from celery_agboss.core.sealing import SEALED_PREFIX, key_variable
from celery_agboss.operator import (
    describe,
    list_executions,
    list_failed_after_payment,
    list_pending,
    list_waits,
)
from celery_agboss.store.counts import read_counts
from celery_agboss.store.rotation import Unopenable, rotate_keys
from celery_agboss.store.schema import fenced_effects, outbound_calls
from celery_agboss.store.schema_executions import executions
from tests.operations.cli import run, run_json
from tests.operations.conftest import WorldFactory
from tests.operations.poison import HELD_KEY, poison, sealed_world, unopenable
from tests.operations.world import World

NOT_HELD = "[sealed under key 'k0', not held by this process]"
"""What a listing shows for a value sealed under ``k0`` (``poison``'s key)."""

_e = executions.c


def _set(world: World, execution_id: str, **values: object) -> None:
    with world.agboss.store.engine.begin() as conn:
        conn.execute(executions.update().where(_e.id == execution_id).values(**values))


def _failed_after_payment(world: World, order: str) -> str:
    """An execution whose charge went through (a lookup completed it) and which then
    failed: the customer is charged, nothing will change that."""
    execution_id, _ = world.stranded(order=order)
    world.sweep()  # the lookup finds the charge: the intent COMPLETED
    (intent,) = world.intents(execution_id)
    assert intent.status.value == "COMPLETED", intent.status
    now = world.agboss.store.now_ms()
    _set(world, execution_id, state="FAILED", terminal_at_ms=now, reason="boom")
    return execution_id


def _sweep_errors(caplog: pytest.LogCaptureFixture) -> list[object]:
    return [
        r.__dict__.get("step") for r in caplog.records if r.__dict__.get("event") == "sweep.error"
    ]


# --- failed after a payment: the listing, retention, the metrics ----------------------


def test_failed_after_payment_lists_a_row_no_key_opens_and_the_one_behind_it(
    world_factory: WorldFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = sealed_world(world_factory, monkeypatch)
    old = _failed_after_payment(world, "o-old")
    world.clock.advance(1)
    fresh = _failed_after_payment(world, "o-fresh")
    poison(world, executions, _e.id, old, "args", "reason")

    found = {p.execution.id: p for p in list_failed_after_payment(world.app)}

    assert set(found) == {old, fresh}
    assert found[old].intents == [i.idempotency_key for i in world.intents(old)]
    assert found[old].execution.reason == NOT_HELD  # shown as such, never as empty
    assert found[old].unopened == f"agboss_executions.args: {NOT_HELD}"
    assert found[fresh].unopened is None and found[fresh].execution.reason == "boom"


def test_a_candidate_whose_undo_marks_do_not_open_is_held_whole_and_said_unjudged(
    world_factory: WorldFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What its undos refunded is unknown: every completed payment it made or used is
    listed, and the operator is told to look before refunding anything."""
    world = sealed_world(world_factory, monkeypatch)
    old = _failed_after_payment(world, "o-old")
    world.clock.advance(1)
    fresh = _failed_after_payment(world, "o-fresh")
    with world.agboss.store.engine.begin() as conn:
        conn.execute(
            insert(fenced_effects).values(
                key=f"{old}:undo:1",
                execution_id=old,
                name=compensation.UNDO_RECORD,
                result=unopenable(),
                token=1,
                created_at_ms=world.agboss.store.now_ms(),
            )
        )

    found = {p.execution.id: p for p in list_failed_after_payment(world.app)}

    assert set(found) == {old, fresh}
    assert found[old].intents == [i.idempotency_key for i in world.intents(old)]
    assert found[old].unopened == f"agboss_fenced_effects.result: {NOT_HELD}"
    assert "could not be judged" in found[old].ends_with
    assert found[fresh].ends_with.startswith("refund it at the gateway")


def test_retention_and_the_metrics_go_on_past_a_row_no_key_opens_and_keep_its_payment(
    world_factory: WorldFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    world = sealed_world(world_factory, monkeypatch)
    left = _failed_after_payment(world, "o-left")
    (payment,) = world.intents(left)
    done = world.publish("o-done")
    _set(world, done, state="COMPLETED", terminal_at_ms=world.agboss.store.now_ms())
    poison(world, executions, _e.id, left, "args")
    world.clock.advance(400 * 86400)  # past every retention
    caplog.set_level(logging.ERROR, logger="celery_agboss")

    for _ in range(2):  # and a later run does not stop on it either
        world.sweep()

    assert "retention" not in _sweep_errors(caplog)
    assert world.agboss.executions.read_execution(done) is None  # the row behind: deleted
    with world.agboss.store.engine.connect() as conn:
        kept = conn.execute(select(_e.id).where(_e.id == left)).scalar()
        intent = conn.execute(
            select(outbound_calls.c.idempotency_key).where(
                outbound_calls.c.idempotency_key == payment.idempotency_key
            )
        ).scalar()
    assert kept == left and intent == payment.idempotency_key  # the evidence of a charge
    assert read_counts(world.agboss.store).failed_after_payment == 1


# --- what operators list ----------------------------------------------------------------


def test_pending_and_show_list_an_intent_no_key_opens_and_the_one_behind_it(
    world_factory: WorldFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = sealed_world(world_factory, monkeypatch)
    old, old_key = world.stranded(order="o-old")
    world.clock.advance(1)
    _, fresh_key = world.stranded(order="o-fresh")
    poison(world, outbound_calls, outbound_calls.c.idempotency_key, old_key, "request")

    listed = {i.idempotency_key: i for i in list_pending(world.app)}
    shown = describe(world.app, old)

    assert set(listed) == {old_key, fresh_key}
    assert listed[old_key].request == NOT_HELD and listed[fresh_key].request != NOT_HELD
    assert [i.idempotency_key for i in shown.intents] == [old_key]
    assert shown.intents[0].request == NOT_HELD
    data = run_json(world.app, "pending")
    (view,) = [v for v in data["pending"] if v["idempotency_key"] == old_key]
    assert view["unopened"] == {"request": NOT_HELD}


def test_executions_and_waits_list_a_row_no_key_opens_and_the_one_behind_it(
    world_factory: WorldFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its reason says what ends its wait: the listing sends the operator to read it with
    the key, and guesses no command."""
    world = sealed_world(world_factory, monkeypatch)
    stuck, fresh = sorted([world.publish("o-stuck"), world.publish("o-fresh")])
    _set(world, stuck, state=ExecutionState.WAITING_OPERATOR.value)
    poison(world, executions, _e.id, stuck, "args", "reason")

    assert [r.id for r in list_executions(world.app)] == [stuck, fresh]
    (wait,) = list_waits(world.app)
    assert wait.execution.id == stuck and NOT_HELD in wait.ends_with
    assert f"agboss show {stuck}" in wait.ends_with
    listing = run(world.app, "executions")
    assert listing.exit_code == 0, listing.output
    assert fresh in listing.output and f"args, reason: {NOT_HELD}" in listing.output
    pending = run(world.app, "pending")
    assert pending.exit_code == 0 and stuck in pending.output, pending.output


# --- rotate-keys ------------------------------------------------------------------------


def test_rotate_keys_reseals_every_other_row_and_names_the_one_no_key_opens(
    world_factory: WorldFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = sealed_world(world_factory, monkeypatch)
    stuck, fresh = sorted([world.publish("o-stuck"), world.publish("o-fresh")])
    poison(world, executions, _e.id, stuck, "args")  # sorts first in every batch
    monkeypatch.setenv(key_variable("k2"), base64.b64encode(os.urandom(32)).decode())
    rotated = world_factory(encryption_keys=["k2", HELD_KEY])

    reports = [rotate_keys(rotated.agboss.store, batch_size=1) for _ in range(2)]

    with world.agboss.store.engine.connect() as conn:
        args = dict(conn.execute(select(_e.id, _e.args)).all())
    assert args[fresh].startswith(f"{SEALED_PREFIX}k2:")  # the row behind it: re-sealed
    for report in reports:  # and the next run does not stop on it either
        assert report.unopenable == [Unopenable("agboss_executions", "args", stuck, "k0")]
        assert not report.complete and report.left["agboss_executions.args"] == 1
    result = run(rotated.app, "rotate-keys")
    assert result.exit_code == 4, result.output
    assert f"agboss_executions.args of row {stuck}: sealed under key 'k0'" in result.output
