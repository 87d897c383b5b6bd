"""The sweep's and the operators' execution verbs: listing, re-driving, expiring,
unblocking, moving by hand (cancels: ``cancels``; pause answers: ``pauses``; the audit
trail and meta values: ``audit_trail``).

Every claim is a compare-and-set under the execution row's lock that re-checks
that no lease is live, so several sweepers (two beats) and operators at once
decide one after the other and only one of them re-publishes.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

from sqlalchemy import and_, case, exists, func, not_, or_, select

from celery_agboss.core import compensation, sabotage
from celery_agboss.core.execution_states import (
    divergence_accepted,
    expires_now,
    may_move_by_hand,
    over_recovery_cap,
    redrive_count,
    unblocks,
)
from celery_agboss.core.executions import (
    REDRIVABLE_STATES,
    Audit,
    ExecutionRecord,
    ExecutionState,
    RedriveDecision,
)
from celery_agboss.core.fault_points import SWEEP_BEFORE_EXPIRY, fault_point
from celery_agboss.core.protections import (
    PLANNED_WAITS_COUNTED,
    RESOLVE_REDRIVES_CREATOR_ONLY,
    STARTED_EXECUTIONS_EXPIRE,
)
from celery_agboss.core.shared_records import unhandled_payments
from celery_agboss.core.store_protocol import INTENT_RECORD, IntentStatus
from celery_agboss.store.execution_rows import (
    audit_change_txn,
    execution_lease_live,
    has_pending_intent_txn,
    park_txn,
    pending_intent_keys_txn,
    read_execution_txn,
    record_of,
    require_execution_txn,
    set_execution_txn,
    terminal_txn,
    undo_declarations_txn,
)
from celery_agboss.store.execution_updates import TERMINAL_VALUES
from celery_agboss.store.intent_listings import used_by_execution
from celery_agboss.store.leases import lease_live
from celery_agboss.store.schema import outbound_calls, record_uses
from celery_agboss.store.schema_executions import executions
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore
from celery_agboss.store.transactions import SQLTransaction

_e = executions.c
_i = outbound_calls.c
_u = record_uses.c
_REDRIVABLE = [state.value for state in REDRIVABLE_STATES]


def _needing_operator() -> Any:
    """An intent waiting for a person: a PENDING one flagged for one, or a COMPLETED one
    whose result could not be stored."""
    return or_(
        and_(_i.status == IntentStatus.PENDING.value, _i.needs_operator),
        and_(_i.status == IntentStatus.COMPLETED.value, not_(_i.result_stored)),
    )


def _operator_needed_by(execution_id: str) -> Any:
    """An intent of the execution (``used_by_execution``) still needs an operator."""
    return exists().where(_needing_operator(), used_by_execution(execution_id))


# --- reads -------------------------------------------------------------------------


def read_execution(store: SQLAlchemyStore, execution_id: str) -> ExecutionRecord | None:
    with store.read_transaction() as tx:
        return read_execution_txn(tx, execution_id)


def list_executions(
    store: SQLAlchemyStore,
    states: Sequence[ExecutionState] | None = None,
    limit: int = 100,
    after_id: str | None = None,
) -> list[ExecutionRecord]:
    with store.read_transaction() as tx:
        statement = select(executions, tx.now_expr().label("read_at_ms"))
        if states:
            statement = statement.where(_e.state.in_([s.value for s in states]))
        if after_id is not None:
            statement = statement.where(_e.id > after_id)
        rows = tx.execute(statement.order_by(_e.id).limit(limit)).all()
        return [record_of(row, tx.connection) for row in rows]


# --- the sweep ---------------------------------------------------------------------


def find_redrivable(
    store: SQLAlchemyStore, limit: int, requested_grace_ms: int, *, as_of_ms: int | None = None
) -> list[ExecutionRecord]:
    """The executions the sweep re-publishes, oldest change first. A cancel-requested
    one is left out here, in the listing, not skipped after it (the cancel step ends it;
    a re-drive could send something new), unless ``COMPENSATING`` (its undos run to their
    end): a row listed and then skipped would keep its place at the head of every batch
    and hide the rows behind it."""
    with store.read_transaction() as tx:
        now = tx.now_expr(as_of_ms)
        started_from = case(
            (and_(_e.eta_ms.is_not(None), _e.eta_ms > _e.requested_at_ms), _e.eta_ms),
            else_=_e.requested_at_ms,
        )
        due = or_(
            _e.state != ExecutionState.REQUESTED.value,
            started_from + requested_grace_ms <= now,
        )
        rows = tx.execute(
            select(executions, now.label("read_at_ms"))
            .where(
                _e.state.in_(_REDRIVABLE),
                or_(_e.not_before_ms.is_(None), _e.not_before_ms <= now),
                due,
                or_(
                    not_(_e.cancel_requested),
                    _e.state == ExecutionState.COMPENSATING.value,
                ),
                not_(lease_live(now, _e.id)),
            )
            .order_by(_e.updated_at_ms, _e.id)
            .limit(limit)
        ).all()
        return [record_of(row, tx.connection) for row in rows]


def claim_redrive(
    store: SQLAlchemyStore,
    execution_id: str,
    expected_updated_at_ms: int,
    max_recovery_attempts: int,
    *,
    next_redrive_delay_ms: int = 0,
) -> RedriveDecision:
    with store.transaction() as tx:
        record = read_execution_txn(tx, execution_id, lock=True)
        if (
            record is None
            or record.updated_at_ms != expected_updated_at_ms
            or record.state not in REDRIVABLE_STATES
        ):
            return RedriveDecision(False, False, None)
        if execution_lease_live(tx, execution_id):
            return RedriveDecision(False, False, None)
        # Only recoveries count toward the cap (design: recovery cap).
        count = redrive_count(record, sabotage.active(PLANNED_WAITS_COUNTED))
        recovery = count.taken_over or count.counted
        if recovery and over_recovery_cap(record, max_recovery_attempts):
            park_txn(tx, execution_id, record.recovery_count, max_recovery_attempts)
            return RedriveDecision(False, True, require_execution_txn(tx, execution_id))
        set_execution_txn(
            tx,
            execution_id,
            recovery_count=_e.recovery_count + (1 if count.counted else 0),
            wake_requested=False,
            # An undo's planned wait is read again by the delivery it leads to: no
            # take-over either (start_delivery).
            redrive_planned=count.planned and record.state is ExecutionState.COMPENSATING,
            not_before_ms=tx.now_expr() + max(0, next_redrive_delay_ms),
        )
        return RedriveDecision(True, False, require_execution_txn(tx, execution_id))


def expire_due(store: SQLAlchemyStore, limit: int) -> list[ExecutionRecord]:
    """``expires`` bounds when an execution may start (design: expires bounds the start):
    only one that no delivery ever started becomes ``EXPIRED``. One that started,
    charged and then waits (a retry, a long wait, an unknown outcome) continues
    whatever its ``expires``: expiring it would leave the customer charged and the
    rest undone."""
    changed: list[ExecutionRecord] = []
    # The candidates, in SQL; core's ``expires_now`` decides each under its row lock.
    never_started = (
        _e.state.in_([ExecutionState.REQUESTED.value, ExecutionState.WAITING.value])
        if sabotage.active(STARTED_EXECUTIONS_EXPIRE)
        else and_(_e.state == ExecutionState.REQUESTED.value, _e.started_at_ms.is_(None))
    )
    with store.transaction() as tx:
        now = tx.now_expr()
        rows = tx.execute(
            select(_e.id)
            .where(
                never_started,
                _e.expires_ms.is_not(None),
                _e.expires_ms <= now,
                not_(lease_live(now, _e.id)),
            )
            .order_by(_e.expires_ms)
            .limit(limit)
        ).all()
        fault_point(SWEEP_BEFORE_EXPIRY)
        for row in rows:
            expired = _expire_if_due_txn(tx, str(row.id))
            if expired is not None:
                changed.append(expired)
    return changed


def expire_if_due(store: SQLAlchemyStore, execution_id: str) -> ExecutionRecord | None:
    """A worker holds a message past its ``expires`` by its own clock: the execution ends
    ``EXPIRED`` only as the sweep would end it, on the database's clock."""
    with store.transaction() as tx:
        return _expire_if_due_txn(tx, execution_id)


