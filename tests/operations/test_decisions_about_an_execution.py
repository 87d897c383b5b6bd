"""Decisions about an execution another party is acting on: taken on what is really
there, never on what a plain read shows.

- The pending intent of an execution (design: pending intent), one definition for every verb: a
  ``PENDING`` intent it created, owns through its lease, or that is held on its behalf.
  While the sweep holds an intent for its lookup, a redelivery whose body raises must
  not make the execution ``FAILED`` (the lookup then finds the payment), nor may a
  cancel end it.
- Every decision about another holder's lease (design: another holder's lease) is taken under that
  lease row's lock. On PostgreSQL at READ COMMITTED a fenced transaction's extension is
  invisible until it commits: once the committed expiry passed, a plain read says
  "dead" while the holder is committing the claim of a charge. (SQLite serialises
  writers: a decision waits for the fenced transaction, so only PostgreSQL has the
  hole; those tests run there.)
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest

from celery_agboss.core.executions import ExecutionState, StartKind
from celery_agboss.core.fault_points import (
    FENCED_BEFORE_COMMIT,
    OUTBOUND_BEFORE_SEND,
    RECONCILE_AFTER_LOOKUP,
)
from celery_agboss.core.lease import new_holder
from celery_agboss.core.protections import (
    LEASE_DECISION_ON_COMMITTED_READ,
    PENDING_INTENT_BY_CREATOR,
    PENDING_INTENT_NARROW,
)
from celery_agboss.core.store_protocol import IntentStatus
from celery_agboss.errors import ExecutionFencedError, OutboundCallOutcomeUnknownError
from celery_agboss.testing.fault_arming import arm_pause, arm_raise
from celery_agboss.testing.gateway_types import FakeGatewayFault
from celery_agboss.testing.switches import sabotage
from tests.operations.conftest import WorldFactory
from tests.operations.world import World

POSTGRES_ONLY = pytest.mark.parametrize(
    "ops_store_url", [pytest.param("postgresql", marks=pytest.mark.postgres)], indirect=True
)
ERROR = '{"type": "builtins.ValueError", "message": "out of stock", "args": ["out of stock"]}'


def _sweep_holds_the_intent(world: World) -> tuple[str, Any, threading.Thread]:
    """A delivery's charge lost its answer and the delivery died; the sweep takes the
    intent for its lookup and is paused right after the gateway answered."""
    task_id, _ = world.stranded(FakeGatewayFault.ANSWER_THEN_DROP)
    paused = arm_pause(RECONCILE_AFTER_LOOKUP)
    sweeper = threading.Thread(target=world.sweep, name="sweeper")
    sweeper.start()
    paused.wait_reached(10)
    return task_id, paused, sweeper


def _redelivery_body_raises(world: World, task_id: str) -> ExecutionState:
    ctx = world.start(task_id)
    with ctx.fenced() as tx:
        state = world.agboss.executions.fail_in(tx, ERROR, "ValueError").state
    ctx.settle_all_and_release()
    return state


def test_an_intent_the_sweep_holds_for_its_lookup_is_still_the_executions(
    world: World,
) -> None:
    task_id, paused, sweeper = _sweep_holds_the_intent(world)
    try:
        assert _redelivery_body_raises(world, task_id) is ExecutionState.WAITING_OPERATOR
        cancelled = world.agboss.executions.request_cancel(task_id, "revoked")
        assert cancelled is not None and cancelled.state is not ExecutionState.CANCELLED
    finally:
        paused.release()
        sweeper.join(20)
    (intent,) = world.intents(task_id)
    assert intent.status is IntentStatus.COMPLETED, "the lookup found the payment"
    assert world.execution(task_id).state is not ExecutionState.FAILED


def test_a_narrower_definition_fails_an_execution_whose_payment_went_through(
    world: World,
) -> None:
    with sabotage(PENDING_INTENT_NARROW):
        task_id, paused, sweeper = _sweep_holds_the_intent(world)
        try:
            assert _redelivery_body_raises(world, task_id) is ExecutionState.FAILED
        finally:
            paused.release()
            sweeper.join(20)
    (intent,) = world.intents(task_id)
    assert intent.status is IntentStatus.COMPLETED
    assert len(world.gateway.payments) == 1, "a FAILED execution, and the customer charged"


class Crash(BaseException):
    """The delivery died here: nothing after this point runs."""


def _sweep_holds_a_charge_another_click_re_sent(world: World) -> tuple[str, str, Any, Any]:
    """Two clicks on one order: A claims the charge and dies before sending it; B takes
    the intent over, finds nothing sent, sends it (its attempt: ``sent_by`` is B, the
    creator stays A), loses the answer and dies. The sweep takes the intent for its
    lookup and is paused right after the gateway answered. Returns B, the key, the
    pause and the sweeper."""
    order = uuid.uuid4().hex[:8]
    request, key_of_order = {"amount": 1000, "order": order}, f"order:{order}"
    first, second = world.publish(order), world.publish(order)
    arm_raise(OUTBOUND_BEFORE_SEND, Crash)  # once
    with pytest.raises(Crash):
        world.start(first).outbound(world.call, request, business_key=key_of_order)
    world.die()
    world.gateway.inject_fault(FakeGatewayFault.ANSWER_THEN_DROP)
    with pytest.raises(OutboundCallOutcomeUnknownError):
        world.start(second).outbound(world.call, request, business_key=key_of_order)
    world.die()
    (intent,) = world.intents(first)
    assert (intent.execution_id, intent.sent_by) == (first, second), intent
    paused = arm_pause(RECONCILE_AFTER_LOOKUP)
    sweeper = threading.Thread(target=world.sweep, name="sweeper")
    sweeper.start()
    paused.wait_reached(10)
    return second, intent.idempotency_key, paused, sweeper


def _charged_after(world: World, key: str, paused: Any, sweeper: threading.Thread) -> None:
    paused.release()
    sweeper.join(20)
    with world.agboss.store.read_transaction() as tx:
        intent = tx.read_intent(key)
    assert intent is not None and intent.status is IntentStatus.COMPLETED, "the payment found"
    assert len(world.gateway.payments) == 1


def test_a_charge_this_execution_re_sent_is_its_pending_intent_while_the_sweep_holds_it(
    world: World,
) -> None:
    """Who sent decides, not who created (design: who sent): the execution whose attempt
    is on the wire may not end FAILED or CANCELLED while the sweep looks it up."""
    second, key, paused, sweeper = _sweep_holds_a_charge_another_click_re_sent(world)
    try:
        assert _redelivery_body_raises(world, second) is ExecutionState.WAITING_OPERATOR
        cancelled = world.agboss.executions.request_cancel(second, "revoked")
        assert cancelled is not None and cancelled.state is not ExecutionState.CANCELLED
    finally:
        _charged_after(world, key, paused, sweeper)
    assert world.execution(second).state is not ExecutionState.FAILED


def test_counting_only_what_it_created_or_holds_fails_the_execution_that_paid(
    world: World,
) -> None:
    with sabotage(PENDING_INTENT_BY_CREATOR):
        second, key, paused, sweeper = _sweep_holds_a_charge_another_click_re_sent(world)
        try:
            assert _redelivery_body_raises(world, second) is ExecutionState.FAILED
        finally:
            _charged_after(world, key, paused, sweeper)
    assert world.execution(second).state is ExecutionState.FAILED, "FAILED, with its charge made"


# --- decisions under the lease row's lock (PostgreSQL) -----------------------------------


CLAIM_TTL_SECONDS = 30


@pytest.fixture
def claiming_world(world_factory: WorldFactory) -> World:
    """A 30 s lease: the claim below must begin before the committed expiry in real time
    too, and a loaded machine took more than the suite's 5 s lease's last second."""
    return world_factory(lease_ttl=CLAIM_TTL_SECONDS)


def _claiming_while_the_committed_expiry_passes(
    world: World, *, in_one_statement: bool = False
) -> tuple[str, Any, Any]:
    """The holder's fenced transaction (a fenced effect marking the order paid: its
    record written, the lease extended uncommitted) begins before its lease's committed
    expiry and is paused before COMMIT while the clock passes that committed expiry (a
    ``claiming_world``'s lease: 10 s of real time on each side). Returns once paused; the
    transaction commits when ``_release`` lets it go on.

    ``in_one_statement``: the holder's claim of a charge instead, which PostgreSQL runs
    as one statement: paused before it is sent, it holds no lock meanwhile."""
    task_id = world.publish()
    ctx = world.start(task_id)
    done: dict[str, Any] = {}

    def charge() -> None:
        try:
            if in_one_statement:
                done["result"] = ctx.outbound(
                    world.call, {"amount": 1000, "order": task_id}, business_key=f"order:{task_id}"
                )
            else:
                done["result"] = ctx.fenced_effect("mark-paid", lambda conn: "paid")
        except BaseException as exc:  # reported by the test
            done["error"] = exc

    world.clock.advance(CLAIM_TTL_SECONDS - 10)  # the claim begins before the expiry
    before_commit = arm_pause(FENCED_BEFORE_COMMIT)
    holder = threading.Thread(target=charge, name="holder")
    holder.start()
    before_commit.wait_reached(10)
    world.clock.advance(12)  # committed expiry passed; the claim's own extension did not
    return task_id, before_commit, (holder, done)


def _release(paused: Any, holder: Any) -> dict[str, Any]:
    thread, done = holder
    paused.release()
    thread.join(20)
    return done  # type: ignore[no-any-return]


@POSTGRES_ONLY
def test_a_lease_inside_a_running_fenced_transaction_is_live_to_every_decision(
    claiming_world: World,
) -> None:
    world = claiming_world
    task_id, paused, holder = _claiming_while_the_committed_expiry_passes(world)
    try:
        executions = world.agboss.executions
        executions.request_cancel(task_id, "revoked")
        ended = executions.end_cancel_requested(task_id, "revoked")  # the sweep's verb
        assert ended is not None and ended.state is ExecutionState.RUNNING
        record = world.execution(task_id)
        claim = executions.claim_redrive(task_id, record.updated_at_ms, 10)
        assert not claim.republish, "a live delivery is never re-published"
        duplicate = executions.start_delivery(record.message, new_holder(), 5000, 10)
        assert duplicate.kind is StartKind.DEFERRED, "nor taken over"
    finally:
        done = _release(paused, holder)
    assert done.get("result") == "paid", done
    assert world.execution(task_id).state is not ExecutionState.CANCELLED


@POSTGRES_ONLY
def test_a_one_statement_claim_not_yet_sent_holds_nothing_and_is_refused_once_expired(
    claiming_world: World,
) -> None:
    """The claim is one statement on PostgreSQL: paused before it is sent, it holds no
    lock, so the sweep's cancel sees an expired lease and ends the execution; the claim
    then finds the lease expired and writes and sends nothing."""
    world = claiming_world
    task_id, paused, holder = _claiming_while_the_committed_expiry_passes(
        world, in_one_statement=True
    )
    try:
        executions = world.agboss.executions
        executions.request_cancel(task_id, "revoked")
        ended = executions.end_cancel_requested(task_id, "revoked")
        assert ended is not None and ended.state is ExecutionState.CANCELLED
    finally:
        done = _release(paused, holder)
    assert isinstance(done.get("error"), ExecutionFencedError), done
    assert world.gateway.requests == [], "a cancelled execution's claim sent a charge"


@POSTGRES_ONLY
def test_on_a_committed_read_a_running_delivery_is_cancelled_while_it_charges(
    claiming_world: World,
) -> None:
    world = claiming_world
    with sabotage(LEASE_DECISION_ON_COMMITTED_READ):
        task_id, paused, holder = _claiming_while_the_committed_expiry_passes(world)
        try:
            world.agboss.executions.request_cancel(task_id, "revoked")
            cancelled = world.agboss.executions.end_cancel_requested(task_id, "revoked")
        finally:
            done = _release(paused, holder)
    assert cancelled is not None and cancelled.state is ExecutionState.CANCELLED
    assert done.get("result") == "paid", "a CANCELLED order, marked paid"
