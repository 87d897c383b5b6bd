"""The audit trail of operators' decisions, and the store's meta values.

``insert_audit_txn`` is the one place an audit row is written: an operator's change
writes it in the transaction that makes the change (``execution_rows.audit_change_txn``,
``operator.resolving``), a decision with nothing to change in one of its own
(``append_audit``).
"""

from __future__ import annotations

from sqlalchemy import delete, select, update

from celery_agboss.core.executions import AuditEntry
from celery_agboss.store.dialect import insert_or_nothing
from celery_agboss.store.schema_executions import audit, meta
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore
from celery_agboss.store.transactions import SQLTransaction

_m = meta.c


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


def set_meta_txn(tx: SQLTransaction, key: str, value: str) -> None:
    """Write a meta value (its ``updated_at_ms``: now, on the database clock), inside the
    caller's transaction."""
    now = tx.now_expr()
    changed = tx.execute(
        update(meta).where(meta.c.key == key).values(value=value, updated_at_ms=now)
    ).rowcount
    if not changed:
        tx.execute(
            insert_or_nothing(tx.connection, meta).values(key=key, value=value, updated_at_ms=now)
        )


def append_audit(
    store: SQLAlchemyStore,
    actor: str,
    action: str,
    target: str,
    reason: str,
    before: str | None = None,
    after: str | None = None,
) -> None:
    """An audit row in a transaction of its own (a decision with nothing to change)."""
    with store.transaction() as tx:
        insert_audit_txn(
            tx,
            actor=actor,
            action=action,
            target=target,
            reason=reason,
            before=before,
            after=after,
        )


def list_audit(
    store: SQLAlchemyStore, target: str | None = None, limit: int = 100
) -> list[AuditEntry]:
    with store.read_transaction() as tx:
        statement = select(audit)
        if target is not None:
            statement = statement.where(audit.c.target == target)
        rows = tx.execute(statement.order_by(audit.c.id.desc()).limit(limit)).all()
        return [
            AuditEntry(
                id=int(r.id),
                at_ms=int(r.at_ms),
                actor=r.actor,
                action=r.action,
                target=r.target,
                reason=r.reason,
                before=r.before,
                after=r.after,
            )
            for r in rows
        ]


def set_meta(store: SQLAlchemyStore, key: str, value: str) -> None:
    with store.transaction() as tx:
        set_meta_txn(tx, key, value)


def get_meta(store: SQLAlchemyStore, key: str) -> tuple[str, int] | None:
    with store.read_transaction() as tx:
        row = tx.execute(
            select(meta.c.value, meta.c.updated_at_ms).where(meta.c.key == key)
        ).first()
        return None if row is None else (str(row.value), int(row.updated_at_ms))


# --- the sweep's ticks: one sweep per tick, however many beats --------------------

TICK_KEY_PREFIX = "sweep.tick."
LAST_SWEEP_KEY = "sweep.last"
LAST_WORKER_SWEEP_KEY = "sweep.last-by-workers"


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


__all__ = [
    "LAST_SWEEP_KEY",
    "LAST_WORKER_SWEEP_KEY",
    "TICK_KEY_PREFIX",
    "append_audit",
    "claim_tick",
    "get_meta",
    "insert_audit_txn",
    "list_audit",
    "set_meta",
    "set_meta_txn",
]