def _expire_if_due_txn(tx: SQLTransaction, execution_id: str) -> ExecutionRecord | None:
    record = read_execution_txn(tx, execution_id, lock=True)
    if record is None or not expires_now(
        record,
        partial(execution_lease_live, tx, execution_id),
        partial(has_pending_intent_txn, tx, execution_id),
    ):
        return None
    return terminal_txn(tx, execution_id, ExecutionState.EXPIRED, reason="expired")


# --- operators ---------------------------------------------------------------------


def executions_waiting_on(store: SQLAlchemyStore, idempotency_key: str) -> list[str]:
    """Every execution an intent may hold up: its creator and each execution that used
    it (replayed, joined, took it over for reconcile). Settling the intent re-drives
    each one that waits for it: no wait nobody can end (design: waiters re-driven)."""
    with store.read_transaction() as tx:
        row = tx.execute(
            select(_i.execution_id).where(_i.idempotency_key == idempotency_key)
        ).first()
        users = (
            []
            if sabotage.active(RESOLVE_REDRIVES_CREATOR_ONLY)
            else tx.users_of(INTENT_RECORD, idempotency_key)
        )
    creator = [] if row is None else [str(row.execution_id)]
    return list(dict.fromkeys(creator + users))


def unblock(
    store: SQLAlchemyStore,
    execution_id: str,
    reason: str,
    *,
    reset_recovery_count: bool = False,
    audit: Audit | None = None,
) -> ExecutionRecord | None:
    """``WAITING_OPERATOR`` → ``WAITING`` (due now, a planned re-drive) once no intent it
    created or used needs an operator any more, under its row and lease locks; None
    when it does not wait for an intent (another state, "cancelled after a completed
    payment", a live lease) or an intent still needs a person."""
    with store.transaction() as tx:
        record = read_execution_txn(tx, execution_id, lock=True)
        if record is None or not unblocks(
            record,
            partial(execution_lease_live, tx, execution_id),
            lambda: bool(tx.execute(select(_operator_needed_by(execution_id))).scalar()),
        ):
            return None
        values: dict[str, Any] = {
            "state": ExecutionState.WAITING.value,
            "reason": reason[:1000],
            "not_before_ms": tx.now_expr(),
            "redrive_planned": True,
        }
        if reset_recovery_count:
            values["recovery_count"] = 0
        set_execution_txn(tx, execution_id, **values)
        after = require_execution_txn(tx, execution_id)
        audit_change_txn(tx, audit, execution_id, record, after)
        return after


