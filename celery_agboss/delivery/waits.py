"""Long waits go through the store, not the broker (DESIGN §2.3 traps 1 and 13).

A message that waits in Redis longer than the shortest visibility timeout is handed
out again while the first copy still waits; RabbitMQ closes a channel whose message
stays unacked past its consumer timeout. So a ``retry()`` whose countdown is longer
than half the visibility timeout publishes nothing: the execution waits ``WAITING``
with ``not_before`` in the store, and the sweep re-publishes it then.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

from celery_agboss import messages
from celery_agboss.core.executions import ExecutionMessage
from celery_agboss.errors import LongWaitRequested, RetryNotPublished
from celery_agboss.messages import dumps, loads, message_from_request

# How many of a message's ``retries`` are celery_agboss's own (an unknown outcome's, a
# store outage's), not the application's: they never use the application's budget.
OWN_RETRIES_HEADER = messages.OWN_RETRIES_HEADER

PACKAGE_RETRY_BUDGET = 5
"""The package's own broker retries in a row; past them the stored ``WAITING`` and the
sweep (which spaces its re-drives, and starts the count again) continue the execution."""

UNBOUNDED_RETRIES = 2**62
"""``max_retries`` given to Celery for a retry whose budget was already checked here."""


def own_retries(request: Any) -> int:
    headers = getattr(request, "headers", None) or {}
    try:
        return max(0, int(headers.get(OWN_RETRIES_HEADER, 0) or 0))
    except (TypeError, ValueError):
        return 0


def application_retries(request: Any) -> int:
    """The retries of this execution the application asked for (``self.retry()``,
    ``autoretry_for``): Celery's count less the package's own."""
    return max(0, int(getattr(request, "retries", 0) or 0) - own_retries(request))


def seconds_until(when: Any) -> float:
    """A countdown in seconds, or an ETA (datetime or ISO text), as seconds from now."""
    if when is None:
        return 0.0
    if isinstance(when, str):
        try:
            when = datetime.fromisoformat(when)
        except ValueError:
            return 0.0
    if isinstance(when, datetime):
        eta: datetime = when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)
        left: float = (eta - datetime.now(timezone.utc)).total_seconds()
        return max(0.0, left)
    try:
        seconds = float(when)
    except (TypeError, ValueError):
        return 0.0
    return max(0.0, seconds)


def message_after_wait(
    task_name: str, request: Any, wait: LongWaitRequested | RetryNotPublished
) -> ExecutionMessage:
    """The message the sweep publishes after the wait: what Celery's retry would have
    sent (new arguments if given, retries + 1), without an ETA (the store holds it)."""
    message = message_from_request(task_name, request)
    options = loads(message.options)
    options["retries"] = int(getattr(request, "retries", 0) or 0) + 1
    return replace(
        message,
        args=message.args if wait.args_after is None else dumps(list(wait.args_after)),
        kwargs=message.kwargs if wait.kwargs_after is None else dumps(dict(wait.kwargs_after)),
        options=dumps(options),
        eta_ms=None,
    )
