"""What operators read about failures that look like a payment left behind, and about
intents several executions share (design: records several executions share).

``agboss pending`` and its gauge list every ``FAILED`` or ``CANCELLED`` execution that
left a payment behind, however many older executions only look like one: a failure
whose charge a second click completed on, a failure whose undo refunded the charge.
``agboss show`` of an execution lists every intent it created, used or sent, not only
those it created; ``show KEY`` names every execution that used the key; ``resolve``
reports every execution it sent on.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from celery_agboss.core.compensation import (
    UndoContext,
    UndoStep,
)
from celery_agboss.core.executions import ExecutionState
from celery_agboss.core.outbound import CallContext, Lookup, OutboundCall, Unknown
from celery_agboss.core.protections import RETENTION_DELETES_UNHANDLED_PAYMENTS
from celery_agboss.core.store_protocol import IntentStatus
from celery_agboss.operator import (
    describe,
    list_failed_after_payment,
    list_waits,
    payments_handled,
    resolve,
)
from celery_agboss.store import counts, execution_admin
from celery_agboss.testing.switches import sabotage
from tests.operations.cli import run, run_json
from tests.operations.conftest import OnOneKey
from tests.operations.world import World

# --- executions that look like "failed after a payment" ------------------------------------


def _second_click_completes(world: World, order: str) -> str:
    """A second execution of ``order`` replays the first one's charge and completes: the
    charge is kept for it, so the failed first one left nothing behind."""
    second = world.publish(order)
    ctx = world.start(second)
    world.charge(ctx, order)
    with ctx.fenced() as tx:
        world.agboss.executions.finish_in(tx, '{"json": "paid"}')
    ctx.settle_all_and_release()
    return second


def _refund_call(world: World) -> OutboundCall:
    """The refund an undo sends: one more completed intent, which is the undo, not a
    payment."""

    def send(call: CallContext) -> object:
        return world.gateway.refund(call.request["payment"], call.idempotency_key)

    def reconcile(call: CallContext, lookup: Lookup) -> object:
        return Unknown("not looked up here")

    return world.agboss.register(
        OutboundCall(
            name="ops.refund",
            send=send,
            reconcile=reconcile,
            key_retention=timedelta(hours=24),
            transaction_id=lambda result: result.get("id"),
        )
    )


def _refunded_by_its_undo(world: World, refund: OutboundCall, order: str) -> str:
    """A delivery charges ``order`` and declares its refund; its body fails, the undo
    refunds the charge (an intent of its own), and the execution ends ``FAILED``."""

    def refund_it(undo: UndoContext, step: UndoStep) -> None:
        undo.outbound(refund, {"payment": step.arguments["payment"]})

    execution = world.failed_after_its_undo(order, refund_it)
    assert len(world.gateway.refunds) >= 1
    return execution


def _older_lookalikes(world: World, refund: OutboundCall, *, advance: int = 1) -> int:
    """Failed executions that left nothing behind, each ended before the next: three
    whose charge a second click completed on, one whose undo refunded. Their number."""
    for n in range(3):
        world.charged_then_failed(f"old-{n}")
        world.clock.advance(advance)
        _second_click_completes(world, f"old-{n}")
        world.clock.advance(advance)
    _refunded_by_its_undo(world, refund, "refunded")
    world.clock.advance(advance)
    return 4


def _listed(world: World, limit: int) -> list[str]:
    return [p.execution.id for p in list_failed_after_payment(world.app, limit=limit)]


def test_older_lookalikes_never_hide_a_payment_left_behind(world: World) -> None:
    lookalikes = _older_lookalikes(world, _refund_call(world))
    real = world.charged_then_failed("real")
    assert _listed(world, 10) == [real]
    for limit in (1, lookalikes - 1, lookalikes):
        assert _listed(world, limit) == [real], f"hidden behind the older ones at {limit}"
    text = run(world.app, "pending", "--limit", "1").output
    assert "1+ (--limit 1 reached; raise it to see the rest) execution(s) failed after a" in text
    assert real in text


def test_the_gauge_counts_payments_left_behind_not_executions_that_look_like_one(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    lookalikes = _older_lookalikes(world, _refund_call(world))
    world.charged_then_failed("real")
    assert world.failed_after_payment_gauge() == 1.0
    monkeypatch.setattr(counts, "FAILED_AFTER_PAYMENT_CAP", lookalikes - 1)
    assert world.failed_after_payment_gauge() == 1.0, (
        "the cap bounds what is counted, not what is looked at"
    )


def test_the_listing_pages_through_every_lookalike_oldest_first(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Several batches of candidates, some ended at the same database time: none is
    judged twice or skipped, and the payments left behind come oldest first."""
    monkeypatch.setattr(execution_admin, "_CANDIDATE_BATCH", 2, raising=False)
    refund = _refund_call(world)
    _older_lookalikes(world, refund, advance=0)
    first = world.charged_then_failed("real-1")
    world.clock.advance(1)
    later = [world.charged_then_failed(f"again-{n}") for n in range(2)]
    for n in range(2):
        _second_click_completes(world, f"again-{n}")
    second = world.charged_then_failed("real-2")
    assert _listed(world, 1) == [first]
    assert _listed(world, 2) == [first, second]
    assert _listed(world, 100) == [first, second]
    assert world.failed_after_payment_gauge() == 2.0
    assert all(world.execution(e).state is ExecutionState.FAILED for e in later)


