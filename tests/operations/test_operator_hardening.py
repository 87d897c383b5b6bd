"""What an operator's decision may not do silently (issue "hardening", items 1 and 6).

- ``resolve --completed`` is checked against the call (its ``validate_result``, else its
  ``transaction_id``); a call that declares neither refuses every operator's answer,
  since a mistyped one would reach the body as the gateway's answer (twin: the check
  switched off, the execution then fails with the customer charged).
- A ``FAILED`` execution that left a completed payment behind is listed by ``agboss
  pending`` as "failed after a payment" and counted by a gauge, until an operator says
  it is dealt with (``payments-handled``); one whose payment another execution
  completed on is not. A cancel after a payment ends ``CANCELLED`` only on the
  operator's ``--payments-handled``; that ``CANCELLED`` one is listed the same way
  (docs/operators.md). The listing has no sabotage switch of its own.
- ``resolve --not-sent`` past the key's retention is refused unless the operator names
  the risk (``may_charge_twice``): with it, the resend is a second charge. One resolved
  in time but delivered past the retention goes back to the operator, key-too-old
  (twin ``not-sent-resend-unbounded``: charged twice).
- Every operator decision (cancel, unpark, redrive, accept, answer-pause) writes its
  audit row in the change's transaction: when the row cannot be written, nothing
  changes (twin: the row written afterwards, apart, and the change stands with no row).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import pytest
from sqlalchemy import text

from celery_agboss import answer_pause
from celery_agboss.core.executions import CANCELLED_AFTER_PAYMENT, DIVERGENCE, ExecutionState
from celery_agboss.core.protections import (
    AUDIT_AFTER_THE_CHANGE,
    NOT_SENT_RESEND_UNBOUNDED,
    OPERATOR_RESULT_UNCHECKED,
)
from celery_agboss.core.store_protocol import IntentStatus
from celery_agboss.errors import (
    AGBossSignal,
    OperatorRefusedError,
    OutboundCallUnreconciledError,
    StoreError,
)
from celery_agboss.operator import (
    accept,
    cancel,
    list_failed_after_payment,
    list_pauses,
    list_waits,
    payments_handled,
    redrive,
    resolve,
    unpark,
)
from celery_agboss.testing.switches import sabotage
from tests.operations.conftest import WorldFactory
from tests.operations.world import CAP, World

REQUEST = {"amount": 1000, "order": "o-1"}


# --- 1. resolve --completed is checked ------------------------------------------------------


def _stranded_without_a_lookup(world: World) -> str:
    """An answer lost, the lookup unable to tell: the intent waits for an operator."""
    _, key = world.stranded(order="o-1")
    world.sweep()
    intent = world.agboss.store.read_intent(key)
    assert intent is not None and intent.needs_operator
    return key


def test_an_answer_for_a_call_that_cannot_check_it_is_refused(
    world_factory: WorldFactory,
) -> None:
    world = world_factory(unchecked=True, lookup="none")
    key = _stranded_without_a_lookup(world)
    with pytest.raises(OperatorRefusedError, match="declares no way to check"):
        resolve(world.app, key, completed={"status": "succeeded"}, reason="dashboard says paid")
    intent = world.agboss.store.read_intent(key)
    assert intent is not None and intent.status is IntentStatus.PENDING


def test_twin_an_unchecked_answer_reaches_the_body_as_the_gateway_s(
    world_factory: WorldFactory,
) -> None:
    world = world_factory(unchecked=True, lookup="none")
    key = _stranded_without_a_lookup(world)
    with sabotage(OPERATOR_RESULT_UNCHECKED):
        resolve(world.app, key, completed={"status": "succeeded"}, reason="dashboard says paid")
    intent = world.agboss.store.read_intent(key)
    assert intent is not None and intent.result == {"status": "succeeded"}, "no receipt id"


# --- 1. failed after a payment ----------------------------------------------------------------


def test_a_failure_after_a_payment_is_listed_and_counted_until_marked_handled(
    world: World,
) -> None:
    execution = world.charged_then_failed("o-2")
    [left] = list_failed_after_payment(world.app)
    assert left.execution.id == execution and left.execution.state is ExecutionState.FAILED
    assert left.intents == [i.idempotency_key for i in world.intents(execution)]
    assert "payments-handled" in left.ends_with
    assert world.failed_after_payment_gauge() == 1.0
    marked = payments_handled(world.app, execution, "refunded at the gateway", actor="ops")
    assert marked.payments_handled_at_ms is not None
    assert list_failed_after_payment(world.app) == [] and world.failed_after_payment_gauge() == 0.0
    [row] = world.agboss.executions.list_audit(execution)
    assert (row.actor, row.action) == ("ops", "payments-handled")


def test_a_failure_whose_charge_another_execution_completed_on_is_not_listed(
    world: World,
) -> None:
    first = world.charged_then_failed("o-3")
    second = world.publish("o-3")
    ctx = world.start(second)  # a second click of the order replays the charge, completes
    ctx.outbound(world.call, {"amount": 1000, "order": "o-3"}, business_key="order:o-3")
    with ctx.fenced() as tx:
        world.agboss.executions.finish_in(tx, '{"json": "paid"}')
    ctx.settle_all_and_release()
    assert [p.execution.id for p in list_failed_after_payment(world.app)] == []
    assert world.execution(first).state is ExecutionState.FAILED


def _charged_then_waiting(world: World, order: str) -> str:
    """A delivery charged, then chose to wait (a long retry): not running, nothing pending."""
    execution = world.publish(order)
    ctx = world.start(execution)
    ctx.outbound(world.call, {"amount": 1000, "order": order}, business_key=f"order:{order}")
    with ctx.fenced() as tx:
        world.agboss.executions.wait_in(tx, 3_600_000, "retry")
    ctx.settle_all_and_release()
    return execution


def test_a_cancel_after_a_payment_ends_once_the_operator_confirms_it_handled(
    world: World,
) -> None:
    """The only way a charged execution ends CANCELLED is the operator's
    ``--payments-handled``, which is the confirmation ``payments-handled`` would ask
    for: its charge stays COMPLETED, and it is not listed again as "failed after a
    payment" (one confirmation, audited once)."""
    execution = _charged_then_waiting(world, "o-7")
    waiting = cancel(world.app, execution, "the customer changed their mind", actor="ops")
    assert waiting.state is ExecutionState.WAITING_OPERATOR, "never silently CANCELLED"
    assert (waiting.reason or "").startswith(CANCELLED_AFTER_PAYMENT)
    assert [w.execution.id for w in list_waits(world.app)] == [execution]
    assert list_failed_after_payment(world.app) == [] and world.failed_after_payment_gauge() == 0.0
    ended = cancel(world.app, execution, "kept at the gateway", actor="ops", payments_handled=True)
    assert ended.state is ExecutionState.CANCELLED
    [intent] = world.intents(execution)
    assert intent.status is IntentStatus.COMPLETED and intent.compensated_at_ms is None
    assert ended.payments_handled_at_ms is not None
    assert list_failed_after_payment(world.app) == [] and world.failed_after_payment_gauge() == 0.0
    actions = [row.action for row in world.agboss.executions.list_audit(execution)]
    assert sorted(actions) == ["cancel", "cancel:payments-handled"]


