"""The few statements the sweep and the operator commands need beyond the execution verbs.

Each function is one short transaction on a ``SQLAlchemyStore`` (or a body that runs
inside the caller's, named ``*_txn``). Every write is guarded by its full predicate
and judged by its row count, so two sweepers (or a sweeper and an operator) racing on
one row decide one after the other and the loser changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, delete, exists, func, not_, or_, select, update
from sqlalchemy.sql.elements import ColumnElement

from celery_agboss.core.executions import (
    TERMINAL_STATES,
    ExecutionState,
    execution_scope,
)
from celery_agboss.core.store import IntentRecord, IntentStatus, LeaseRef
from celery_agboss.store.dialect import insert_or_nothing
from celery_agboss.store.intents import owner_live_expr
from celery_agboss.store.schema import fenced_effects, leases, outbound_calls
from celery_agboss.store.schema_executions import audit, executions, meta
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore
from celery_agboss.store.transactions import SQLTransaction

_e = executions.c
_i = outbound_calls.c
_l = leases.c
_f = fenced_effects.c
_m = meta.c

TICK_KEY_PREFIX = "sweep.tick."
LAST_SWEEP_KEY = "sweep.last"
SWEEPER_SCOPE_PREFIX = "agboss.sweeper:"

_TERMINAL = [state.value for state in TERMINAL_STATES]
CANCELLABLE_STATES = (
    ExecutionState.REQUESTED,
    ExecutionState.RUNNING,
    ExecutionState.WAITING,
    ExecutionState.PAUSED,
    ExecutionState.WAITING_OPERATOR,
    ExecutionState.PARKED,
)
"""States a cancel request ends in ``CANCELLED`` once no lease is live and no intent is
pending. ``COMPENSATING`` is not one: an undo that started runs to its end."""


def _execution_lease_live(now: ColumnElement[int], execution_id: Any) -> ColumnElement[bool]:
    return exists().where(
        _l.scope == execution_id, not_(_l.released), _l.expires_at_ms > now
    )


def _pending_of(execution_id: Any) -> ColumnElement[bool]:
    return exists().where(
        _i.execution_id == execution_id, _i.status == IntentStatus.PENDING.value
    )


# --- ticks: one sweep per tick, however many beats ----------------------------------


def claim_tick(store: SQLAlchemyStore, interval_ms: int, claimant: str) -> int | None:
    """Insert this tick's row (``INSERT … ON CONFLICT DO NOTHING``); its number when this
    call inserted it, None when another sweeper already runs this tick.

    The tick is the database clock divided by the interval, so every beat agrees on it.
    Rows older than ten intervals are deleted in the same transaction.
    """
    if interval_ms <= 0:
        raise ValueError("a tick needs a positive interval")
    with store.transaction() as tx:
        tick = tx.read_now_ms() // interval_ms
        inserted = tx.execute(
            insert_or_nothing(tx.connection, meta)
            .values(key=f"{TICK_KEY_PREFIX}{tick}", value=claimant, updated_at_ms=tx.now_expr())
            .returning(_m.key)
        ).first()
        tx.execute(
            delete(meta).where(
                _m.key.like(f"{TICK_KEY_PREFIX}%"),
                _m.updated_at_ms < tx.now_expr() - 10 * interval_ms,
            )
        )
        return tick if inserted is not None else None


# --- stranded intents ----------------------------------------------------------------


def find_stranded_keys(store: SQLAlchemyStore, limit: int) -> list[tuple[str, str]]:
    """``(idempotency key, execution id)`` of PENDING intents the sweep should look up:
    no live owner, next lookup due, and no live lease on their execution (a live holder
    reconciles its own intents). Oldest first."""
    with store.read_transaction() as tx:
        now = tx.now_expr()
        rows = tx.execute(
            select(_i.idempotency_key, _i.execution_id)
            .where(
                _i.status == IntentStatus.PENDING.value,
                not_(owner_live_expr(now)),
                or_(_i.next_lookup_at_ms.is_(None), _i.next_lookup_at_ms <= now),
                not_(_execution_lease_live(now, _i.execution_id)),
            )
            .order_by(_i.first_attempt_at_ms, _i.idempotency_key)
            .limit(limit)
        ).all()
        return [(str(row.idempotency_key), str(row.execution_id)) for row in rows]


def list_pending_intents(
    store: SQLAlchemyStore, *, limit: int, operator_only: bool = False
) -> list[IntentRecord]:
    """PENDING intents (and completed ones whose result could not be stored), the ones
    flagged for an operator first, then oldest first."""
    with store.read_transaction() as tx:
        waiting = or_(
            _i.status == IntentStatus.PENDING.value,
            and_(_i.status == IntentStatus.COMPLETED.value, not_(_i.result_stored)),
        )
        statement = select(_i.idempotency_key).where(waiting)
        if operator_only:
            statement = statement.where(_i.needs_operator)
        rows = tx.execute(
            statement.order_by(
                _i.needs_operator.desc(), _i.first_attempt_at_ms, _i.idempotency_key
            ).limit(limit)
        ).all()
        records = [tx.read_intent(str(row.idempotency_key)) for row in rows]
        return [record for record in records if record is not None]


def list_intents_of(store: SQLAlchemyStore, execution_id: str) -> list[IntentRecord]:
    with store.read_transaction() as tx:
        return tx.list_intents(execution_id)


# --- cancels ---------------------------------------------------------------------------


def find_cancel_requested(store: SQLAlchemyStore, limit: int) -> list[str]:
    """Ids of non-terminal executions with a cancel request and no live lease."""
    with store.read_transaction() as tx:
        now = tx.now_expr()
        rows = tx.execute(
            select(_e.id)
            .where(
                _e.cancel_requested,
                _e.state.in_([state.value for state in CANCELLABLE_STATES]),
                not_(_execution_lease_live(now, _e.id)),
            )
            .order_by(_e.updated_at_ms, _e.id)
            .limit(limit)
        ).all()
        return [str(row.id) for row in rows]


def cancel_if_settled(store: SQLAlchemyStore, execution_id: str, reason: str) -> bool:
    """``CANCELLED`` in one transaction, only while the execution is in a cancellable state,
    holds no live lease and owns no PENDING intent; True when this call changed it."""
    with store.transaction() as tx:
        now = tx.now_expr()
        changed = tx.execute(
            update(executions)
            .where(
                _e.id == execution_id,
                _e.state.in_([state.value for state in CANCELLABLE_STATES]),
                not_(_execution_lease_live(now, _e.id)),
                not_(_pending_of(_e.id)),
            )
            .values(
                state=ExecutionState.CANCELLED.value,
                cancel_requested=True,
                cancel_reason=func.coalesce(_e.cancel_reason, reason),
                reason=reason,
                terminal_at_ms=now,
                not_before_ms=None,
                wake_requested=False,
                updated_at_ms=now,
            )
        ).rowcount
        return bool(changed)


# --- retention ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RetentionResult:
    executions: int
    rows: int


def delete_settled_intents_before(
    store: SQLAlchemyStore, cutoff_ms: int, limit: int
) -> RetentionResult:
    """Settled intents (and their history) of executions terminal since before
    ``cutoff_ms``; never a PENDING intent, never a row of a non-terminal execution."""
    with store.transaction() as tx:
        ids = _terminal_with(
            tx, cutoff_ms, limit,
            exists().where(
                _i.execution_id == _e.id, _i.status != IntentStatus.PENDING.value
            ),
        )
        return RetentionResult(len(ids), tx.delete_settled_intents(ids) if ids else 0)


def delete_effects_before(store: SQLAlchemyStore, cutoff_ms: int, limit: int) -> RetentionResult:
    """Fenced-effect records of executions terminal since before ``cutoff_ms``."""
    with store.transaction() as tx:
        ids = _terminal_with(tx, cutoff_ms, limit, exists().where(_f.execution_id == _e.id))
        return RetentionResult(len(ids), tx.delete_effects(ids) if ids else 0)


def _terminal_with(
    tx: SQLTransaction, cutoff_ms: int, limit: int, has_rows: ColumnElement[bool]
) -> list[str]:
    rows = tx.execute(
        select(_e.id)
        .where(
            _e.state.in_(_TERMINAL),
            _e.terminal_at_ms.is_not(None),
            _e.terminal_at_ms < cutoff_ms,
            has_rows,
        )
        .order_by(_e.terminal_at_ms, _e.id)
        .limit(limit)
    ).all()
    return [str(row.id) for row in rows]


# --- the sweeper's own lease -----------------------------------------------------------


def delete_released_lease(store: SQLAlchemyStore, lease: LeaseRef) -> bool:
    """Forget a sweeper's lease row once released (its scope is never used again)."""
    with store.transaction() as tx:
        return bool(
            tx.execute(
                delete(leases).where(
                    _l.scope == lease.scope,
                    _l.holder == lease.holder,
                    _l.token == lease.token,
                    _l.released,
                )
            ).rowcount
        )


