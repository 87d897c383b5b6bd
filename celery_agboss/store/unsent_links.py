"""The sweep's rows of completed executions whose links never went out: the listing, the
claim before a re-publish, and the two writes that take a row out of the listing.

A completed execution keeps ``links_dispatched`` false until its delivery recorded its
links sent (``delivery.link_ends``); when that delivery's message is lost, nothing sends
them. The listing reads the partial index ``ix_agboss_executions_unsent_links``
(``schema_executions.UNSENT_LINKS``), so a link-less completion is never read. It reads
no sealed column (``sealed_columns.SEALED_COLUMNS``): a row no key opens is still listed
and claimed, and fails alone, by name, when the step reads its message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, false, or_, select, text, update

from celery_agboss.core import sabotage
from celery_agboss.core.executions import ExecutionRecord, ExecutionState
from celery_agboss.core.protections import (
    UNSENT_LINKS_CAPPED_BY_WHOLE_LIFE,
    UNSENT_LINKS_PAST_RETENTION,
)
from celery_agboss.store.redrive_and_expiry import UnsealedExecution, read_unsealed_txn
from celery_agboss.store.schema_executions import UNSENT_LINKS, executions
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore

_e = executions.c
_unclaimed = _e.not_before_ms.is_(None)


@dataclass(frozen=True)
class UnsentLinksRow:
    """What the listing reads of a row: nothing sealed."""

    id: str
    task_name: str
    options: str
    updated_at_ms: int


def _republishable(max_recovery_attempts: int) -> Any:
    """Still in the index, and under the recovery cap or never claimed by this step (the
    ``COMPLETED`` verdict clears ``not_before``; only the claim sets it on such a row):
    each re-publish counts as a recovery and none is made past the cap, but the count is
    the execution's whole life, and one that completed at the cap (its message re-driven
    that often) still gets one, its last (design: recovery cap, unsent links)."""
    return and_(
        _e.state == ExecutionState.COMPLETED.value,
        text(UNSENT_LINKS),
        or_(
            _e.recovery_count < max_recovery_attempts,
            false() if sabotage.active(UNSENT_LINKS_CAPPED_BY_WHOLE_LIFE) else _unclaimed,
        ),
    )


def find_unsent_links(
    store: SQLAlchemyStore,
    limit: int,
    grace_ms: int,
    max_recovery_attempts: int,
    *,
    retention_ms: int,
    as_of_ms: int | None = None,
) -> list[UnsentLinksRow]:
    """Completed at least ``grace_ms`` ago, links not recorded as sent, not re-published
    within the last grace, under the cap or never claimed; oldest completion first.
    Every row listed is written by the step (claimed, or marked sent), so none keeps its
    place at the head of every batch.

    Only rows retention (its cutoff: now less ``retention_ms``, the terminal execution
    retention) keeps for two more graces: a committed claim keeps the row from
    retention as long as any message of its age, but one made at the edge could come
    after the delete, and a replay that finds no row runs the body again and charges
    again (design: unsent links, retention)."""
    with store.read_transaction() as tx:
        now = tx.now_expr(as_of_ms)
        completed = [_e.terminal_at_ms <= now - grace_ms]
        if not sabotage.active(UNSENT_LINKS_PAST_RETENTION):
            completed.append(_e.terminal_at_ms > now - retention_ms + 2 * grace_ms)
        rows = tx.execute(
            select(_e.id, _e.task_name, _e.options, _e.updated_at_ms)
            .where(
                _republishable(max_recovery_attempts),
                *completed,
                or_(_e.not_before_ms.is_(None), _e.not_before_ms <= now),
            )
            .order_by(_e.terminal_at_ms, _e.id)
            .limit(limit)
        ).all()
        return [
            UnsentLinksRow(str(row.id), str(row.task_name), str(row.options), row.updated_at_ms)
            for row in rows
        ]


def claim_links_republish(
    store: SQLAlchemyStore,
    row: UnsentLinksRow,
    max_recovery_attempts: int,
    next_delay_ms: int,
) -> UnsealedExecution | None:
    """Compare-and-set on ``updated_at_ms``, as the re-drive's claim: one more recovery,
    and no other re-publish for ``next_delay_ms`` (its message may still sit in a queue).
    The row after it; None when another sweeper (or the replay that recorded the links)
    changed it first. Committed before the row's message is read: a row that cannot be
    opened keeps it, so it leaves the head of the list and counts toward the cap."""
    with store.transaction() as tx:
        now = tx.now_expr()
        claimed = tx.execute(
            update(executions)
            .where(
                _e.id == row.id,
                _e.updated_at_ms == row.updated_at_ms,
                _republishable(max_recovery_attempts),
            )
            .values(
                recovery_count=_e.recovery_count + 1,
                not_before_ms=now + max(0, next_delay_ms),
                updated_at_ms=now,
            )
        )
        return read_unsealed_txn(tx, row.id) if claimed.rowcount == 1 else None


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


def mark_links_sent(store: SQLAlchemyStore, row: UnsentLinksRow) -> bool:
    """A listed row with nothing to send again: its message has no link after all (its
    options only name one, in a custom header), or the result backend shows its links
    went out (the delivery's own mark was lost). Recorded sent, so it leaves the index
    and is never read again. Compare-and-set on ``updated_at_ms``."""
    with store.transaction() as tx:
        done = tx.execute(
            update(executions)
            .where(_e.id == row.id, _e.updated_at_ms == row.updated_at_ms)
            .values(links_dispatched=True, updated_at_ms=tx.now_expr())
        )
        return bool(done.rowcount == 1)


__all__ = [
    "UnsentLinksRow",
    "claim_links_republish",
    "find_unsent_links",
    "mark_links_sent",
    "release_links_claim",
]