PAST_RETENTION = 8 * 24 * 3600  # seconds: past the 7-day defaults of every retention


def _retention_after_a_payment_left_behind(world: World) -> tuple[str, str]:
    """Lookalikes and one failure that left its charge behind, then the clock past every
    retention and a sweep: the lookalikes' records and rows go. The real one's id and
    its charge's key."""
    refund = _refund_call(world)
    _older_lookalikes(world, refund)
    real = world.charged_then_failed("real")
    (charge,) = world.intents(real)
    world.clock.advance(PAST_RETENTION)
    report = world.sweep()
    assert report.intents_deleted >= 4 and report.executions_deleted >= 1, report
    return real, charge.idempotency_key


def test_retention_keeps_a_payment_left_behind_until_an_operator_dealt_with_it(
    world: World,
) -> None:
    """The charged customer of a failed order stays listed past every retention: only
    ``payments-handled`` lets its records go (design: retention)."""
    real, key = _retention_after_a_payment_left_behind(world)
    for _ in range(2):  # a second run deletes nothing more of it either
        assert _listed(world, 10) == [real]
        assert world.failed_after_payment_gauge() == 1.0
        assert [i.idempotency_key for i in world.intents(real)] == [key]
        world.sweep()
    payments_handled(world.app, real, "refunded by hand")
    world.clock.advance(PAST_RETENTION)
    world.sweep()
    assert world.intents(real) == []
    assert world.agboss.executions.read_execution(real) is None


def test_twin_retention_deletes_a_payment_nobody_dealt_with(world: World) -> None:
    with sabotage(RETENTION_DELETES_UNHANDLED_PAYMENTS):
        real, _ = _retention_after_a_payment_left_behind(world)
        world.sweep()
    assert _listed(world, 10) == [], "the twin should lose the charged customer"
    assert world.agboss.executions.read_execution(real) is None


# --- an intent several executions share ----------------------------------------------------


def test_show_of_an_execution_lists_the_shared_intent_it_waits_for(on_one_key: OnOneKey) -> None:
    world, first, second, key = on_one_key
    shown = describe(world.app, second)
    assert shown.execution is not None and shown.execution.id == second
    assert [i.idempotency_key for i in shown.intents] == [key]
    assert shown.intents[0].execution_id == first, "still shown as A's"
    assert shown.chains[key].ok and shown.history[key]
    assert shown.used_by[key] == [first, second]
    waits = {w.execution.id: w.intents for w in list_waits(world.app)}
    assert waits[second] == [key], "what pending says B waits for, show B shows"
    text = run(world.app, "show", second).output
    assert f"Execution {second}" in text and f"Intent {key}" in text
    assert f"used by: {first} (creator), {second}" in text
    data = run_json(world.app, "show", second)
    assert [i["idempotency_key"] for i in data["intents"]] == [key]
    assert data["used_by"] == {key: [first, second]}


def test_show_of_a_shared_key_names_every_execution_that_used_it(on_one_key: OnOneKey) -> None:
    world, first, second, key = on_one_key
    shown = describe(world.app, key)
    assert shown.execution is not None and shown.execution.id == first, "its creator"
    assert shown.focus == key and [i.idempotency_key for i in shown.intents] == [key]
    assert shown.used_by == {key: [first, second]}
    text = run(world.app, "show", key).output
    assert f"Execution {first}" in text
    assert f"used by: {first} (creator), {second}" in text
    assert run_json(world.app, "show", key)["used_by"] == {key: [first, second]}


def test_show_of_an_execution_alone_on_its_intent_says_it_created_it(world: World) -> None:
    execution = world.charged_then_failed("o-1")
    (intent,) = world.intents(execution)
    shown = describe(world.app, execution)
    assert [i.idempotency_key for i in shown.intents] == [intent.idempotency_key]
    assert shown.used_by == {intent.idempotency_key: [execution]}
    assert f"used by: {execution} (creator)\n" in run(world.app, "show", execution).output + "\n"


def test_resolve_reports_every_execution_it_sent_on(on_one_key: OnOneKey) -> None:
    world, first, second, key = on_one_key
    done = resolve(world.app, key, completed=world.gateway.payments[0], reason="seen")
    assert done.intent.status is IntentStatus.COMPLETED
    assert done.execution is not None and done.execution.id == first, "the creator, as before"
    assert done.republished
    assert done.republished_ids == [first, second]
    for execution in (first, second):
        assert world.publishes_of(execution) == 2, "published again now"


def test_resolve_on_the_command_line_names_every_execution_it_sent_on(on_one_key: OnOneKey) -> None:
    world, first, second, key = on_one_key
    receipt = json.dumps(world.gateway.payments[0])
    result = run(world.app, "resolve", key, "--completed", receipt, "--reason", "seen")
    assert result.exit_code == 0, result.output
    assert f"Execution {first} is" in result.output
    assert f"Also published again (they waited on it too): {second}." in result.output
