"""Answering a pause, and listing the pauses that wait for one.

An answer is one compare-and-set under the execution row's lock: the pause moves
``PENDING`` → ``ANSWERED`` and its ``PAUSED`` execution → ``WAITING`` (due now, a
planned re-drive) together, or nothing moves and the caller gets ``NotPausedError``.
Two approvers, a return page and a webhook, or an operator and a retrying browser can
answer at once on different processes: the row lock orders them, and the second finds
the pause answered (design: PS11, PS21).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import insert, select, update

from celery_agboss.core import sabotage
from celery_agboss.core.executions import (
    Audit,
    ExecutionRecord,
    ExecutionState,
)
from celery_agboss.core.protections import PAUSE_ANSWER_WITHOUT_COMPARE_AND_SET
from celery_agboss.core.store_protocol import FencedTransaction
from celery_agboss.errors import NotPausedError
from celery_agboss.store.execution_rows import (
    audit_change_txn,
    execution_lease_live,
    read_execution_txn,
    require_execution_txn,
    set_execution_txn,
    set_unless_terminal_txn,
    sql,
)
from celery_agboss.store.schema_executions import executions, pauses
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore
from celery_agboss.store.transactions import SQLTransaction

_e = executions.c
_p = pauses.c

PENDING = "PENDING"
ANSWERED = "ANSWERED"


def answer_pause(
    store: SQLAlchemyStore, pause_id: str, answer: str, *, audit: Audit | None = None
) -> ExecutionRecord:
    """Answer a pending pause of a ``PAUSED`` execution once and move the execution
    to ``WAITING``, due now; the caller re-publishes it. ``NotPausedError`` (nothing
    moved) when the pause was answered already, does not exist, or its execution no
    longer waits for it (cancelled, ended, waiting for an operator).

    While the delivery that paused still holds the lease (the answer came between its
    pause and its release), the caller's re-publish is refused; the execution is then
    marked to be woken, so that delivery re-publishes it when it lets go."""
    with store.transaction() as tx:
        row = tx.execute(select(_p.execution_id).where(_p.id == pause_id)).first()
        if row is None:
            raise NotPausedError(f"no pause {pause_id!r}", pause_id=pause_id, found=False)
        execution_id = str(row.execution_id)
        record = read_execution_txn(tx, execution_id, lock=True)  # orders concurrent answers
        if sabotage.active(PAUSE_ANSWER_WITHOUT_COMPARE_AND_SET):
            return _answer_unconditionally(tx, pause_id, execution_id, answer)
        status = tx.execute(select(_p.status).where(_p.id == pause_id)).scalar()
        if status != PENDING:
            raise NotPausedError(f"the pause {pause_id!r} was already answered", pause_id=pause_id)
        refusal = _not_waiting(record, execution_id)
        if refusal is not None:
            raise NotPausedError(
                f"{refusal}: it no longer waits for the pause {pause_id!r}",
                pause_id=pause_id,
            )
        won = tx.execute(
            update(pauses)
            .where(_p.id == pause_id, _p.status == PENDING)
            .values(status=ANSWERED, answer=answer, answered_at_ms=tx.now_expr())
        ).rowcount
        if won != 1:  # pragma: no cover - the row lock above orders every answer
            raise NotPausedError(f"the pause {pause_id!r} was already answered", pause_id=pause_id)
        live = execution_lease_live(tx, execution_id)
        set_execution_txn(tx, execution_id, **_continue_values(tx, live))
        after = require_execution_txn(tx, execution_id)
        audit_change_txn(tx, audit, execution_id, record, after)
        return after


def _answer_unconditionally(
    tx: SQLTransaction, pause_id: str, execution_id: str, answer: str
) -> ExecutionRecord:
    """The sabotaged answer: the pause and the execution updated whatever they are."""
    tx.execute(
        update(pauses)
        .where(_p.id == pause_id)
        .values(status=ANSWERED, answer=answer, answered_at_ms=tx.now_expr())
    )
    set_execution_txn(tx, execution_id, terminal_at_ms=None, **_continue_values(tx, False))
    return require_execution_txn(tx, execution_id)


def list_pauses(store: SQLAlchemyStore, limit: int = 100) -> list[tuple[str, str, str]]:
    """``(pause_id, execution_id, status)`` of the pending pauses whose execution
    still waits for them (``PAUSED``), oldest first."""
    with store.read_transaction() as tx:
        rows = tx.execute(
            select(_p.id, _p.execution_id, _p.status)
            .join(executions, _e.id == _p.execution_id)
            .where(_p.status == PENDING, _e.state == ExecutionState.PAUSED.value)
            .order_by(_p.created_at_ms, _p.id)
            .limit(limit)
        ).all()
        return [(str(r.id), str(r.execution_id), str(r.status)) for r in rows]


def pause_in(tx: FencedTransaction, name: str, payload: str | None) -> tuple[bool, str | None]:
    """The pause ``<execution id>:<name>``: ``(True, answer)`` once answered; else it is
    recorded PENDING (if new), the execution ``PAUSED``, and ``(False, None)``."""
    t, execution_id = sql(tx), tx.lease.scope
    pause_id = f"{execution_id}:{name}"
    row = t.execute(select(_p.status, _p.answer).where(_p.id == pause_id)).first()
    if row is not None and row.status == "ANSWERED":
        return True, row.answer
    if row is None:
        t.execute(
            insert(pauses).values(
                id=pause_id,
                execution_id=execution_id,
                name=name,
                status="PENDING",
                payload=payload,
                created_at_ms=t.now_expr(),
            )
        )
    set_unless_terminal_txn(
        t,
        execution_id,
        state=ExecutionState.PAUSED.value,
        not_before_ms=None,
        reason=f"paused at {name}"[:1000],
    )
    return False, None


def _not_waiting(record: ExecutionRecord | None, execution_id: str) -> str | None:
    """Why the execution does not wait for an answer any more, or None when it does."""
    if record is None:
        return f"execution {execution_id} is gone"
    if record.state is not ExecutionState.PAUSED:
        return f"execution {execution_id} is {record.state.value}"
    if record.cancel_requested:
        return f"a cancel was requested for execution {execution_id}"
    return None


def _continue_values(tx: SQLTransaction, lease_live: bool) -> dict[str, Any]:
    """The answered execution: ``WAITING`` and due now; its re-publish is the planned end
    of the wait (no recovery). ``wake_requested`` when a delivery still holds the lease."""
    values: dict[str, Any] = {
        "state": ExecutionState.WAITING.value,
        "not_before_ms": tx.now_expr(),
        "reason": "pause answered",
        "redrive_planned": True,
    }
    if lease_live:
        values["wake_requested"] = True
    return values


__all__ = ["ANSWERED", "PENDING", "answer_pause", "list_pauses", "pause_in"]