def delete_dead_sweeper_leases(store: SQLAlchemyStore, older_than_ms: int, limit: int) -> int:
    """Lease rows of sweepers that died mid-run, expired for longer than ``older_than_ms``
    and owning no intent (an intent names its owner by these rows)."""
    with store.transaction() as tx:
        now = tx.now_expr()
        owned = exists().where(
            _i.owner_scope == _l.scope, _i.owner_holder == _l.holder, _i.owner_token == _l.token
        )
        scopes = select(_l.scope).where(
            _l.scope.like(f"{SWEEPER_SCOPE_PREFIX}%"),
            _l.expires_at_ms < now - older_than_ms,
            not_(owned),
        ).limit(limit)
        dead = [str(row.scope) for row in tx.execute(scopes).all()]
        if not dead:
            return 0
        return int(tx.execute(delete(leases).where(_l.scope.in_(dead))).rowcount)


# --- audit ------------------------------------------------------------------------------


def insert_audit_txn(
    tx: SQLTransaction,
    *,
    actor: str,
    action: str,
    target: str,
    reason: str,
    before: str | None,
    after: str | None,
) -> None:
    """One audit row inside the caller's transaction: it commits with the change it records."""
    tx.execute(
        audit.insert().values(
            at_ms=tx.now_expr(),
            actor=actor,
            action=action,
            target=target,
            reason=reason,
            before=before,
            after=after,
        )
    )


def execution_lease_live(tx: SQLTransaction, execution_id: str) -> bool:
    lease = tx.read_lease(execution_scope(execution_id))
    return lease is not None and lease.live


def executions_by_ids(store: SQLAlchemyStore, ids: Sequence[str]) -> dict[str, str]:
    """``{id: state}`` for the given ids (the ones that exist)."""
    if not ids:
        return {}
    with store.read_transaction() as tx:
        rows = tx.execute(select(_e.id, _e.state).where(_e.id.in_(list(ids)))).all()
        return {str(row.id): str(row.state) for row in rows}


__all__ = [
    "CANCELLABLE_STATES",
    "LAST_SWEEP_KEY",
    "SWEEPER_SCOPE_PREFIX",
    "TICK_KEY_PREFIX",
    "RetentionResult",
    "cancel_if_settled",
    "claim_tick",
    "delete_dead_sweeper_leases",
    "delete_effects_before",
    "delete_released_lease",
    "delete_settled_intents_before",
    "execution_lease_live",
    "executions_by_ids",
    "find_cancel_requested",
    "find_stranded_keys",
    "insert_audit_txn",
    "list_intents_of",
    "list_pending_intents",
]
