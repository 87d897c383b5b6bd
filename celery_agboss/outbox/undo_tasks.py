"""Undos declared as Celery signatures: ``self.undo_with(refund.s(payment_id))``.

The undo is a task published once, not code run in the delivery: a signature carries
routing (queue, priority, countdown) meant for a worker, and a ``PaymentTask`` body run
in-process inside another delivery would be two executions on two leases at once. So
running the undo means enqueueing its task through the outbox in a fenced effect keyed
``<step key>:compensation`` — the row commits with the effect's record, and its task
id is derived from that key — then publishing it; the done mark follows, as for every
undo. Exactly once, step by step:

- a crash before the effect committed leaves nothing: the next delivery enqueues it;
- a crash after the commit replays the effect (the same task id, nothing enqueued
  again) and publishes what the crash left unpublished (the sweep would, after its
  grace); a publish whose "published" mark was lost sends one id twice, which a
  ``PaymentTask`` consumer runs once (a plain task must deduplicate on its id itself);
- a holder past its lease commits no effect, so it publishes nothing (design: P5).

The task carries the parent's execution id in a header (``UNDO_OF_HEADER``): the parent's
undo counts as run once the task is published, so a failure of the task's body waits for
an operator, as an undo function that raises does, instead of ending ``FAILED`` unseen.
The step itself reads undone (a later click on the charge is told so) only once the task
completed: it names its declaration (``UNDO_POSITION_HEADER``), and its ``COMPLETED``
marks that undo finished (``delivery.compensating.UndoTaskFinish``).

The consumer's own calls are keyed by its execution, whose id is stable: its refund
is exactly once as well. Celery's layers put the runner here (the outbox is above the
core); ``celery_agboss.task`` imports this module, which installs it.
"""

from __future__ import annotations

import uuid
from typing import Any

from celery.canvas import Signature

from celery_agboss.core import compensation, sabotage
from celery_agboss.core.protections import UNDO_TASK_PUBLISHED_DIRECTLY
from celery_agboss.core.undo_steps import UNDO_OF_HEADER, UNDO_POSITION_HEADER
from celery_agboss.errors import ConfigurationError
from celery_agboss.outbox import publishing as outbox

UNDO_TASK_EFFECT = "agboss.undo-task"
"""The fenced effect (keyed ``<step key>:compensation``) that enqueues an undo's task."""


def undo_task_parts(sig: Signature) -> dict[str, Any]:
    """What a declaration keeps of a signature (``compensation.TASK_PARTS``)."""
    if sig.get("subtask_type"):
        raise ConfigurationError(
            "undo_with() takes the signature of one task, not a canvas (chain, group, "
            "chord): declare its first task and link the rest (link=...)",
            task=str(sig.get("task")),
        )
    if sig.options.get("expires") is not None:
        raise ConfigurationError(
            "undo_with() refuses a signature with expires: an undo must run however late "
            "its message is delivered, or the step it undoes stays unrefunded while the "
            "execution reads undone; drop expires (a countdown or eta is fine)",
            task=str(sig.task),
        )
    return {
        "task": str(sig.task),
        "args": list(sig.args or ()),
        "kwargs": dict(sig.kwargs or {}),
        "options": dict(sig.options or {}),
    }


def publish_undo_task(task: Any, undo: compensation.UndoStep) -> None:
    """Run ``undo``, declared as a signature, in ``task``'s undo context (a PaymentTask
    whose calls default to ``undo.key``)."""
    parts = dict(undo.task or {})
    name, args, kwargs, options = (parts[part] for part in compensation.TASK_PARTS)
    # Declarations stored before undo_with() refused expires: an undo never expires.
    options = {option: value for option, value in options.items() if option != "expires"}
    # Its failure must reach a person (its parent ends once it is published), and its
    # completion finishes its undo: the step reads undone then, not before.
    headers = {**dict(options.get("headers") or {}), UNDO_OF_HEADER: undo.execution_id}
    if undo.position:
        headers[UNDO_POSITION_HEADER] = undo.position
    options["headers"] = headers
    if sabotage.active(UNDO_TASK_PUBLISHED_DIRECTLY):
        fresh = {**options, "task_id": str(uuid.uuid4())}
        task.app.send_task(name, args=args, kwargs=kwargs, add_to_parent=False, **fresh)
        return

    def enqueue(conn: Any) -> str:
        return outbox.enqueue(conn, name, args, kwargs, options=options)

    task_id = str(task._run_fenced_effect(UNDO_TASK_EFFECT, enqueue, business_key=undo.key))
    outbox.publish(task.app, task_id)  # a replayed effect published nothing itself


compensation.run_task_undos_with(publish_undo_task)

__all__ = ["undo_task_parts"]
