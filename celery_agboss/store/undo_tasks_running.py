"""Whether an execution's refund still runs in a task of its own: an undo declared as a
Celery signature is published by the execution's undos (its done mark then counts as
run) and refunds from that task, in a message queued maybe for a long while.

``cancel --payments-handled`` says the operator dealt with the payments at the gateway;
accepted while such a task is queued or running, the operator's refund by hand and the
task's would both be made (design: cancel request, operator decisions). Found through
the outbox row the undo's fenced effect wrote (its task id, and the headers naming the
parent and the declaration), and through the task's own execution row, whose stored
options carry the same header: retention deletes a published outbox row after a week
(design: retention), while a task paused, waiting on its retries or queued with a long
eta may refund later still.

A revoke of such a task its publisher did not record (no execution row: a task the
publishing worker knew only by name) would record nothing, and its outbox row would read
queued until retention, refusing every ``--payments-handled`` meanwhile. The revoke
records it instead (``record_revoked_undo_task``), from its outbox row, and ends it as a
recorded one's: waiting for an operator (``undo_steps.undo_task_cancel_verdict``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from sqlalchemy import select

from celery_agboss.core import sabotage
from celery_agboss.core.executions import TERMINAL_STATES, ExecutionMessage, ExecutionState
from celery_agboss.core.protections import (
    PAYMENTS_HANDLED_WHILE_UNDO_TASK_QUEUED,
    REVOKED_UNDO_TASK_NOT_RECORDED,
    UNDO_TASKS_FOUND_BY_OUTBOX_ONLY,
)
from celery_agboss.core.undo_steps import UNDO_OF_HEADER, UndoDeclaration, undo_of_options
from celery_agboss.errors import OperatorRefusedError
from celery_agboss.store import outbox_rows
from celery_agboss.store.execution_rows import insert_requested_txn, undo_declarations_txn
from celery_agboss.store.schema_executions import executions, outbox
from celery_agboss.store.transactions import SQLTransaction

_STOPPED = TERMINAL_STATES | {ExecutionState.WAITING_OPERATOR}
"""A task in one of these will not refund unless a person says so."""
_MAY_REFUND = [state for state in ExecutionState if state not in _STOPPED]


def payment_undo_tasks_running(
    tx: SQLTransaction,
    execution_id: str,
    declarations: Collection[UndoDeclaration],
    payments: Collection[str],
) -> list[str]:
    """The ids of the undo tasks of ``payments`` (steps of ``execution_id``) published and
    not stopped: queued (no execution row yet), or running, waiting, paused. A task is
    known by its task's name, as the payment's declaration names it (the store's
    declarations carry no position): one of an effect's undo of the same name counts too,
    failing closed (the operator waits for it)."""
    names = {str(d.task.get("task")) for d in declarations if d.task and d.step_key in payments}
    if not names:
        return []
    tasks = _published(tx, execution_id, names) | _recorded(tx, execution_id, names)
    if not tasks:
        return []
    e = executions.c
    rows = tx.execute(select(e.id, e.state).where(e.id.in_(sorted(tasks)))).all()
    states = {str(row.id): ExecutionState(str(row.state)) for row in rows}
    return sorted(t for t in tasks if may_refund(states.get(t)))


def may_refund(state: ExecutionState | None) -> bool:
    """The one rule: an undo's task in ``state`` (None: no execution row, so queued) may
    still refund without a person's word."""
    return state is None or state not in _STOPPED


def _published(tx: SQLTransaction, execution_id: str, names: Collection[str]) -> set[str]:
    """The undo tasks of ``execution_id`` its outbox rows name (kept a week once published)."""
    o = outbox.c
    rows = tx.execute(
        select(o.task_id, o.options).where(o.execution_id == execution_id, o.task_name.in_(names))
    ).all()
    return {str(row.task_id) for row in rows if undo_of_options(row.options) == execution_id}


def _recorded(tx: SQLTransaction, execution_id: str, names: Collection[str]) -> set[str]:
    """The undo tasks of ``execution_id`` whose own execution row, not stopped, names it
    (``UNDO_OF_HEADER`` in its stored options): found whatever retention did to the outbox.
    Read by state (indexed), the header's text, then the header itself."""
    if sabotage.active(UNDO_TASKS_FOUND_BY_OUTBOX_ONLY):
        return set()
    e = executions.c
    rows = tx.execute(
        select(e.id, e.options).where(
            e.state.in_([s.value for s in _MAY_REFUND]),
            e.task_name.in_(names),
            e.options.contains(UNDO_OF_HEADER, autoescape=True),
        )
    ).all()
    return {str(row.id) for row in rows if undo_of_options(row.options) == execution_id}


def record_revoked_undo_task(tx: SQLTransaction, task_id: str) -> bool:
    """A revoke of ``task_id``, an id with no execution row: when its outbox row is an
    undo's task (module docstring), its execution is recorded ``REQUESTED`` from that row,
    in the revoke's transaction, for the revoke to end as any queued undo task's. Whether
    it was recorded (False: an id the store knows nothing of, left as it was)."""
    if sabotage.active(REVOKED_UNDO_TASK_NOT_RECORDED):
        return False
    row = outbox_rows.read_txn(tx.connection, task_id)
    if row is None or undo_of_options(row.message.options) is None:
        return False
    m = row.message
    message = ExecutionMessage(task_id, m.task_name, m.args, m.kwargs, m.options)
    insert_requested_txn(tx, message)
    return True


def refuse_while_a_refund_task_runs(
    tx: SQLTransaction,
    execution_id: str,
    payment_steps: Callable[[SQLTransaction, Sequence[UndoDeclaration]], set[str]],
) -> None:
    """Raise ``OperatorRefusedError`` (``wrong-state``) while an undo task of the
    execution's payments (``payment_steps``: ``store.handled_payments``' one rule) may refund."""
    if sabotage.active(PAYMENTS_HANDLED_WHILE_UNDO_TASK_QUEUED):
        return
    declarations = undo_declarations_txn(tx, execution_id)
    payments = payment_steps(tx, declarations)
    running = payment_undo_tasks_running(tx, execution_id, declarations, payments)
    if running:
        raise undo_task_running_refusal(execution_id, running)


def undo_task_running_refusal(execution_id: str, tasks: list[str]) -> OperatorRefusedError:
    """What the operator is told: the tasks, and how to get to a safe confirmation."""
    named = ", ".join(tasks)
    return OperatorRefusedError(
        f"execution {execution_id} has published the refund of a payment to a task of its "
        f"own ({named}) that has not ended: it may refund the charge, so --payments-handled "
        "would let a refund by hand and that task's both be made; nothing was recorded. Wait "
        f"for it (`celery -A proj agboss show {tasks[0]}`), or revoke it and wait until it "
        "waits for an operator, then `cancel --payments-handled` that task too",
        code="wrong-state",
        execution_id=execution_id,
    )


__all__ = [
    "may_refund",
    "payment_undo_tasks_running",
    "record_revoked_undo_task",
    "refuse_while_a_refund_task_runs",
]
