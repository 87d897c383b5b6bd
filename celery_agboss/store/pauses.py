"""Answering a pause, listing the pauses that wait for one, and reading what one asks.

An answer is one compare-and-set under the execution row's lock: the pause moves
``PENDING`` → ``ANSWERED`` and its ``PAUSED`` execution → ``WAITING`` (due now, a
planned re-drive) together, or nothing moves and the caller gets ``NotPausedError``.
Two approvers, a return page and a webhook, or an operator and a retrying browser can
answer at once on different processes: the row lock orders them, and the second finds
the pause answered (design: PS11, PS21).

An answer may also come *before* the pause is stored (a 3-D Secure return racing the
task): it is kept once as an ``EARLY`` row, for an execution that exists and is not
terminal, and the pause consumes it when the body reaches it, if that pause accepts
early answers (design: early answers). The answer and the pause's write both lock the
execution row before they read the pause's, so whichever commits second sees the other.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from sqlalchemy import and_, insert, not_, or_, select, update

from celery_agboss.core import sabotage
from celery_agboss.core.executions import (
    TERMINAL_STATES,
    AnsweredPause,
    Audit,
    ExecutionRecord,
    ExecutionState,
)
from celery_agboss.core.log_events import PAUSE_EARLY_ANSWER_DROPPED, log_event
from celery_agboss.core.pauses import PauseRecord
from celery_agboss.core.protections import (
    PAUSE_ANSWER_WITHOUT_COMPARE_AND_SET,
    PAUSE_WRITTEN_OVER_AN_EARLY_ANSWER,
)
from celery_agboss.core.store_protocol import FencedTransaction
from celery_agboss.errors import NotPausedError
from celery_agboss.store.cancels import paused_in_undo_txn, undoing
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
from celery_agboss.store.sealed_columns import opened, sealed
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore
from celery_agboss.store.transactions import SQLTransaction
from celery_agboss.store.unopened import showing_unopened

_e = executions.c
_p = pauses.c

PENDING = "PENDING"
ANSWERED = "ANSWERED"
EARLY = "EARLY"  # answered before the body reached the pause; not consumed yet


def answer_pause(
    store: SQLAlchemyStore, pause_id: str, answer: str, *, audit: Audit | None = None
) -> AnsweredPause:
    """Answer a pending pause of a ``PAUSED`` execution once and move the execution
    to ``WAITING``, due now; the caller re-publishes it. ``NotPausedError`` (nothing
    moved) when the pause was answered already, or its execution no longer waits for it
    (cancelled, ended, waiting for an operator).

    A pause not stored yet is answered early: kept (``EARLY``) for an execution that
    exists and is not terminal, nothing moved, nothing to re-publish; the body's pause
    takes it. ``NotPausedError(found=False)`` when there is no such execution.

    While the delivery that paused still holds the lease (the answer came between its
    pause and its release), the caller's re-publish is refused; the execution is then
    marked to be woken, so that delivery re-publishes it when it lets go."""
    with store.transaction() as tx:
        execution_id = _execution_of(tx, pause_id)
        # The execution row's lock orders this answer against other answers and against
        # the pause's own write, which takes it first too.
        record = read_execution_txn(tx, execution_id, lock=True) if execution_id else None
        row = tx.execute(select(_p.execution_id, _p.status).where(_p.id == pause_id)).first()
        if row is None:
            return AnsweredPause(_answer_early(tx, pause_id, record, answer, audit), early=True)
        if str(row.execution_id) != execution_id:
            # Stored meanwhile, by an execution whose id the pause id did not show (a
            # name with a ':'): its row is the one that orders the answers.
            record = read_execution_txn(tx, str(row.execution_id), lock=True)
        execution_id = str(row.execution_id)
        status = tx.execute(select(_p.status).where(_p.id == pause_id)).scalar()
        if sabotage.active(PAUSE_ANSWER_WITHOUT_COMPARE_AND_SET):
            return AnsweredPause(_answer_unconditionally(tx, pause_id, execution_id, answer))
        if status != PENDING:
            raise NotPausedError(f"the pause {pause_id!r} was already answered", pause_id=pause_id)
        in_undo = record is not None and paused_in_undo_txn(tx, record)
        refusal = _not_waiting(record, execution_id, in_undo)
        if refusal is not None:
            raise NotPausedError(
                f"{refusal}: it no longer waits for the pause {pause_id!r}",
                pause_id=pause_id,
            )
        won = tx.execute(
            update(pauses)
            .where(_p.id == pause_id, _p.status == PENDING)
            .values(
                status=ANSWERED,
                answer=_sealed(tx, pause_id, "answer", answer),
                answered_at_ms=tx.now_expr(),
            )
        ).rowcount
        if won != 1:  # pragma: no cover - the row lock above orders every answer
            raise NotPausedError(f"the pause {pause_id!r} was already answered", pause_id=pause_id)
        live = execution_lease_live(tx, execution_id)
        set_execution_txn(tx, execution_id, **_continue_values(tx, live, in_undo))
        after = require_execution_txn(tx, execution_id)
        audit_change_txn(tx, audit, execution_id, record, after)
        return AnsweredPause(after)


def _execution_of(tx: SQLTransaction, pause_id: str) -> str | None:
    """The pause's execution: its row's, or for a pause not stored yet the part of
    ``pause_id`` before its last ``:`` (a pause that accepts early answers has no ``:``
    in its name)."""
    stored = tx.execute(select(_p.execution_id).where(_p.id == pause_id)).scalar()
    if stored is not None:
        return str(stored)
    execution_id, sep, name = pause_id.rpartition(":")
    return execution_id if sep and execution_id and name else None


def _answer_early(
    tx: SQLTransaction,
    pause_id: str,
    record: ExecutionRecord | None,
    answer: str,
    audit: Audit | None,
) -> ExecutionRecord:
    """Keep an answer that came before its pause, once, for a live execution."""
    if record is None:
        raise NotPausedError(
            f"no pause {pause_id!r}, and no execution it could belong to",
            pause_id=pause_id,
            found=False,
        )
    if record.state in TERMINAL_STATES:
        raise NotPausedError(
            f"execution {record.id} is {record.state.value}: it will not pause for {pause_id!r}",
            pause_id=pause_id,
        )
    tx.execute(
        insert(pauses).values(
            id=pause_id,
            execution_id=record.id,
            name=pause_id[len(record.id) + 1 :],
            status=EARLY,
            payload=None,
            answer=_sealed(tx, pause_id, "answer", answer),
            created_at_ms=tx.now_expr(),
            answered_at_ms=tx.now_expr(),
        )
    )
    audit_change_txn(tx, audit, record.id, record, record)
    return record


def _answer_unconditionally(
    tx: SQLTransaction, pause_id: str, execution_id: str, answer: str
) -> ExecutionRecord:
    """The sabotaged answer: the pause and the execution updated whatever they are."""
    tx.execute(
        update(pauses)
        .where(_p.id == pause_id)
        .values(
            status=ANSWERED,
            answer=_sealed(tx, pause_id, "answer", answer),
            answered_at_ms=tx.now_expr(),
        )
    )
    set_execution_txn(tx, execution_id, terminal_at_ms=None, **_continue_values(tx, False))
    return require_execution_txn(tx, execution_id)


def _sealed(tx: SQLTransaction, pause_id: str, column: str, text: str | None) -> str | None:
    return sealed(tx.connection, pauses.name, column, pause_id, text)


def _opened(tx: SQLTransaction, pause_id: str, column: str, stored: str | None) -> str | None:
    return opened(tx.connection, pauses.name, column, pause_id, stored)


def list_pauses(store: SQLAlchemyStore, limit: int = 100) -> list[tuple[str, str, str]]:
    """``(pause_id, execution_id, status)`` of the pending pauses whose execution
    still waits for them (``PAUSED``, and no cancel requested unless it paused inside an
    undo: the pauses ``answer_pause`` takes), and of the early answers no pause has
    taken yet while their execution may still reach it (not terminal), oldest first."""
    terminal = [state.value for state in TERMINAL_STATES]
    with store.read_transaction() as tx:
        rows = tx.execute(
            select(_p.id, _p.execution_id, _p.status)
            .join(executions, _e.id == _p.execution_id)
            .where(
                or_(
                    and_(
                        _p.status == PENDING,
                        _e.state == ExecutionState.PAUSED.value,
                        or_(not_(_e.cancel_requested), undoing(_e.id)),
                    ),
                    and_(_p.status == EARLY, _e.state.not_in(terminal)),
                )
            )
            .order_by(_p.created_at_ms, _p.id)
            .limit(limit)
        ).all()
        return [(str(r.id), str(r.execution_id), str(r.status)) for r in rows]


def read_pauses(
    store: SQLAlchemyStore,
    *,
    pause_id: str | None = None,
    execution_id: str | None = None,
    shown_unopened: bool = False,
) -> list[PauseRecord]:
    """The pause ``pause_id``, or every pause of ``execution_id``, oldest first: what
    each asks and its answer, opened (an approver must see what a pause asks, so a value
    no key opens raises). ``shown_unopened``: for a page about the execution
    (``agboss show``), such a value reads as ``store.unopened`` shows it."""
    if (pause_id is None) == (execution_id is None):
        raise TypeError("read_pauses takes one of pause_id or execution_id")
    chosen = _p.id == pause_id if pause_id is not None else _p.execution_id == execution_id
    with store.read_transaction() as tx, contextlib.ExitStack() as showing:
        if shown_unopened:
            showing.enter_context(showing_unopened(tx.connection))
        rows = tx.execute(select(pauses).where(chosen).order_by(_p.created_at_ms, _p.id)).all()
        return [
            PauseRecord(
                pause_id=str(r.id),
                execution_id=str(r.execution_id),
                name=str(r.name),
                status=str(r.status),
                payload=_opened(tx, r.id, "payload", r.payload),
                answer=_opened(tx, r.id, "answer", r.answer),
                created_at_ms=int(r.created_at_ms),
                answered_at_ms=None if r.answered_at_ms is None else int(r.answered_at_ms),
            )
            for r in rows
        ]


def pause_in(
    tx: FencedTransaction, name: str, payload: str | None, *, accept_early: bool = False
) -> tuple[bool, str | None]:
    """The pause ``<execution id>:<name>``: ``(True, answer)`` once answered, or answered
    early and ``accept_early`` (the early answer is consumed here, by compare-and-set);
    else it is recorded PENDING, the execution ``PAUSED``, and ``(False, None)``."""
    t, execution_id = sql(tx), tx.lease.scope
    pause_id = f"{execution_id}:{name}"
    if not sabotage.active(PAUSE_WRITTEN_OVER_AN_EARLY_ANSWER):
        read_execution_txn(t, execution_id, lock=True)  # after an answer that has it, or before
    row = t.execute(select(_p.status, _p.answer).where(_p.id == pause_id)).first()
    answer = None if row is None else _opened(t, pause_id, "answer", row.answer)
    if row is not None and row.status == ANSWERED:
        return True, answer
    early = row is not None and row.status == EARLY
    if early and sabotage.active(PAUSE_WRITTEN_OVER_AN_EARLY_ANSWER):
        early = False  # the sabotage: the early answer is written over below, unseen
    if early and accept_early:
        taken = t.execute(
            update(pauses)
            .where(_p.id == pause_id, _p.status == EARLY)
            .values(status=ANSWERED, payload=_sealed(t, pause_id, "payload", payload))
        ).rowcount
        if taken == 1:
            return True, answer
    if early:
        # An approval's answerer must see what is asked: an answer that came first is
        # not taken for it. The pause waits for an answer given after it.
        log_event(
            PAUSE_EARLY_ANSWER_DROPPED,
            logging.WARNING,
            "an answer given before this pause is not taken: the pause does not accept "
            "early answers (accept_early=True); it waits for an answer given after it",
            execution_id=execution_id,
            pause=pause_id,
        )
    if row is None:
        t.execute(
            insert(pauses).values(
                id=pause_id,
                execution_id=execution_id,
                name=name,
                status=PENDING,
                payload=_sealed(t, pause_id, "payload", payload),
                created_at_ms=t.now_expr(),
            )
        )
    elif row.status == EARLY:
        t.execute(
            update(pauses)
            .where(_p.id == pause_id, _p.status == EARLY)
            .values(
                status=PENDING,
                payload=_sealed(t, pause_id, "payload", payload),
                answer=None,
                answered_at_ms=None,
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


def _not_waiting(record: ExecutionRecord | None, execution_id: str, in_undo: bool) -> str | None:
    """Why the execution does not wait for an answer any more, or None when it does. A
    cancel request stops the body's pauses, not an undo's (``in_undo``): the undo that
    paused is part of a compensation (the cancel's own, often), which a cancel never
    stops."""
    if record is None:
        return f"execution {execution_id} is gone"
    if record.state is not ExecutionState.PAUSED:
        return f"execution {execution_id} is {record.state.value}"
    if record.cancel_requested and not in_undo:
        return f"a cancel was requested for execution {execution_id}"
    return None


def _continue_values(tx: SQLTransaction, lease_live: bool, in_undo: bool = False) -> dict[str, Any]:
    """The answered execution: ``WAITING`` and due now; its re-publish is the planned end
    of the wait (no recovery). ``wake_requested`` when a delivery still holds the lease.
    Paused inside an undo (``in_undo``), it goes back to ``COMPENSATING`` instead: its
    undos go on, and a cancel still cannot stop them (the sweep re-drives it, as it
    re-drives a ``COMPENSATING`` execution whatever its cancel request)."""
    state = ExecutionState.COMPENSATING if in_undo else ExecutionState.WAITING
    values: dict[str, Any] = {
        "state": state.value,
        "not_before_ms": tx.now_expr(),
        "reason": "pause answered",
        "redrive_planned": True,
    }
    if lease_live:
        values["wake_requested"] = True
    return values


__all__ = ["ANSWERED", "EARLY", "PENDING", "answer_pause", "list_pauses", "pause_in"]
