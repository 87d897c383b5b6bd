"""The sweep's re-drive and expiry verbs, decided on an execution row's columns never
sealed at rest (``sealed_columns.SEALED_COLUMNS``; ``core.executions.ExecutionFacts``).

A row sealed with a key this process does not hold is still listed, claimed, parked
and expired from these, so it never stops a step for the rows behind it; only the read
of its message (``read_execution``, for a publish) fails, after its claim committed,
inside the step's per-row try that names it (design: sealed at rest, sweep). Every
claim is a compare-and-set under the row's lock that re-checks that no lease is live.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, case, not_, or_, select, update
from sqlalchemy.engine import Row

from celery_agboss.core import sabotage
from celery_agboss.core.execution_states import expires_now, over_recovery_cap, redrive_count
from celery_agboss.core.executions import REDRIVABLE_STATES, ExecutionState, RedriveDecision
from celery_agboss.core.fault_points import SWEEP_BEFORE_EXPIRY, fault_point
from celery_agboss.core.protections import PLANNED_WAITS_COUNTED, STARTED_EXECUTIONS_EXPIRE
from celery_agboss.store.dialect import is_postgresql
from celery_agboss.store.execution_admin import locked_if, read_execution
from celery_agboss.store.execution_rows import (
    execution_lease_live,
    park_txn,
    set_execution_txn,
    terminal_values,
)
from celery_agboss.store.leases import lease_live
from celery_agboss.store.schema_executions import executions
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore
from celery_agboss.store.transactions import SQLTransaction

_e = executions.c
_REDRIVABLE = [state.value for state in REDRIVABLE_STATES]


@dataclass(frozen=True)
class UnsealedExecution:
    """``core.executions.ExecutionFacts`` as the store reads them."""

    id: str
    task_name: str
    state: ExecutionState
    expires_ms: int | None
    started_at_ms: int | None
    not_before_ms: int | None
    recovery_count: int
    cancel_requested: bool
    redrive_planned: bool
    updated_at_ms: int
    read_at_ms: int


@dataclass(frozen=True)
class RedriveClaim:
    """The re-drive's compare-and-set, committed: publish again, or parked; ``row`` is
    the execution after it (None when another sweeper changed it first)."""

    republish: bool
    parked: bool
    row: UnsealedExecution | None


UNSEALED_COLUMNS = (
    _e.id,
    _e.task_name,
    _e.state,
    _e.expires_ms,
    _e.started_at_ms,
    _e.not_before_ms,
    _e.recovery_count,
    _e.cancel_requested,
    _e.redrive_planned,
    _e.updated_at_ms,
)
"""``UnsealedExecution``'s columns but ``read_at_ms`` (the statement's clock)."""


def unsealed_of(row: Row[Any]) -> UnsealedExecution:
    m = row._mapping
    return UnsealedExecution(
        id=str(m["id"]),
        task_name=str(m["task_name"]),
        state=ExecutionState(m["state"]),
        expires_ms=m["expires_ms"],
        started_at_ms=m["started_at_ms"],
        not_before_ms=m["not_before_ms"],
        recovery_count=int(m["recovery_count"]),
        cancel_requested=bool(m["cancel_requested"]),
        redrive_planned=bool(m["redrive_planned"]),
        updated_at_ms=int(m["updated_at_ms"]),
        read_at_ms=int(m["read_at_ms"]),
    )


def read_unsealed_txn(
    tx: SQLTransaction, execution_id: str, *, lock: bool = False
) -> UnsealedExecution | None:
    """The row's facts; ``lock``: under its row lock (PostgreSQL ``FOR UPDATE``; SQLite's
    write transaction holds the database), as ``read_execution_txn`` locks it."""
    statement = select(*UNSEALED_COLUMNS, tx.now_expr().label("read_at_ms")).where(
        _e.id == execution_id
    )
    if lock and is_postgresql(tx.connection):
        statement = statement.with_for_update(of=executions)
    row = tx.execute(statement).first()
    return None if row is None else unsealed_of(row)


def find_redrivable(
    store: SQLAlchemyStore, limit: int, requested_grace_ms: int, *, as_of_ms: int | None = None
) -> list[UnsealedExecution]:
    """The executions the sweep re-publishes: no live lease, their time came (``RUNNING``,
    ``WAITING``, ``COMPENSATING`` past ``not_before``; ``REQUESTED`` past ``max(eta,
    requested_at) + grace``), judged at ``as_of_ms`` (default: now); oldest change first.
    A cancel-requested one is left out here, in the listing, not skipped after it (the
    cancel step ends it; a re-drive could send something new), unless ``COMPENSATING``
    (its undos run to their end): a row listed and then skipped would keep its place at
    the head of every batch and hide the rows behind it. No sealed column is read: a row
    no key opens is listed and claimed as any other (design: sealed at rest)."""
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
            select(*UNSEALED_COLUMNS, now.label("read_at_ms"))
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
        return [unsealed_of(row) for row in rows]


def claim_redrive_row(
    store: SQLAlchemyStore,
    execution_id: str,
    expected_updated_at_ms: int,
    max_recovery_attempts: int,
    *,
    next_redrive_delay_ms: int = 0,
) -> RedriveClaim:
    """The re-drive's compare-and-set, decided on the row's unsealed columns and
    committed before anything reads its message. A row no key opens keeps its claim: it
    counts toward the cap as any other re-drive counts, parks at the cap as any other,
    and leaves the head of the listing (``not_before``), so the step fails on it alone,
    by name, where it reads the message (design: sealed at rest); a claim that counted
    none has ``count_unopened_redrive`` count it then."""
    with store.transaction() as tx:
        row = read_unsealed_txn(tx, execution_id, lock=True)
        if (
            row is None
            or row.updated_at_ms != expected_updated_at_ms
            or row.state not in REDRIVABLE_STATES
        ):
            return RedriveClaim(False, False, None)
        if execution_lease_live(tx, execution_id):
            return RedriveClaim(False, False, None)
        # Only recoveries count toward the cap (design: recovery cap).
        count = redrive_count(row, sabotage.active(PLANNED_WAITS_COUNTED))
        recovery = count.taken_over or count.counted
        if recovery and over_recovery_cap(row, max_recovery_attempts):
            park_txn(tx, execution_id, row.recovery_count, max_recovery_attempts)
            return RedriveClaim(False, True, read_unsealed_txn(tx, execution_id))
        set_execution_txn(
            tx,
            execution_id,
            recovery_count=_e.recovery_count + (1 if count.counted else 0),
            wake_requested=False,
            # An undo's planned wait is read again by the delivery it leads to: no
            # take-over either (start_delivery).
            redrive_planned=count.planned and row.state is ExecutionState.COMPENSATING,
            not_before_ms=tx.now_expr() + max(0, next_redrive_delay_ms),
        )
        return RedriveClaim(True, False, read_unsealed_txn(tx, execution_id))


def count_unopened_redrive(store: SQLAlchemyStore, claimed: UnsealedExecution) -> bool:
    """A claim that counted no recovery (a take-over, which the delivery it leads to
    counts; the end of a planned wait) whose message no key opens: nothing is published,
    so no delivery ever counts it. Counted here, the planned mark gone with the wait it
    planned, so the claim parks it at the cap as any other
    (design: sealed at rest, recovery cap). Compare-and-set on ``updated_at_ms``; False
    when the row changed."""
    with store.transaction() as tx:
        counted = tx.execute(
            update(executions)
            .where(_e.id == claimed.id, _e.updated_at_ms == claimed.updated_at_ms)
            .values(
                recovery_count=_e.recovery_count + 1,
                redrive_planned=False,
                updated_at_ms=tx.now_expr(),
            )
        )
        return bool(counted.rowcount == 1)


def claim_redrive(
    store: SQLAlchemyStore,
    execution_id: str,
    expected_updated_at_ms: int,
    max_recovery_attempts: int,
    *,
    next_redrive_delay_ms: int = 0,
) -> RedriveDecision:
    """``claim_redrive_row``, then the execution read (and opened) for its publish once
    the claim committed: a row no key opens raises here, its claim kept."""
    claim = claim_redrive_row(
        store,
        execution_id,
        expected_updated_at_ms,
        max_recovery_attempts,
        next_redrive_delay_ms=next_redrive_delay_ms,
    )
    if claim.row is None:
        return RedriveDecision(False, False, None)
    return RedriveDecision(claim.republish, claim.parked, read_execution(store, execution_id))


def find_expiring(store: SQLAlchemyStore, limit: int) -> list[str]:
    """``expires`` bounds when an execution may start (design: expires bounds the start):
    only one that no delivery ever started becomes ``EXPIRED``. One that started,
    charged and then waits (a retry, a long wait, an unknown outcome) continues
    whatever its ``expires``: expiring it would leave the customer charged and the
    rest undone. The ids only: ``expire_if_due`` ends each in its own transaction, so
    one that fails never rolls the others back."""
    # The candidates, in SQL; core's ``expires_now`` decides each under its row lock.
    never_started = (
        _e.state.in_([ExecutionState.REQUESTED.value, ExecutionState.WAITING.value])
        if sabotage.active(STARTED_EXECUTIONS_EXPIRE)
        else and_(_e.state == ExecutionState.REQUESTED.value, _e.started_at_ms.is_(None))
    )
    with store.read_transaction() as tx:
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
    return [str(row.id) for row in rows]


def expire_if_due(store: SQLAlchemyStore, execution_id: str) -> UnsealedExecution | None:
    """The sweep, and a worker that holds a message past its ``expires`` by its own
    clock: the execution ends ``EXPIRED`` only by ``expires_now``, on the database's
    clock, under its row lock. Decided and written on its unsealed columns: a row no
    key opens expires as any other (design: sealed at rest)."""
    with store.transaction() as tx:
        if locked_if(tx, execution_id, read_unsealed_txn, expires_now) is None:
            return None
        # What ``terminal_txn`` writes, without reading the sealed columns back.
        ended = terminal_values(ExecutionState.EXPIRED, tx.now_expr(), {"reason": "expired"})
        set_execution_txn(tx, execution_id, **ended)
        return read_unsealed_txn(tx, execution_id)


__all__ = [
    "UNSEALED_COLUMNS",
    "RedriveClaim",
    "UnsealedExecution",
    "claim_redrive",
    "claim_redrive_row",
    "count_unopened_redrive",
    "expire_if_due",
    "find_expiring",
    "find_redrivable",
    "read_unsealed_txn",
    "unsealed_of",
]
