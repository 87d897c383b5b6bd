"""Whether an execution's refund still runs in a task of its own: an undo declared as a
Celery signature is published by the execution's undos (its done mark then counts as
run) and refunds from that task, in a message queued maybe for a long while.

``cancel --payments-handled`` says the operator dealt with the payments at the gateway;
accepted while such a task is queued or running, the operator's refund by hand and the
task's would both be made (design: cancel request, operator decisions). Found through
the outbox row the undo's fenced effect wrote (its task id, and the headers naming the
parent and the declaration), and the task's own execution row.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from sqlalchemy import select

from celery_agboss.core import sabotage
from celery_agboss.core.executions import TERMINAL_STATES, ExecutionState
from celery_agboss.core.protections import PAYMENTS_HANDLED_WHILE_UNDO_TASK_QUEUED
from celery_agboss.core.undo_steps import UndoDeclaration, undo_of_options
from celery_agboss.errors import OperatorRefusedError
from celery_agboss.store.execution_rows import undo_declarations_txn
from celery_agboss.store.schema_executions import executions, outbox
from celery_agboss.store.transactions import SQLTransaction

_STOPPED = TERMINAL_STATES | {ExecutionState.WAITING_OPERATOR}
"""A task in one of these will not refund unless a person says so."""


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
    o, e = outbox.c, executions.c
    rows = tx.execute(
        select(o.task_id, o.options).where(o.execution_id == execution_id, o.task_name.in_(names))
    ).all()
    tasks = [str(row.task_id) for row in rows if undo_of_options(row.options) == execution_id]
    if not tasks:
        return []
    rows = tx.execute(select(e.id, e.state).where(e.id.in_(tasks))).all()
    states = {str(row.id): str(row.state) for row in rows}
    return sorted(t for t in tasks if t not in states or ExecutionState(states[t]) not in _STOPPED)


def refuse_while_a_refund_task_runs(
    tx: SQLTransaction,
    execution_id: str,
    payment_steps: Callable[[SQLTransaction, Sequence[UndoDeclaration]], set[str]],
) -> None:
    """Raise ``OperatorRefusedError`` (``wrong-state``) while an undo task of the
    execution's payments (``payment_steps``: ``store.cancels``' one rule) may refund."""
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


__all__ = ["payment_undo_tasks_running", "refuse_while_a_refund_task_runs"]
