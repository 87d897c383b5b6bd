"""What operators see: custom task events (Flower) and structured log events.

Flower builds a task's state from the events it receives and never reads the result
backend (DESIGN §2.3 trap 11), so a delivery that ends in ``Ignore`` would look
stuck there. Each such ending sends one custom event; Flower shows its type, minus
``task-``, upper-cased, as the task's state (``task-deferred`` → ``DEFERRED``).

Log events have stable names (``execution.deferred``…) and carry ids, holders and
tokens only: never a business key, an amount or a card field (R17).
"""

from __future__ import annotations

import logging
from typing import Any

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
    }
)

# Structured log events: the names are part of the public surface (dashboards grep them).
EXECUTION_STARTED = "execution.started"
EXECUTION_DEFERRED = "execution.deferred"
EXECUTION_TAKEN_OVER = "execution.taken-over"
EXECUTION_FENCED = "execution.fenced"
EXECUTION_PARKED = "execution.parked"
EXECUTION_WAITING = "execution.waiting"
EXECUTION_WAITING_OPERATOR = "execution.waiting-operator"
EXECUTION_COMPLETED = "execution.completed"
EXECUTION_FAILED = "execution.failed"
EXECUTION_REPLAYED = "execution.replayed"
EXECUTION_REPUBLISHED = "execution.republished"
EXECUTION_RELEASE_FAILED = "execution.release-failed"
EXECUTION_STORE_FAILED = "execution.store-failed"
EXECUTION_NOT_RECORDED = "execution.not-recorded"
EXECUTION_NOT_RECORDED_AT_PUBLISH = "execution.not-recorded-at-publish"
EXECUTION_REFUSED = "execution.refused"  # another task's execution id
EXECUTION_CANCELLING = "execution.cancelling"  # a delivery reconciles before cancelling
EXECUTION_CANCELLED = "execution.cancelled"  # by a delivery or by the sweep
STORE_OPENED = "store.opened"
WORKER_SHUTTING_DOWN = "worker.shutting-down"

_SAFE_TYPES = (str, int, float, bool, type(None))


def _safe(value: Any) -> Any:
    """Events travel as JSON: anything else becomes its type name, never its repr
    (a repr could carry an amount or a card number)."""
    if isinstance(value, _SAFE_TYPES):
        return value
    if isinstance(value, (list, tuple)):
        return [_safe(item) for item in value]
    return type(value).__name__


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
    safe = {name: _safe(value) for name, value in fields.items()}
    safe.setdefault("name", getattr(task, "name", None))
    # Flower keeps only the last value of each field: say which event this was.
    safe.setdefault("agboss_event", type_[len("task-"):])
    try:
        task.send_event(type_, retry=False, **safe)
    except Exception:
        logger.warning("could not send the %s event", type_, exc_info=True)
        return False
    return True


def log_event(
    event: str, level: int = logging.INFO, *, exc_info: bool = False, **fields: Any
) -> None:
    """One structured log line: ``<event> key=value …`` with the fields also in ``extra``
    (``agboss_event``, ``agboss_fields``) for JSON formatters."""
    safe = {name: _safe(value) for name, value in fields.items()}
    text = " ".join(f"{name}={value}" for name, value in sorted(safe.items()))
    logger.log(
        level,
        "%s %s",
        event,
        text,
        exc_info=exc_info,
        extra={"agboss_event": event, "agboss_fields": safe},
    )


__all__ = [
    "EXECUTION_CANCELLED",
    "EXECUTION_CANCELLING",
    "EXECUTION_COMPLETED",
    "EXECUTION_DEFERRED",
    "EXECUTION_FAILED",
    "EXECUTION_FENCED",
    "EXECUTION_NOT_RECORDED",
    "EXECUTION_NOT_RECORDED_AT_PUBLISH",
    "EXECUTION_PARKED",
    "EXECUTION_REFUSED",
    "EXECUTION_RELEASE_FAILED",
    "EXECUTION_REPLAYED",
    "EXECUTION_REPUBLISHED",
    "EXECUTION_STARTED",
    "EXECUTION_STORE_FAILED",
    "EXECUTION_TAKEN_OVER",
    "EXECUTION_WAITING",
    "EXECUTION_WAITING_OPERATOR",
    "STORE_OPENED",
    "TASK_DEFERRED",
    "TASK_EVENTS",
    "TASK_FENCED",
    "TASK_PARKED",
    "TASK_PAUSED",
    "TASK_RECONCILING",
    "TASK_REFUSED",
    "TASK_REPLAYED",
    "TASK_UNRECONCILED",
    "TASK_WAITING",
    "WORKER_SHUTTING_DOWN",
    "log_event",
    "send_agboss_event",
]