# --- 6. resolve --not-sent past the key's retention -------------------------------------------


def _not_sent_past_retention(world: World, **options: bool) -> str:
    execution, key = world.stranded(order="o-4")
    world.sweep()  # the lookup cannot tell (the gateway's lookup is switched off)
    world.clock.advance(timedelta(hours=25))  # past the call's 24 h key retention
    world.gateway.forget_keys()
    resolve(world.app, key, not_sent=True, reason="not in the dashboard", **options)
    return execution


def test_a_not_sent_past_the_key_s_retention_is_refused_without_naming_the_risk(
    world_factory: WorldFactory,
) -> None:
    world = world_factory(lookup="none")
    with pytest.raises(OperatorRefusedError, match=r"second charge.*--may-charge-twice"):
        _not_sent_past_retention(world)
    assert len(world.gateway.payments) == 1


def test_twin_naming_the_risk_resends_it_and_the_customer_pays_twice(
    world_factory: WorldFactory,
) -> None:
    world = world_factory(lookup="none")
    execution = _not_sent_past_retention(world, may_charge_twice=True)
    world.deliver_again(execution)
    assert len(world.gateway.payments) == 2, "the risk the flag names"


def _resolved_in_time_resent_late(world: World) -> tuple[str, str, AGBossSignal | None]:
    """Resolved ``--not-sent`` 10 minutes inside the bound (allowed), delivered after the
    key's retention passed (a backlog): the resend would not be deduplicated."""
    execution = world.publish("o-5")
    key, _ = world.strand(execution)  # the gateway charged; its answer was lost
    world.sweep()  # the lookup cannot tell
    world.clock.advance(timedelta(hours=23, minutes=50))
    resolve(world.app, key, not_sent=True, reason="not in the dashboard (yet)")
    world.clock.advance(timedelta(minutes=20))
    world.gateway.forget_keys()
    return execution, key, world.deliver_again(execution)


