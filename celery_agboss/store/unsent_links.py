"""The sweep's rows of completed executions whose links never went out: the listing, the
claim before a re-publish, and the two writes that take a row out of the listing.

A completed execution keeps ``links_dispatched`` false until its delivery recorded its
links sent (``delivery.link_ends``); when that delivery's message is lost, nothing sends
them. The listing reads the partial index ``ix_agboss_executions_unsent_links``
(``schema_executions.UNSENT_LINKS``), so a link-less completion is never read.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import and_, or_, select, text, update

from celery_agboss.core.executions import ExecutionRecord, ExecutionState
from celery_agboss.store.execution_rows import read_execution_txn, record_of
from celery_agboss.store.schema_executions import UNSENT_LINKS, executions
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore

_e = executions.c


def _republishable(max_recovery_attempts: int) -> Any:
    """Still in the index and under the recovery cap: each re-publish counts as a
    recovery, and one more past the cap is never made (design: recovery cap)."""
    return and_(
        _e.state == ExecutionState.COMPLETED.value,
        text(UNSENT_LINKS),
        _e.recovery_count < max_recovery_attempts,
    )


def find_unsent_links(
    store: SQLAlchemyStore,
    limit: int,
    grace_ms: int,
    max_recovery_attempts: int,
    *,
    as_of_ms: int | None = None,
) -> list[ExecutionRecord]:
    """Completed at least ``grace_ms`` ago, links not recorded as sent, not re-published
    within the last grace, under the cap; oldest completion first. Every row listed is
    written by the step (claimed, or marked link-less), so none keeps its place at the
    head of every batch."""
    with store.read_transaction() as tx:
        now = tx.now_expr(as_of_ms)
        rows = tx.execute(
            select(executions, now.label("read_at_ms"))
            .where(
                _republishable(max_recovery_attempts),
                _e.terminal_at_ms <= now - grace_ms,
                or_(_e.not_before_ms.is_(None), _e.not_before_ms <= now),
            )
            .order_by(_e.terminal_at_ms, _e.id)
            .limit(limit)
        ).all()
        return [record_of(row, tx.connection) for row in rows]


def claim_links_republish(
    store: SQLAlchemyStore,
    record: ExecutionRecord,
    max_recovery_attempts: int,
    next_delay_ms: int,
) -> ExecutionRecord | None:
    """Compare-and-set on ``updated_at_ms``, as the re-drive's claim: one more recovery,
    and no other re-publish for ``next_delay_ms`` (its message may still sit in a queue).
    The row after it, or None when another sweeper (or the replay that recorded the
    links) changed it first."""
    with store.transaction() as tx:
        now = tx.now_expr()
        claimed = tx.execute(
            update(executions)
            .where(
                _e.id == record.id,
                _e.updated_at_ms == record.updated_at_ms,
                _republishable(max_recovery_attempts),
            )
            .values(
                recovery_count=_e.recovery_count + 1,
                not_before_ms=now + max(0, next_delay_ms),
                updated_at_ms=now,
            )
        )
        if claimed.rowcount != 1:
            return None
        return read_execution_txn(tx, record.id)


def release_links_claim(store: SQLAlchemyStore, claimed: ExecutionRecord) -> bool:
    """Undo a claim whose publish raised (the broker is down): nothing went out, so it
    counts no recovery and the next run takes the row again. False when the row changed
    since the claim."""
    with store.transaction() as tx:
        done = tx.execute(
            update(executions)
            .where(
                _e.id == claimed.id,
                _e.updated_at_ms == claimed.updated_at_ms,
            )
            .values(
                recovery_count=_e.recovery_count - 1,
                not_before_ms=None,
                updated_at_ms=tx.now_expr(),
            )
        )
        return bool(done.rowcount == 1)


def mark_without_links(store: SQLAlchemyStore, record: ExecutionRecord) -> bool:
    """A listed row whose message has no link after all (its options only name one, in a
    custom header): recorded as having sent all of its none, so it leaves the index and
    is never read again. Compare-and-set on ``updated_at_ms``."""
    with store.transaction() as tx:
        done = tx.execute(
            update(executions)
            .where(_e.id == record.id, _e.updated_at_ms == record.updated_at_ms)
            .values(links_dispatched=True, updated_at_ms=tx.now_expr())
        )
        return bool(done.rowcount == 1)


__all__ = [
    "claim_links_republish",
    "find_unsent_links",
    "mark_without_links",
    "release_links_claim",
]
