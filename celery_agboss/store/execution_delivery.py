"""The delivery's life on the execution row: publish, start, verdicts, release.

The bodies behind ``SQLAlchemyExecutionStore``'s delivery verbs. Each verb is one
transaction of ``SQLAlchemyStore`` (or one statement, where the store has one). The
verdicts a delivery writes while it holds the lease (``finish_in``, ``fail_in``,
``wait_in``…) run in the fenced transaction the caller opened (the
``ExecutionContext``'s, which also checks the holder's own clocks), so a superseded
delivery's verdict is refused in the transaction that would write it. The execution
row is locked first (``FOR UPDATE`` on PostgreSQL; SQLite's ``BEGIN IMMEDIATE``
already serialises writers), so two deliveries, or a delivery and a sweeper, decide
one after the other. The sweep's and operators' verbs are in ``execution_admin``,
cancels in ``cancels``, pauses in ``pauses``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from sqlalchemy.engine import Connection

from celery_agboss.core import sabotage
from celery_agboss.core.execution_states import (
    DEFAULT_CANCEL_REASON,
    Verdict,
    cancel_ends_at_start,
    fail_verdict,
    finish_verdict,
    may_start_compensating,
    over_recovery_cap,
    release_wakes,
    start_without_body,
    taken_over,
    wakes_on_release,
)
from celery_agboss.core.executions import (
    DeliveryStart,
    ExecutionMessage,
    ExecutionRecord,
    ExecutionState,
    OneStatementVerdict,
    ReleaseOutcome,
    StartKind,
    execution_scope,
)
from celery_agboss.core.protections import (
    RELEASE_LOCKS_EXECUTION_FIRST,
)
from celery_agboss.core.shared_records import diverged
from celery_agboss.core.store_protocol import FencedTransaction, LeaseRef
from celery_agboss.store import verdict_release
from celery_agboss.store.cancels import end_cancelled_txn
from celery_agboss.store.execution_rows import (
    has_pending_intent_txn,
    insert_requested_txn,
    message_values,
    newer_or_same,
    park_txn,
    read_execution_txn,
    refuse_another_task,
    require_execution_txn,
    require_with_pending_txn,
    set_and_read_txn,
    set_execution_txn,
    set_unless_terminal_txn,
    sql,
    write_verdict_txn,
)
from celery_agboss.store.execution_start import (
    record_requested_in_one,
    start_plain_in_one,
    start_values,
)
from celery_agboss.store.intent_transitions import in_one
from celery_agboss.store.request_identity import refuse_another_request
from celery_agboss.store.schema import outbound_calls
from celery_agboss.store.schema_executions import executions, pauses
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore
from celery_agboss.store.transactions import SQLTransaction

_e = executions.c

Decided = tuple[ExecutionRecord, bool, Verdict | None]
"""A verdict's reads and what they decide: the row, whether an intent of it is pending,
and the verdict (None: the execution has ended already, and is left alone)."""
_p = pauses.c
_i = outbound_calls.c


# --- publish and start ---------------------------------------------------------


def record_requested(store: SQLAlchemyStore, message: ExecutionMessage) -> bool:
    # A new execution's record as one statement where the store has one; a row that
    # is there already is decided in the transaction.
    if record_requested_in_one(store.engine, message, store.offset_ms()):
        return True
    with store.transaction() as tx:
        if insert_requested_txn(tx, message):
            return True
        record = read_execution_txn(tx, message.execution_id, lock=True)
        if record is not None:
            refuse_another_task(record, message.task_name)
            refuse_another_request(record, message)
            if newer_or_same(message, record):
                set_unless_terminal_txn(tx, message.execution_id, **message_values(message))
        return False


def start_delivery(
    store: SQLAlchemyStore,
    wait_ms: int,
    message: ExecutionMessage,
    holder: str,
    ttl_ms: int,
    max_recovery_attempts: int,
) -> DeliveryStart:
    # The first delivery of a recorded execution, as one statement where the store
    # has one; anything else is decided in the transaction.
    plain = start_plain_in_one(store.engine, message, holder, ttl_ms, store.offset_ms())
    if plain is not None:
        return plain
    return start_in_transaction(store, wait_ms, message, holder, ttl_ms, max_recovery_attempts)


def start_in_transaction(
    store: SQLAlchemyStore,
    wait_ms: int,
    message: ExecutionMessage,
    holder: str,
    ttl_ms: int,
    max_recovery_attempts: int,
) -> DeliveryStart:
    """``start_delivery`` decided on the row read under its lock: every case."""
    execution_id = message.execution_id
    scope = execution_scope(execution_id)
    with store.transaction() as tx:
        # Read first: the publisher recorded it (one statement, not an insert and a read).
        record = read_execution_txn(tx, execution_id, lock=True)
        recorded_now = record is None and insert_requested_txn(tx, message)
        if record is None:
            record = read_execution_txn(tx, execution_id, lock=True)
        assert record is not None  # inserted above or already there
        refuse_another_task(record, message.task_name)
        idle = start_without_body(record)
        if idle is not None:
            return DeliveryStart(idle, record)
        lease = tx.lock_lease(scope)
        live = lease is not None and lease.live
        if cancel_ends_at_start(record, live, lambda: has_pending_intent_txn(tx, execution_id)):
            ended = end_cancelled_txn(
                tx, execution_id, record.cancel_reason or DEFAULT_CANCEL_REASON, wait_ms
            )
            if ended.state is not ExecutionState.COMPENSATING:
                kind = StartKind.TERMINAL if ended.terminal else StartKind.WAITING_ANSWER
                return DeliveryStart(kind, ended)
            # Its undos run first: in this delivery, which starts it below.
        if live:
            # The live holder continues; it re-publishes this message when it releases.
            kept = message_values(message) if newer_or_same(message, record) else {}
            deferred = set_and_read_txn(tx, execution_id, wake_requested=True, **kept)
            return DeliveryStart(StartKind.DEFERRED, deferred)
        took_over = taken_over(record)
        if took_over and over_recovery_cap(record, max_recovery_attempts):
            park_txn(tx, execution_id, record.recovery_count, max_recovery_attempts)
            return DeliveryStart(StartKind.PARKED, require_execution_txn(tx, execution_id))
        grant = tx.acquire_lease(scope, holder, ttl_ms)
        if grant is None:  # pragma: no cover - the row lock makes this unreachable
            set_execution_txn(tx, execution_id, wake_requested=True)
            return DeliveryStart(StartKind.DEFERRED, require_execution_txn(tx, execution_id))
        newer = message if newer_or_same(message, record) else None
        started = set_and_read_txn(tx, execution_id, **start_values(record.state, took_over, newer))
        return DeliveryStart(
            StartKind.STARTED,
            started,
            grant,
            took_over,
            recorded_at_start=recorded_now,
        )


# --- verdicts, inside a fenced transaction ------------------------------------------


def finish_in(
    tx: FencedTransaction, result: str, reached: Collection[str] | None = None
) -> ExecutionRecord:
    """Store the result, ``COMPLETED`` — unless an intent of the execution is pending, or
    ``reached`` (the keys of the calls this delivery's body made) misses an intent an
    earlier delivery created that completed or may have (a divergence: the body no
    longer takes the path that charged). Then ``WAITING_OPERATOR``, named as such, with
    the body's result kept for an operator who accepts it. An already terminal
    execution is left alone."""
    t = sql(tx)
    record, _, verdict = _finish_verdict(t, tx.lease.scope, reached)
    if verdict is None:
        return record
    return write_verdict_txn(t, tx.lease.scope, verdict, result=result)


def fail_in(tx: FencedTransaction, error: str, reason: str) -> ExecutionRecord:
    """``FAILED`` with the stored failure — unless the execution owns a PENDING intent:
    then ``WAITING_OPERATOR`` (never FAILED while a payment may be in flight)."""
    t = sql(tx)
    record, _, verdict = _fail_verdict(t, tx.lease.scope, reason)
    if verdict is None:
        return record
    return write_verdict_txn(t, tx.lease.scope, verdict, error=error)


def _finish_verdict(
    t: SQLTransaction, execution_id: str, reached: Collection[str] | None
) -> Decided:
    record, pending = require_with_pending_txn(t, execution_id)
    if record.terminal:
        return record, pending, None
    unreached = (
        []
        if reached is None
        else diverged(t.shared_records_of(execution_id, excluding=reached), reached, execution_id)
    )
    return record, pending, finish_verdict(unreached, not unreached and pending)


def _fail_verdict(t: SQLTransaction, execution_id: str, reason: str) -> Decided:
    record, pending = require_with_pending_txn(t, execution_id)
    if record.terminal:
        return record, pending, None
    return record, pending, fail_verdict(reason, pending)


def finish_and_release(
    store: SQLAlchemyStore,
    lease: LeaseRef,
    ttl_ms: int,
    result: str,
    reached: Collection[str] | None,
) -> ExecutionRecord | None:
    return _conclude_in_one(
        store,
        lease,
        ttl_ms,
        (finish_verdict([], False), verdict_release.Plain(reached)),
        lambda t: _finish_verdict(t, lease.scope, reached),
        {"result": result},
    )


def fail_and_release(
    store: SQLAlchemyStore, lease: LeaseRef, ttl_ms: int, error: str, reason: str
) -> ExecutionRecord | None:
    return _conclude_in_one(
        store,
        lease,
        ttl_ms,
        (fail_verdict(reason, False), verdict_release.Plain(None)),
        lambda t: _fail_verdict(t, lease.scope, reason),
        {"error": error},
    )


def _conclude_in_one(
    store: SQLAlchemyStore,
    lease: LeaseRef,
    ttl_ms: int,
    plain: tuple[Verdict, verdict_release.Plain],
    decide: Callable[[SQLTransaction], Decided],
    values: dict[str, Any],
) -> ExecutionRecord | None:
    """The verdict and the release in one statement (``verdict_release``). First sent
    as the plain end (``plain``: the verdict the rules give a running execution with
    nothing pending or diverged, written only while that holds); if the row is not
    plain, decided on reads sent in autocommit and written only while the pending
    intent read is still what it was. None: nothing written, use the transaction."""
    store = store
    offset = store.offset_ms()

    def write(
        conn: Connection, verdict: Verdict, pending: bool, p: verdict_release.Plain | None
    ) -> OneStatementVerdict:
        return verdict_release.conclude_txn(
            conn, lease, ttl_ms, verdict, values, pending=pending, plain=p, offset_ms=offset
        )

    def body(conn: Connection) -> OneStatementVerdict:
        if not release_wakes(plain[0].state):
            done = write(conn, plain[0], False, plain[1])
            if done.fenced or done.record is not None:
                return done
        _, pending, verdict = decide(SQLTransaction(conn, None, offset, store.caller_clock_skew_ms))
        if verdict is None or release_wakes(verdict.state):
            return OneStatementVerdict(False, None)  # the transaction handles these
        return write(conn, verdict, pending, None)

    if not verdict_release.possible(store.engine):
        return None
    done = in_one(store.engine, lease, body)
    return None if done is None else done.record


def wait_in(
    tx: FencedTransaction,
    delay_ms: int,
    reason: str,
    message: ExecutionMessage | None = None,
) -> ExecutionRecord:
    """``WAITING`` with ``not_before = now + delay_ms``; ``message`` replaces the stored
    one (what the sweep re-publishes after the wait). A wait with ``message`` has no
    broker message behind it: the sweep's re-publish is its planned continuation and
    does not count toward the recovery cap; without one, a retry message is on its
    way, and a re-publish means it was lost (that counts)."""
    replaced = {} if message is None else message_values(message)
    return _due_in(
        tx, ExecutionState.WAITING, delay_ms, reason, planned=message is not None, **replaced
    )


def undo_wait_in(tx: FencedTransaction, delay_ms: int, reason: str) -> ExecutionRecord:
    """Still ``COMPENSATING`` (another execution deciding about the shared step sees it
    undoing, so it never waits for this one), due at ``now + delay_ms``; the sweep's
    re-drive then is planned: neither a take-over nor a recovery counted."""
    return _due_in(tx, ExecutionState.COMPENSATING, delay_ms, reason, planned=True)


def _due_in(
    tx: FencedTransaction,
    state: ExecutionState,
    delay_ms: int,
    reason: str,
    *,
    planned: bool,
    **replaced: Any,
) -> ExecutionRecord:
    """``state`` until ``now + delay_ms``, when the sweep re-drives it (``planned``: as its
    continuation, not a recovery), unless terminal; ``replaced``: the message's values."""
    t = sql(tx)
    return set_and_read_txn(
        t,
        tx.lease.scope,
        unless_terminal=True,
        state=state.value,
        not_before_ms=t.now_expr() + max(0, delay_ms),
        reason=reason[:1000],
        redrive_planned=planned,
        **replaced,
    )


def waiting_operator_in(tx: FencedTransaction, reason: str) -> ExecutionRecord:
    """``WAITING_OPERATOR``: an operator decides; nothing runs until then."""
    t, execution_id = sql(tx), tx.lease.scope
    return set_and_read_txn(
        t,
        execution_id,
        unless_terminal=True,
        state=ExecutionState.WAITING_OPERATOR.value,
        not_before_ms=None,
        reason=reason[:1000],
    )


def compensating_in(
    tx: FencedTransaction,
    reason: str,
    error: str | None = None,
    *,
    continuing: bool = False,
) -> ExecutionRecord:
    """``COMPENSATING`` (undos run in this delivery), with the failure it will end with
    — unless terminal or, starting, an intent of it is PENDING (no undo starts while a
    payment may be in flight): unchanged then."""
    t, execution_id = sql(tx), tx.lease.scope
    record = require_execution_txn(t, execution_id)
    pending = not continuing and has_pending_intent_txn(t, execution_id)
    if not may_start_compensating(record, pending, continuing):
        return record
    kept: dict[str, Any] = {} if error is None else {"error": error}
    return set_and_read_txn(
        t,
        execution_id,
        state=ExecutionState.COMPENSATING.value,
        not_before_ms=None,
        reason=reason[:1000],
        **kept,
    )


# --- the end of a delivery ---------------------------------------------------------------


def release_delivery(
    store: SQLAlchemyStore, lease: LeaseRef, *, will_republish: bool = False
) -> ReleaseOutcome:
    """Release ``lease`` and read, under the execution's row lock, whether a duplicate
    asked to be woken. The lease row is taken first, then the execution's (one lock
    order): another thread of the delivery may be claiming, which holds the lease row and
    waits for the execution's. Any writer of ``wake_requested`` holds the execution's row
    and judges the lease ``SKIP LOCKED``, so it either committed before the row is read
    here or comes after the release and finds the lease released."""
    with store.transaction() as tx:
        if sabotage.active(RELEASE_LOCKS_EXECUTION_FIRST):
            record = read_execution_txn(tx, lease.scope, lock=True)
            released = tx.release_lease(lease)
        else:
            released = tx.release_lease(lease)
            record = read_execution_txn(tx, lease.scope, lock=True)
        if record is None:
            return ReleaseOutcome(released, False, None)
        woken = released and wakes_on_release(record)
        if record.wake_requested and released:
            set_execution_txn(tx, lease.scope, wake_requested=False)
        return ReleaseOutcome(
            released, woken and not will_republish, require_execution_txn(tx, lease.scope)
        )


def release_in(
    tx: FencedTransaction, record: ExecutionRecord, *, will_republish: bool = False
) -> ReleaseOutcome:
    if not record.wake_requested:
        return ReleaseOutcome(True, False, record)
    t = sql(tx)
    woken = wakes_on_release(record)
    after = set_and_read_txn(t, record.id, wake_requested=False)
    return ReleaseOutcome(True, woken and not will_republish, after)


def mark_links_dispatched(store: SQLAlchemyStore, execution_id: str) -> None:
    """The terminal delivery's chain and callbacks went out (Celery's ``on_success``)."""
    with store.transaction() as tx:
        set_execution_txn(tx, execution_id, links_dispatched=True)


__all__ = [
    "compensating_in",
    "fail_and_release",
    "fail_in",
    "finish_and_release",
    "finish_in",
    "mark_links_dispatched",
    "record_requested",
    "release_delivery",
    "release_in",
    "start_delivery",
    "start_in_transaction",
    "undo_wait_in",
    "wait_in",
    "waiting_operator_in",
]