def test_a_not_sent_resolved_in_time_is_not_resent_once_its_key_is_too_old(
    world_factory: WorldFactory,
) -> None:
    """The key's age is judged when the resend is claimed, not only when the operator
    resolved (design: key age): the intent goes back to the operator, key-too-old, and
    only ``--may-charge-twice`` sends it again."""
    world = world_factory(lookup="none")
    execution, key, stopped = _resolved_in_time_resent_late(world)
    assert len(world.gateway.payments) == 1
    assert isinstance(stopped, OutboundCallUnreconciledError), stopped
    assert stopped.fields["reason"] == "key-too-old"
    intent = world.agboss.store.read_intent(key)
    assert intent is not None and intent.status is IntentStatus.PENDING
    assert intent.needs_operator and intent.operator_reason == "key-too-old"
    resolve(world.app, key, not_sent=True, reason="checked again", may_charge_twice=True)
    world.deliver_again(execution)
    assert len(world.gateway.payments) == 2, "sent again only once the risk was named"


def test_twin_a_not_sent_resolved_in_time_is_resent_past_its_key_and_charged_twice(
    world_factory: WorldFactory,
) -> None:
    world = world_factory(lookup="none")
    with sabotage(NOT_SENT_RESEND_UNBOUNDED):
        _resolved_in_time_resent_late(world)
    assert len(world.gateway.payments) == 2


# --- 6. the audit row commits with the change ---------------------------------------------------


def _audit_table_broken(world: World) -> None:
    """The audit row cannot be written (a lost grant, a full disk: here, no table)."""
    with world.agboss.store.engine.begin() as conn:
        conn.execute(text("ALTER TABLE agboss_audit RENAME TO agboss_audit_gone"))


def _waiting(world: World) -> str:
    execution = world.publish("o-5")
    ctx = world.start(execution)
    with ctx.fenced() as tx:
        world.agboss.executions.wait_in(tx, 3_600_000, "retry")
    ctx.settle_all_and_release()
    return execution


def _parked(world: World) -> str:
    """A delivery that keeps dying: ``PARKED`` past the recovery cap."""
    execution = world.publish("o-6")
    for _ in range(CAP + 1):
        world.start(execution)
        world.die()
        world.sweep()
    return execution


