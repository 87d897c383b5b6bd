"""The intents the sweep reconciles and operators are shown: listings, never decisions.

Each listing is one read transaction; whatever acts on a row it names re-checks the
row under its lock (a listing's "no live lease" may be stale by then).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import and_, not_, or_, select
from sqlalchemy.engine import Row
from sqlalchemy.sql.elements import ColumnElement

from celery_agboss.core.store_protocol import IntentRecord, IntentStatus
from celery_agboss.store.intents import owner_live_expr
from celery_agboss.store.leases import lease_live
from celery_agboss.store.schema import outbound_calls
from celery_agboss.store.shared_records import records_of
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore
from celery_agboss.store.transactions import SQLTransaction
from celery_agboss.store.unopened import showing_unopened

_i = outbound_calls.c


def find_stranded_keys(
    store: SQLAlchemyStore, limit: int, *, as_of_ms: int | None = None
) -> list[tuple[str, str]]:
    """``(idempotency key, execution id)`` of PENDING intents the sweep should look up:
    no live owner, next lookup due, and no live lease on their execution (a live holder
    reconciles its own intents). Oldest first. ``as_of_ms``: judge leases and due times
    at that database time instead of now (one sweep run's steps agree on who is dead)."""
    with store.read_transaction() as tx:
        now = tx.now_expr(as_of_ms)
        rows = tx.execute(
            select(_i.idempotency_key, _i.execution_id)
            .where(
                _i.status == IntentStatus.PENDING.value,
                not_(owner_live_expr(now)),
                or_(_i.next_lookup_at_ms.is_(None), _i.next_lookup_at_ms <= now),
                not_(lease_live(now, _i.execution_id)),
            )
            .order_by(_i.first_attempt_at_ms, _i.idempotency_key)
            .limit(limit)
        ).all()
        return [(str(row.idempotency_key), str(row.execution_id)) for row in rows]


def unsettled_intent() -> ColumnElement[bool]:
    """What ``agboss pending`` lists (and the metrics count): PENDING intents, and
    completed ones whose result could not be stored."""
    return or_(
        _i.status == IntentStatus.PENDING.value,
        and_(_i.status == IntentStatus.COMPLETED.value, not_(_i.result_stored)),
    )


def list_pending_intents(
    store: SQLAlchemyStore, *, limit: int, operator_only: bool = False
) -> list[IntentRecord]:
    """PENDING intents (and completed ones whose result could not be stored), the ones
    flagged for an operator first, then oldest first."""
    with store.read_transaction() as tx:
        statement = select(_i.idempotency_key).where(unsettled_intent())
        if operator_only:
            statement = statement.where(_i.needs_operator)
        rows = tx.execute(
            statement.order_by(
                _i.needs_operator.desc(), _i.first_attempt_at_ms, _i.idempotency_key
            ).limit(limit)
        ).all()
        return _shown(tx, rows)


def list_intents_of(store: SQLAlchemyStore, execution_id: str) -> list[IntentRecord]:
    """The intents the execution created (their creator), oldest first."""
    with store.read_transaction() as tx:
        return tx.list_intents(execution_id)


def used_by_execution(execution_id: str) -> ColumnElement[bool]:
    """An intent the execution created, used (replayed, joined, took it over) or sent:
    ``records_of``, the records core's rules judge for it (``shared_records_of``), and
    the one predicate for what it waits for and what an operator is shown of it,
    whichever execution created them. An attempt it sent of another's intent is among
    them: its claim notes the use before anything is sent, so ``sent_by`` adds nothing
    (and, not indexed, would read every intent).
    (design: records several executions share)"""
    return _i.idempotency_key.in_(records_of(execution_id))


def list_intents_used_by(store: SQLAlchemyStore, execution_id: str) -> list[IntentRecord]:
    """Every intent of the execution (``used_by_execution``), oldest first: what
    ``agboss show ID`` lists, so that a shared intent it waits for is not hidden behind
    its creator."""
    with store.read_transaction() as tx:
        rows = tx.execute(
            select(_i.idempotency_key)
            .where(used_by_execution(execution_id))
            .order_by(_i.first_attempt_at_ms, _i.idempotency_key)
        ).all()
        return _shown(tx, rows)


def _shown(tx: SQLTransaction, rows: Sequence[Row[Any]]) -> list[IntentRecord]:
    """The intents ``rows`` name, for an operator to look at: a value no key of this
    process opens is shown as such (``store.unopened``), its intent listed with the
    others."""
    with showing_unopened(tx.connection):
        records = [tx.read_intent(str(row.idempotency_key)) for row in rows]
    return [record for record in records if record is not None]


__all__ = [
    "find_stranded_keys",
    "list_intents_of",
    "list_intents_used_by",
    "list_pending_intents",
    "unsettled_intent",
    "used_by_execution",
]
