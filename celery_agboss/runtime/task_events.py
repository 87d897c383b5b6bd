"""Custom task events for Flower: what a delivery that Celery has no word for ended in.

Flower builds a task's state from the events it receives and never reads the result
backend (design: trap 11), so a delivery that ends in ``Ignore`` would look
stuck there. Each such ending sends one custom event; Flower shows its type, minus
``task-``, upper-cased, as the task's state (``task-deferred`` → ``DEFERRED``).

These are Celery events (``task.send_event``), not log records: the structured log
events (``execution.deferred``…) and ``log_event`` are in ``celery_agboss.core.log_events``.
Both carry ids, holders and tokens only: never a business key, an amount or a card
field (design: R17).
"""

from __future__ import annotations

import logging
from typing import Any

from celery_agboss.core.executions import ExecutionState
from celery_agboss.core.log_events import safe_value

logger = logging.getLogger("celery_agboss")

TASK_DEFERRED = "task-deferred"
TASK_RECONCILING = "task-reconciling"
TASK_UNRECONCILED = "task-unreconciled"
TASK_FENCED = "task-fenced"
TASK_PAUSED = "task-paused"
TASK_PARKED = "task-parked"
TASK_WAITING = "task-waiting"
# A terminal execution's stored result, or a run whose calls all replayed.
TASK_REPLAYED = "task-replayed"
# A delivery of another task under an execution's id: dropped, nothing run or returned.
TASK_REFUSED = "task-refused"
# A recorded execution's message ran as a task that is not a PaymentTask: UNMANAGED.
TASK_UNMANAGED = "task-unmanaged"

TASK_EVENTS = frozenset(
    {
        TASK_DEFERRED,
        TASK_RECONCILING,
        TASK_UNRECONCILED,
        TASK_FENCED,
        TASK_PAUSED,
        TASK_PARKED,
        TASK_WAITING,
        TASK_REPLAYED,
        TASK_REFUSED,
        TASK_UNMANAGED,
    }
)


def send_agboss_event(task: Any, type_: str, **fields: Any) -> bool:
    """Send one custom task event for the task's current request; False if it failed.

    Never raises: an event is for people watching, and losing one must not change
    what happens to a payment. ``retry=False`` so a broker outage cannot hold the
    delivery up here.
    """
    if type_ not in TASK_EVENTS:
        raise ValueError(f"unknown celery_agboss task event {type_!r}")
    request = getattr(task, "request", None)
    if request is None or getattr(request, "id", None) is None:
        return False
    if getattr(request, "is_eager", False) or getattr(request, "called_directly", False):
        return False
    safe = {name: safe_value(value) for name, value in fields.items()}
    safe.setdefault("name", getattr(task, "name", None))
    # Flower keeps only the last value of each field: say which event this was.
    safe.setdefault("agboss_event", type_[len("task-") :])
    try:
        task.send_event(type_, retry=False, **safe)
    except Exception:
        logger.warning("could not send the %s event", type_, exc_info=True)
        return False
    return True


def send_task_event(app: Any, type_: str, execution_id: str, **fields: Any) -> bool:
    """A task event about ``execution_id`` sent from outside its task (the sweep, an
    operator command): Flower files it under that task. Never raises."""
    if type_ in TASK_EVENTS:
        fields.setdefault("agboss_event", type_[len("task-") :])
    try:
        with app.events.default_dispatcher() as dispatcher:
            dispatcher.send(type_, uuid=execution_id, **fields)
    except Exception:
        logger.debug("could not send the %s event", type_, exc_info=True)
        return False
    return True


def revoked_fields(state: ExecutionState) -> dict[str, Any]:
    """Celery's ``task-revoked`` fields for an execution the store ended ``state``
    (``CANCELLED`` or ``EXPIRED``), one set wherever it is sent, so Flower reads a cancel
    from a delivery, the sweep or an operator the same way."""
    return {
        "terminated": False,
        "expired": state is ExecutionState.EXPIRED,
        "agboss_state": state.value,
    }


def send_revoked_event(app: Any, execution_id: str, state: ExecutionState) -> bool:
    """An execution ended ``state`` from outside its delivery (the sweep, an operator):
    Celery's ``task-revoked``, so Flower shows it REVOKED, with the store's state. Never
    raises."""
    return send_task_event(app, "task-revoked", execution_id, **revoked_fields(state))


def send_revoked_in_delivery(task: Any) -> None:
    """``task``'s delivery cancelled it: the same ``task-revoked``, for its own request.
    Never raises."""
    try:
        task.send_event("task-revoked", retry=False, **revoked_fields(ExecutionState.CANCELLED))
    except Exception:
        logger.warning("could not send the task-revoked event", exc_info=True)


__all__ = [
    "TASK_DEFERRED",
    "TASK_EVENTS",
    "TASK_FENCED",
    "TASK_PARKED",
    "TASK_PAUSED",
    "TASK_RECONCILING",
    "TASK_REFUSED",
    "TASK_REPLAYED",
    "TASK_UNMANAGED",
    "TASK_UNRECONCILED",
    "TASK_WAITING",
    "revoked_fields",
    "send_agboss_event",
    "send_revoked_event",
    "send_revoked_in_delivery",
    "send_task_event",
]