def _waiting_for_an_operator(world: World) -> str:
    """Its undo raised (what a delivery writes then): nothing for ``resolve``, a ``redrive``
    runs it again."""
    execution = world.publish("o-8")
    ctx = world.start(execution)
    with ctx.fenced() as tx:
        world.agboss.executions.waiting_operator_in(
            tx, "undo refund-charge failed: RuntimeError: the refund API is down"
        )
    ctx.settle_all_and_release()
    return execution


def _diverged(world: World) -> str:
    """A re-run's body no longer made the charge an earlier delivery completed."""
    execution = world.publish("o-9")
    ctx = world.start(execution)
    ctx.outbound(world.call, {"amount": 1000, "order": "o-9"}, business_key="order:o-9")
    world.die()
    rerun = world.start(execution)
    with rerun.fenced() as tx:
        world.agboss.executions.finish_in(tx, '{"json": "paid"}', rerun.reached_keys())
    rerun.settle_all_and_release()
    assert (world.execution(execution).reason or "").startswith(DIVERGENCE)
    return execution


def _paused(world: World) -> str:
    """A delivery paused at ``approve`` and let go of its lease."""
    execution = world.publish("o-10")
    ctx = world.start(execution)
    with ctx.fenced() as tx:
        world.agboss.executions.pause_in(tx, "approve", None)
    ctx.settle_all_and_release()
    return execution


@dataclass(frozen=True)
class _Decision:
    """An operator decision on an execution made ready for it: its state before, and
    after (when it stands)."""

    ready: Callable[[World], str]
    decide: Callable[[World, str], object]
    before: ExecutionState
    after: ExecutionState


S = ExecutionState
DECISIONS = {
    "cancel": _Decision(
        _waiting,
        lambda w, e: cancel(w.app, e, "changed their mind", actor="ops"),
        S.WAITING,
        S.CANCELLED,
    ),
    "unpark": _Decision(
        _parked, lambda w, e: unpark(w.app, e, "fixed the OOM", actor="ops"), S.PARKED, S.WAITING
    ),
    "redrive": _Decision(
        _waiting_for_an_operator,
        lambda w, e: redrive(w.app, e, "the refund API is back", actor="ops"),
        S.WAITING_OPERATOR,
        S.WAITING,
    ),
    "accept": _Decision(
        _diverged,
        lambda w, e: accept(w.app, e, "the old charge is refunded", actor="ops"),
        S.WAITING_OPERATOR,
        S.COMPLETED,
    ),
    "answer-pause": _Decision(
        _paused,
        lambda w, e: answer_pause(w.app, f"{e}:approve", {"approved": True}, actor="ops"),
        S.PAUSED,
        S.WAITING,
    ),
}


@pytest.mark.parametrize("name", sorted(DECISIONS))
def test_a_decision_whose_audit_row_cannot_be_written_changes_nothing(
    world: World, name: str
) -> None:
    decision = DECISIONS[name]
    execution = decision.ready(world)
    assert world.execution(execution).state is decision.before
    published = world.publishes_of(execution)
    _audit_table_broken(world)
    with pytest.raises(StoreError):
        decision.decide(world, execution)
    assert world.execution(execution).state is decision.before
    assert world.publishes_of(execution) == published, "nothing published again"
    if name == "answer-pause":
        assert list_pauses(world.app) == [(f"{execution}:approve", execution, "PENDING")]


@pytest.mark.parametrize("name", sorted(DECISIONS))
def test_twin_a_decision_whose_audit_row_is_written_apart_stands_untraced(
    world: World, name: str
) -> None:
    decision = DECISIONS[name]
    execution = decision.ready(world)
    _audit_table_broken(world)
    with sabotage(AUDIT_AFTER_THE_CHANGE), pytest.raises(StoreError):
        decision.decide(world, execution)
    assert world.execution(execution).state is decision.after
    with world.agboss.store.engine.begin() as conn:
        conn.execute(text("ALTER TABLE agboss_audit_gone RENAME TO agboss_audit"))
    assert world.agboss.executions.list_audit(execution) == [], "a change nobody can trace"