def intents_needing_operator(store: SQLAlchemyStore, execution_id: str) -> list[str]:
    """Keys of the intents of the execution (``used_by_execution``) that wait for a
    person."""
    with store.read_transaction() as tx:
        rows = tx.execute(
            select(_i.idempotency_key)
            .where(_needing_operator(), used_by_execution(execution_id))
            .order_by(_i.first_attempt_at_ms, _i.idempotency_key)
        ).all()
        return [str(row.idempotency_key) for row in rows]


def accept_divergence(
    store: SQLAlchemyStore, execution_id: str, reason: str, *, audit: Audit | None = None
) -> ExecutionRecord | None:
    """An operator accepts a divergence: the execution ``COMPLETED`` with the result its
    body returned (kept when it diverged), under its row and lease locks; None unless
    it waits for a divergence, runs under no live lease and has no pending intent."""
    with store.transaction() as tx:
        record = read_execution_txn(tx, execution_id, lock=True)
        if record is None or not divergence_accepted(
            record,
            partial(execution_lease_live, tx, execution_id),
            partial(has_pending_intent_txn, tx, execution_id),
        ):
            return None
        after = terminal_txn(tx, execution_id, ExecutionState.COMPLETED, reason=reason[:1000])
        audit_change_txn(tx, audit, execution_id, record, after)
        return after


def pending_intent_keys(store: SQLAlchemyStore, execution_id: str) -> list[str]:
    """The keys of the execution's pending intents (``pending_intent_of``)."""
    with store.read_transaction() as tx:
        return pending_intent_keys_txn(tx, execution_id)


def move(
    store: SQLAlchemyStore,
    execution_id: str,
    from_states: Sequence[ExecutionState],
    to_state: ExecutionState,
    reason: str,
    *,
    not_before_delay_ms: int | None = None,
    reset_recovery_count: bool = False,
    planned: bool = False,
    audit: Audit | None = None,
) -> ExecutionRecord | None:
    with store.transaction() as tx:
        record = read_execution_txn(tx, execution_id, lock=True)
        if record is None or record.state not in from_states:
            return None
        if execution_lease_live(tx, execution_id):
            return None
        if not may_move_by_hand(to_state, has_pending_intent_txn(tx, execution_id)):
            return None
        values: dict[str, Any] = {"state": to_state.value, "reason": reason}
        if planned:
            values["redrive_planned"] = True
        if not_before_delay_ms is not None:
            values["not_before_ms"] = tx.now_expr() + max(0, not_before_delay_ms)
        if reset_recovery_count:
            values["recovery_count"] = 0
        if to_state.value in TERMINAL_VALUES:
            values["terminal_at_ms"] = tx.now_expr()
            values["wake_requested"] = False
        set_execution_txn(tx, execution_id, **values)
        after = require_execution_txn(tx, execution_id)
        audit_change_txn(tx, audit, execution_id, record, after)
        return after


# --- payments left behind ---------------------------------------------------------


_CANDIDATE_BATCH = 200
"""How many candidates of "failed after a payment" one read transaction judges."""


