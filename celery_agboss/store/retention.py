"""Retention: the rows that go once nothing needs them (design: retention).

Settled intents and fenced-effect records whose every user ended before the cutoff,
then the terminal executions they belonged to, and the lease rows of sweepers that
died or let go. Each delete is one transaction whose predicate re-states why the row
may go, so a record an execution still uses is never deleted, whoever created it.

A shared record is listed ``FOR UPDATE SKIP LOCKED`` on PostgreSQL, and its ``DELETE``
judges once more, on the row it deletes, the one condition the listing used
(``_may_go``). A replay holds the record ``FOR KEY SHARE`` from its read until it has
noted its use and relied on it (``intents.read_txn``, ``record_uses``): retention skips
a record a replay holds, and a replay that reaches a record retention holds waits, then
finds it gone and claims anew. A use committed between the listing's snapshot and its
lock is seen by the ``DELETE``. Never both a replay relying on a record and the record
deleted. On SQLite, writers (retention and every fenced transaction) run one at a time.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, delete, exists, false, literal_column, not_, or_, select
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.schema import Column

from celery_agboss.core import sabotage
from celery_agboss.core.executions import (
    TERMINAL_STATES,
    ExecutionState,
)
from celery_agboss.core.protections import (
    PAUSED_RECORDS_EXPIRE,
    RECORD_USES_IGNORED_BY_RETENTION,
    RETENTION_DELETES_A_REPUBLISHED_EXECUTION,
    RETENTION_DELETES_A_SCHEDULED_EXECUTION,
    RETENTION_DELETES_UNHANDLED_PAYMENTS,
    RETENTION_DELETES_WHAT_IT_LISTED,
    RETENTION_FORGETS_PUBLISHED_CHILDREN,
)
from celery_agboss.core.store_protocol import (
    EFFECT_RECORD,
    INTENT_RECORD,
    LeaseRef,
)
from celery_agboss.store import effects, execution_admin, intents
from celery_agboss.store.dialect import is_postgresql, json_text
from celery_agboss.store.driver_errors import translated
from celery_agboss.store.schema import (
    SETTLED_ONLY_EXCLUDES,
    SWEEPER_SCOPE_PATTERN,
    fenced_effects,
    leases,
    outbound_calls,
    record_uses,
)
from celery_agboss.store.schema_executions import executions, pauses
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore
from celery_agboss.store.transactions import SQLTransaction

_e = executions.c
_i = outbound_calls.c
_l = leases.c
_f = fenced_effects.c
_u = record_uses.c

_TERMINAL = [state.value for state in TERMINAL_STATES]

RETENTION_RULES_GENERATION = 2
"""The generation of this module's keep rules. Raise it with every change that keeps a row
an older version deletes, whether or not a migration comes with it (2: a scheduled
execution kept until its ETA). A sweep whose generation is lower than the one its store
records skips retention (design: retention); ``store.migrate`` records it."""


@dataclass(frozen=True)
class RetentionResult:
    executions: int
    rows: int


def _not_done_before(execution: Any, cutoff_ms: int) -> ColumnElement[bool]:
    """``execution`` (an alias of the executions table) may still act: not terminal, or
    terminal only since ``cutoff_ms``. What keeps what it relies on (design: retention)."""
    return or_(
        execution.c.state.not_in(_TERMINAL),
        execution.c.terminal_at_ms.is_(None),
        execution.c.terminal_at_ms >= cutoff_ms,
    )


def _kept_for_a_user(kind: str, record_key: Any, cutoff_ms: int) -> ColumnElement[bool]:
    """Some execution that used the record (not its creator) is not terminal, or became
    terminal after ``cutoff_ms``: the record stays (design: retention)."""
    user = executions.alias("agboss_user")
    keeps = _not_done_before(user, cutoff_ms)
    if sabotage.active(PAUSED_RECORDS_EXPIRE):  # a long pause counts as done, here too
        paused_long = and_(
            user.c.state == ExecutionState.PAUSED.value, user.c.updated_at_ms < cutoff_ms
        )
        keeps = and_(keeps, not_(paused_long))
    return exists().where(
        _u.kind == kind,
        _u.record_key == record_key,
        user.c.id == _u.execution_id,
        keeps,
    )


def _creator_done_before(execution_id: Any, cutoff_ms: int) -> ColumnElement[bool]:
    done = and_(
        _e.state.in_(_TERMINAL), _e.terminal_at_ms.is_not(None), _e.terminal_at_ms < cutoff_ms
    )
    if sabotage.active(PAUSED_RECORDS_EXPIRE):
        paused = and_(_e.state == ExecutionState.PAUSED.value, _e.updated_at_ms < cutoff_ms)
        done = or_(done, paused)
    return exists().where(_e.id == execution_id, done)


@dataclass(frozen=True)
class _LeftBehind:
    """What ``agboss pending`` lists as "failed after a payment" and ended before a
    cutoff: the executions and the keys of the payments they left behind. Retention
    keeps both until an operator says the payments are dealt with (design: retention),
    else the customer stays charged for a failed order and nobody is told any more."""

    executions: frozenset[str]
    keys: frozenset[str]


def _left_behind_before(store: SQLAlchemyStore, cutoff_ms: int) -> _LeftBehind:
    """The listing's own rule (``execution_admin.failed_after_payment``), for every one
    that ended before ``cutoff_ms``: older lookalikes go, so this set is the operator's
    backlog, not the history."""
    if sabotage.active(RETENTION_DELETES_UNHANDLED_PAYMENTS):
        return _LeftBehind(frozenset(), frozenset())
    found = execution_admin.failed_after_payment(
        store, limit=sys.maxsize, ended_before_ms=cutoff_ms
    )
    ids = frozenset(record.id for record, _ in found)
    return _LeftBehind(ids, frozenset(key for _, keys in found for key in keys))


def _not_in(column: Column[Any], kept: frozenset[str]) -> tuple[ColumnElement[bool], ...]:
    return (column.not_in(sorted(kept)),) if kept else ()


def _may_go(
    kind: str,
    columns: tuple[Column[Any], Column[Any], Column[Any]],
    cutoff_ms: int,
    narrower: tuple[ColumnElement[bool], ...],
) -> ColumnElement[bool]:
    """Why a record may go, decided once: made before the cutoff (``narrower`` still),
    its creator terminal since before it, and no other user kept it (design: retention).
    The listing and the ``DELETE`` both judge by this expression."""
    key, creator, made_at = columns
    kept = (
        false()
        if sabotage.active(RECORD_USES_IGNORED_BY_RETENTION)
        else _kept_for_a_user(kind, key, cutoff_ms)
    )
    return and_(
        made_at < cutoff_ms, *narrower, _creator_done_before(creator, cutoff_ms), not_(kept)
    )


def delete_settled_intents_before(
    store: SQLAlchemyStore, cutoff_ms: int, limit: int
) -> RetentionResult:
    """Settled intents (with their history and uses) whose every user — the execution that
    created it and every one that replayed, joined, took over or reconciled it — has been
    terminal since before ``cutoff_ms``. Never a PENDING intent, never one a non-terminal
    execution used, whoever created it.

    Its creator recorded it while running, so an intent whose creator ended before the
    cutoff was first attempted before it too: that bound, on its index, keeps the read
    to intents old enough to go, whatever the history (design: retention)."""
    columns = (_i.idempotency_key, _i.execution_id, _i.first_attempt_at_ms)
    settled = _i.status != literal_column(f"'{SETTLED_ONLY_EXCLUDES}'")  # its index's
    # Its payments, and every intent it made (its undos' refunds tell what is left).
    left = _left_behind_before(store, cutoff_ms)
    kept = (*_not_in(_i.idempotency_key, left.keys), *_not_in(_i.execution_id, left.executions))
    return _delete_records_before(store, INTENT_RECORD, columns, cutoff_ms, limit, settled, *kept)


def delete_effects_before(store: SQLAlchemyStore, cutoff_ms: int, limit: int) -> RetentionResult:
    """Fenced-effect records (and their uses) whose every user has been terminal since
    before ``cutoff_ms``. A record is made while its creator runs: one whose creator
    ended before the cutoff was made before it (the bound its index serves)."""
    columns = (_f.key, _f.execution_id, _f.created_at_ms)
    # Its undo declarations are what tells a refunded failure from one left behind.
    kept = _not_in(_f.execution_id, _left_behind_before(store, cutoff_ms).executions)
    return _delete_records_before(store, EFFECT_RECORD, columns, cutoff_ms, limit, *kept)


def _delete_records_before(
    store: SQLAlchemyStore,
    kind: str,
    columns: tuple[Column[Any], Column[Any], Column[Any]],
    cutoff_ms: int,
    limit: int,
    *narrower: ColumnElement[bool],
) -> RetentionResult:
    """Retention of one kind of shared record: ``columns`` are its key, its creator and
    the time its index orders by (created before ``cutoff_ms``, ``narrower`` still),
    oldest first; the records go with their uses, in one transaction. Listed under the
    rows' locks and judged again by the ``DELETE`` (see the module doc)."""
    key, creator, made_at = columns
    may_go = _may_go(kind, columns, cutoff_ms, narrower)
    judged = not sabotage.active(RETENTION_DELETES_WHAT_IT_LISTED)
    with store.transaction() as tx:
        listing = select(key, creator).where(may_go).order_by(made_at, key).limit(limit)
        if judged and is_postgresql(tx.connection):
            # A row a replay holds (FOR KEY SHARE) is skipped, not waited for.
            listing = listing.with_for_update(skip_locked=True, of=key.table)
        rows = tx.execute(listing).all()
        if not rows:
            return RetentionResult(0, 0)
        gone = _delete_listed(tx, kind, [str(row[0]) for row in rows], may_go if judged else None)
        tx.delete_record_uses(kind, gone)  # a record the DELETE kept keeps its uses
        deleted = set(gone)
        creators = {str(row[1]) for row in rows if str(row[0]) in deleted}
        return RetentionResult(len(creators), len(gone))


