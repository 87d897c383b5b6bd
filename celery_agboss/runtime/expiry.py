"""A message past its ``expires``: dropped only when its execution never started
(design: expires bounds the start).

Celery's own expiry check adds the task id to the worker's set of revoked ids, which
the worker keeps for hours (and hands to new workers through mingle). For a payment
that is the wrong memory: the same execution's later messages (its retries, a woken
release, the sweep's re-drive) would all be dropped as revoked, and each drop would
record a cancel nobody asked for. So the store decides instead, here, and the worker's
set is left alone.
"""

from __future__ import annotations

import logging

from celery_agboss.core.executions import ExecutionState
from celery_agboss.core.log_events import EXECUTION_EXPIRED, log_event
from celery_agboss.errors import StoreError
from celery_agboss.runtime.app_runtime import Runtime

logger = logging.getLogger("celery_agboss")

_NOT_TO_RUN = frozenset({ExecutionState.EXPIRED, ExecutionState.CANCELLED})


def drop_expired_message(runtime: Runtime, execution_id: str, task_name: str | None) -> bool:
    """Whether a message past its ``expires`` is dropped: yes when its execution never
    started (made ``EXPIRED`` now, by compare-and-set, if still ``REQUESTED``), is
    already expired or cancelled, or is unknown to the store; no when it started, since
    a started execution may have charged and must finish (the delivery continues it).
    When the store fails the message is dropped as Celery would drop it, and the sweep
    decides later: it expires a ``REQUESTED`` execution and re-drives a started one."""
    executions = runtime.executions
    try:
        moved = executions.move(
            execution_id, [ExecutionState.REQUESTED], ExecutionState.EXPIRED, "expired"
        )
        if moved is not None:
            log_event(EXECUTION_EXPIRED, execution_id=execution_id, task=task_name)
            return True
        record = executions.read_execution(execution_id)
    except (Exception, StoreError):
        logger.warning(
            "could not read the execution %s of a message past its expires; dropped, "
            "the sweep expires it or re-drives it",
            execution_id,
            exc_info=True,
        )
        return True
    return record is None or record.state in _NOT_TO_RUN


__all__ = ["drop_expired_message"]