def failed_after_payment(
    store: SQLAlchemyStore, limit: int = 100, *, ended_before_ms: int | None = None
) -> list[tuple[ExecutionRecord, list[str]]]:
    """Up to ``limit`` ``FAILED`` or ``CANCELLED`` executions that left a completed
    payment behind (``shared_records.unhandled_payments``: nobody undid it, no other
    execution completed on it or still uses it) and no operator said is dealt with, with
    the keys of those payments; oldest first.

    SQL only finds the candidates (a completed, uncompensated intent of theirs); core's
    rule decides each, and it reads what SQL cannot (its undos' refunds, in their sealed
    marks). Many candidates are not one — a failure whose undo refunded, or whose charge
    a second click completed on — and stay candidates until retention, so the
    candidates are paged through, a batch per read transaction (keyset on the sort
    order), until ``limit`` are found or none is left: older lookalikes never hide one.
    ``ended_before_ms``: only those that ended before it (what retention must keep).
    """
    found: list[tuple[ExecutionRecord, list[str]]] = []
    after: tuple[int, str] | None = None
    while len(found) < limit:
        with store.read_transaction() as tx:
            candidates = _candidates(tx, after, ended_before_ms)
            rows = tx.execute(candidates.limit(_CANDIDATE_BATCH)).all()
            for row in rows:
                record = record_of(row, tx.connection)
                keys = _payments_left_behind(tx, record)
                if keys:
                    found.append((record, keys))
                    if len(found) == limit:
                        break
        if len(rows) < _CANDIDATE_BATCH:
            break
        after = (int(rows[-1].ended_at), str(rows[-1].id))
    return found


def _candidates(
    tx: SQLTransaction, after: tuple[int, str] | None, ended_before_ms: int | None = None
) -> Any:
    """``FAILED`` or ``CANCELLED``, not handled, with a completed uncompensated intent it
    created or used; ordered by when it ended, then id (``ended_at``: 0 for a row
    without an end time, on both databases), after the keyset ``after``."""
    # Two correlated look-ups, each on its index (an intent's execution_id, a use's
    # execution_id then the intent's key): one ``OR`` over both read every intent.
    completed = (_i.status == IntentStatus.COMPLETED.value, _i.compensated_at_ms.is_(None))
    made = exists().where(*completed, _i.execution_id == _e.id)
    used = exists().where(
        _u.kind == INTENT_RECORD,
        _u.execution_id == _e.id,
        _i.idempotency_key == _u.record_key,
        *completed,
    )
    payment = or_(made, used)
    ended = func.coalesce(_e.terminal_at_ms, 0)
    statement = select(
        executions, tx.now_expr().label("read_at_ms"), ended.label("ended_at")
    ).where(
        _e.state.in_([ExecutionState.FAILED.value, ExecutionState.CANCELLED.value]),
        _e.payments_handled_at_ms.is_(None),
        payment,
    )
    if after is not None:
        statement = statement.where(
            or_(ended > after[0], and_(ended == after[0], _e.id > after[1]))
        )
    if ended_before_ms is not None:  # on its index: the few this old, not every failure
        statement = statement.where(_e.terminal_at_ms < ended_before_ms)
    return statement.order_by(ended, _e.id)


def _payments_left_behind(tx: SQLTransaction, record: ExecutionRecord) -> list[str]:
    """The keys of the payments the candidate left behind (core's rule); empty when none."""
    undone = compensation.intents_made_by_undos(tx, undo_declarations_txn(tx, record.id))
    left = unhandled_payments(tx.shared_records_of(record.id), record.id, undone=undone)
    return [payment.key for payment in left]


def mark_payments_handled(
    store: SQLAlchemyStore, execution_id: str, *, audit: Audit | None = None
) -> ExecutionRecord | None:
    """An operator dealt with the payments a ``FAILED`` or ``CANCELLED`` execution left
    behind (refunded at the gateway, or kept); None unless it is one of those."""
    with store.transaction() as tx:
        record = read_execution_txn(tx, execution_id, lock=True)
        if record is None or record.state not in (
            ExecutionState.FAILED,
            ExecutionState.CANCELLED,
        ):
            return None
        set_execution_txn(tx, execution_id, payments_handled_at_ms=tx.now_expr())
        after = require_execution_txn(tx, execution_id)
        audit_change_txn(tx, audit, execution_id, record, after)
        return after


__all__ = [
    "accept_divergence",
    "claim_redrive",
    "executions_waiting_on",
    "expire_due",
    "failed_after_payment",
    "find_redrivable",
    "intents_needing_operator",
    "list_executions",
    "mark_payments_handled",
    "move",
    "pending_intent_keys",
    "read_execution",
    "unblock",
]