def _delete_listed(
    tx: SQLTransaction, kind: str, keys: list[str], only_if: ColumnElement[bool] | None
) -> list[str]:
    """Delete the listed records for which ``only_if`` still holds on the row each
    ``DELETE`` reads (every listed one without it); the keys deleted."""
    with translated():
        if kind == INTENT_RECORD:
            return intents.delete_settled_returning_txn(tx.connection, keys, only_if=only_if)
        return effects.delete_returning_txn(tx.connection, keys, only_if=only_if)


def delete_terminal_executions_before(store: SQLAlchemyStore, cutoff_ms: int, limit: int) -> int:
    """Execution rows terminal since before ``cutoff_ms`` whose intents and fenced effects
    are gone already (retention keeps those as long as they are needed), with their
    lease row, pauses and the uses it did not rely on: history does not grow without
    bound. The audit trail of operators' decisions stays. One that left a payment behind
    stays until an operator dealt with it (``_LeftBehind``). One the sweep re-published
    (the claim puts its ``not_before`` one grace ahead) stays until that too is older
    than ``cutoff_ms``: its message, however long it waits in a backlog, is as safe as
    any other of its age, where a replay that found no row would run the body and charge
    again (design: unsent links). One published with an ETA (``countdown``, ``eta``) and
    ended before it (cancelled) stays until that ETA too is older than ``cutoff_ms``: the
    broker holds its message until then, and only the row makes it a dropped cancel, not
    a charge (design: retention)."""
    kept = _not_in(_e.id, _left_behind_before(store, cutoff_ms).executions)
    with store.transaction() as tx:
        publisher_may_rerun = _publisher_may_rerun(tx, cutoff_ms)
        # Filters on the rows the terminal_at_ms index walks, never an index of their own.
        if not sabotage.active(RETENTION_DELETES_A_REPUBLISHED_EXECUTION):
            kept = (*kept, or_(_e.not_before_ms.is_(None), _e.not_before_ms < cutoff_ms))
        if not sabotage.active(RETENTION_DELETES_A_SCHEDULED_EXECUTION):
            kept = (*kept, or_(_e.eta_ms.is_(None), _e.eta_ms < cutoff_ms))
        rows = tx.execute(
            select(_e.id)
            .where(
                # A state this version knows to be terminal, never one a newer version
                # wrote: that execution may still run, and a delivery that found no row
                # would run the body again (design: retention). ``state || ''`` keeps a
                # planner without statistics (SQLite's: the store runs no ANALYZE) off
                # the state index, walking every terminal execution, on terminal_at_ms.
                _e.state.concat(literal_column("''")).in_(_TERMINAL),
                _e.terminal_at_ms.is_not(None),
                _e.terminal_at_ms < cutoff_ms,
                not_(exists().where(_i.execution_id == _e.id)),
                not_(exists().where(_f.execution_id == _e.id)),
                not_(publisher_may_rerun),
                *kept,
            )
            .order_by(_e.terminal_at_ms, _e.id)
            .limit(limit)
        ).all()
        ids = [str(row.id) for row in rows]
        if not ids:
            return 0
        tx.execute(delete(pauses).where(pauses.c.execution_id.in_(ids)))
        # Its uses go too, but not its reliance on records that live on: what a record
        # says about the executions that relied on it (and completed on it) is the
        # record's, and goes with the record.
        tx.execute(delete(record_uses).where(_u.execution_id.in_(ids), _u.relied_at_ms.is_(None)))
        tx.execute(delete(leases).where(_l.scope.in_(ids), _l.released))
        # A terminal execution's lease was released; one left unreleased (its holder
        # died after the verdict) has expired long ago: gone too.
        tx.execute(delete(leases).where(_l.scope.in_(ids), _l.expires_at_ms < tx.now_expr()))
        return int(tx.execute(delete(executions).where(_e.id.in_(ids))).rowcount)


