"""The outbox table's statements (``celery_agboss.outbox`` is the verb the body calls).

A row is written on the caller's connection, inside the caller's transaction (a fenced
effect's, or the application's own), so it exists if and only if that transaction
committed. Everything after that — reading what to publish, marking it published, the
sweep's claim of rows left unpublished, retention — is one short transaction of its
own on the store. Texts (arguments, options) are the caller's: this module stores and
returns them as they are. The sweep's claim reads no sealed column
(``sealed_columns.SEALED_COLUMNS``): a row no key opens is still claimed, and fails
alone, by name, when the sweep reads its message.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, func, literal, select, true, update
from sqlalchemy.engine import Connection

from celery_agboss.core.sealing import SealedAt, Sealer
from celery_agboss.errors import IdempotencyKeyConflictError
from celery_agboss.store.dialect import clock, insert_or_nothing, is_postgresql
from celery_agboss.store.driver_errors import translated
from celery_agboss.store.schema_executions import outbox
from celery_agboss.store.sealed_columns import sealed_with, sealer_of
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore

_o = outbox.c


@dataclass(frozen=True)
class OutboxMessage:
    """One follow-up task as it will be published: its id, name and kombu-JSON texts."""

    task_id: str
    task_name: str
    args: str
    kwargs: str
    options: str
    execution_id: str | None = None


@dataclass(frozen=True)
class OutboxRow:
    """A committed outbox row: the message, and where its publish stands."""

    message: OutboxMessage
    created_at_ms: int
    publish_after_ms: int
    published_at_ms: int | None
    sweep_publishes: int

    @property
    def published(self) -> bool:
        return self.published_at_ms is not None


@dataclass(frozen=True)
class ClaimedOutboxRow:
    """What the sweep's claim reads of a row: nothing sealed."""

    task_id: str
    task_name: str
    created_at_ms: int


def _row(row: Any, conn: Connection, sealer: Sealer | None = None) -> OutboxRow:
    task_id = str(row.task_id)
    chosen = sealer or sealer_of(conn)

    def open_(column: str, stored: str) -> str:
        return str(chosen.open(stored, SealedAt(outbox.name, column, task_id)))

    return OutboxRow(
        message=OutboxMessage(
            task_id=task_id,
            task_name=str(row.task_name),
            args=open_("args", row.args),
            kwargs=open_("kwargs", row.kwargs),
            options=str(row.options),
            execution_id=None if row.execution_id is None else str(row.execution_id),
        ),
        created_at_ms=int(row.created_at_ms),
        publish_after_ms=int(row.publish_after_ms),
        published_at_ms=None if row.published_at_ms is None else int(row.published_at_ms),
        sweep_publishes=int(row.sweep_publishes),
    )


# --- inside the caller's transaction ------------------------------------------------------


def insert_txn(
    conn: Connection,
    message: OutboxMessage,
    *,
    grace_ms: int,
    offset_ms: int = 0,
    sealer: Sealer | None = None,
) -> bool:
    """Write the row in the caller's transaction; True when this call wrote it. Its
    arguments are sealed with ``sealer`` (default: the connection's store's).

    The same task id enqueued again with the same message is no second row (a retried
    application transaction, a lost race on one business key); with another message it
    is ``IdempotencyKeyConflictError``: one id must never stand for two tasks.
    """
    clk = clock(conn, offset_ms)  # one clock read: the grace is exactly grace_ms
    chosen = sealer or sealer_of(conn)

    def seal(column: str, text: str) -> str | None:
        return sealed_with(chosen, conn, outbox.name, column, message.task_id, text)

    values = {
        "task_id": message.task_id,
        "task_name": message.task_name,
        "args": seal("args", message.args),
        "kwargs": seal("kwargs", message.kwargs),
        "options": message.options,
        "execution_id": message.execution_id,
    }
    row = [literal(value, _o[name].type) for name, value in values.items()]
    inserted = conn.execute(
        insert_or_nothing(conn, outbox)
        .from_select(
            [*values, "created_at_ms", "publish_after_ms"],
            select(*row, clk.c.now, clk.c.now + grace_ms)
            .select_from(clk)
            .where(true()),  # SQLite: "INSERT … SELECT … ON CONFLICT" needs a WHERE
        )
        .returning(_o.task_id)
    ).first()
    if inserted is not None:
        return True
    found = read_txn(conn, message.task_id, chosen)
    if found is not None and (
        found.message.task_name,
        found.message.args,
        found.message.kwargs,
    ) != (message.task_name, message.args, message.kwargs):
        raise IdempotencyKeyConflictError(
            f"outbox task id {message.task_id!r} was enqueued for {found.message.task_name!r} "
            "with other arguments; nothing was written",
            task_id=message.task_id,
            task=message.task_name,
        )
    return False