def _publisher_may_rerun(tx: SQLTransaction, cutoff_ms: int) -> ColumnElement[bool]:
    """The execution whose body published this one (Celery's ``parent_id``, kept in its
    options) is not terminal, or ended after ``cutoff_ms``: its body may run again and
    publish this one again under the same derived id, and only this row makes that
    publish a replay, not a second charge (design: retention)."""
    if sabotage.active(RETENTION_FORGETS_PUBLISHED_CHILDREN):
        return false()
    publisher = executions.alias("agboss_publisher")
    return exists().where(
        publisher.c.id == json_text(tx.connection, _e.options, "parent_id"),
        _not_done_before(publisher, cutoff_ms),
    )


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


def sweeper_scope(column: Column[str]) -> ColumnElement[bool]:
    """``column LIKE 'agboss.sweeper:%'`` with the pattern as a literal: the planner then
    proves the partial indexes over sweeper leases apply (a parameter it cannot see)."""
    return column.like(literal_column(f"'{SWEEPER_SCOPE_PATTERN}'"))


def delete_dead_sweeper_leases(store: SQLAlchemyStore, older_than_ms: int, limit: int) -> int:
    """Lease rows of sweepers that died mid-run, expired for longer than ``older_than_ms``
    and owning no intent (an intent names its owner by these rows). Both reads go through
    partial indexes over sweeper leases: one lease and one intent per execution in the
    same tables are never read."""
    with store.transaction() as tx:
        now = tx.now_expr()
        owned = exists().where(
            sweeper_scope(_i.owner_scope),  # implied by the join below; lets the index in
            _i.owner_scope == _l.scope,
            _i.owner_holder == _l.holder,
            _i.owner_token == _l.token,
        )
        scopes = (
            select(_l.scope)
            .where(
                sweeper_scope(_l.scope),
                _l.expires_at_ms < now - older_than_ms,
                not_(owned),
            )
            .limit(limit)
        )
        dead = [str(row.scope) for row in tx.execute(scopes).all()]
        if not dead:
            return 0
        return int(tx.execute(delete(leases).where(_l.scope.in_(dead))).rowcount)


__all__ = [
    "RetentionResult",
    "delete_dead_sweeper_leases",
    "delete_effects_before",
    "delete_released_lease",
    "delete_settled_intents_before",
    "delete_terminal_executions_before",
    "sweeper_scope",
]