def read_txn(conn: Connection, task_id: str, sealer: Sealer | None = None) -> OutboxRow | None:
    row = conn.execute(select(outbox).where(_o.task_id == task_id)).first()
    return None if row is None else _row(row, conn, sealer)


# --- transactions of their own ------------------------------------------------------------


def read(store: SQLAlchemyStore, task_id: str) -> OutboxRow | None:
    """The committed row, published or not (None: never committed, or deleted)."""
    with store.read_transaction() as tx, translated():
        return read_txn(tx.connection, task_id)


def unpublished(store: SQLAlchemyStore, task_ids: Sequence[str]) -> list[OutboxRow]:
    """The committed, unpublished rows among ``task_ids``, in their order: a row of a
    transaction that rolled back does not exist, so it is never published."""
    wanted = list(dict.fromkeys(task_ids))
    if not wanted:
        return []
    with store.read_transaction() as tx:
        rows = tx.execute(
            select(outbox).where(_o.task_id.in_(wanted), _o.published_at_ms.is_(None))
        ).all()
    found = {str(row.task_id): _row(row, tx.connection) for row in rows}
    return [found[task_id] for task_id in wanted if task_id in found]


def mark_published(store: SQLAlchemyStore, task_id: str) -> bool:
    """Record that the broker took the message; False when it was marked already."""
    with store.transaction() as tx:
        moved = tx.execute(
            update(outbox)
            .where(_o.task_id == task_id, _o.published_at_ms.is_(None))
            .values(published_at_ms=tx.now_expr())
        ).rowcount
    return bool(moved)


def claim_due(store: SQLAlchemyStore, limit: int, retry_after_ms: int) -> list[ClaimedOutboxRow]:
    """The sweep's claim: up to ``limit`` unpublished rows whose ``publish_after_ms`` passed,
    oldest first, moved ``retry_after_ms`` on in the same transaction, so that another
    sweeper skips them until this one published them (or died trying). On PostgreSQL the
    rows another sweeper is claiming are skipped (``FOR UPDATE SKIP LOCKED``); on SQLite
    the write lock orders two claims, and the second finds the rows moved on. Committed
    before any message is read: a row that cannot be opened keeps it, so it leaves the
    head of the list."""
    if limit < 1:
        raise ValueError(f"limit must be at least 1, not {limit}")
    with store.transaction() as tx:
        now = tx.now_expr()
        due = (
            select(_o.task_id, _o.task_name, _o.created_at_ms)
            .where(_o.published_at_ms.is_(None), _o.publish_after_ms <= now)
            .order_by(_o.publish_after_ms, _o.task_id)
            .limit(limit)
        )
        if is_postgresql(tx.connection):
            due = due.with_for_update(skip_locked=True)
        claimed = [
            ClaimedOutboxRow(str(row.task_id), str(row.task_name), int(row.created_at_ms))
            for row in tx.execute(due).all()
        ]
        if not claimed:
            return []
        tx.execute(
            update(outbox)
            .where(
                _o.task_id.in_([row.task_id for row in claimed]),
                _o.published_at_ms.is_(None),
            )
            .values(
                publish_after_ms=tx.now_expr() + retry_after_ms,
                sweep_publishes=_o.sweep_publishes + 1,
            )
        )
    return claimed


def delete_published_before(store: SQLAlchemyStore, cutoff_ms: int, limit: int) -> int:
    """Retention: up to ``limit`` rows published before ``cutoff_ms``, oldest first. An
    unpublished row is never deleted."""
    with store.transaction() as tx:
        keys = [
            str(row.task_id)
            for row in tx.execute(
                select(_o.task_id)
                .where(_o.published_at_ms < cutoff_ms)
                .order_by(_o.published_at_ms, _o.task_id)
                .limit(limit)
            ).all()
        ]
        if not keys:
            return 0
        return int(tx.execute(delete(outbox).where(_o.task_id.in_(keys))).rowcount)


def count_unpublished(store: SQLAlchemyStore) -> int:
    """How many committed rows wait for their publish (for operators and metrics)."""
    with store.read_transaction() as tx:
        counted = tx.execute(
            select(func.count()).select_from(outbox).where(_o.published_at_ms.is_(None))
        ).scalar()
    return int(counted or 0)


__all__ = [
    "ClaimedOutboxRow",
    "OutboxMessage",
    "OutboxRow",
    "claim_due",
    "count_unpublished",
    "delete_published_before",
    "insert_txn",
    "mark_published",
    "read",
    "read_txn",
    "unpublished",
]
