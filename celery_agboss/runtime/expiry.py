"""A message past its ``expires``, or one whose id the worker holds revoked: dropped only
when the store says so (design: expires bounds the start, cancel request).

Celery's own expiry check adds the task id to the worker's set of revoked ids, which
the worker keeps for hours (and hands to new workers through mingle). For a payment
that is the wrong memory: the same execution's later messages (its retries, a woken
release, the sweep's re-drive) would all be dropped as revoked, and each drop would
record a cancel nobody asked for. So the store decides instead, here, and the worker's
set is left alone.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from celery_agboss.core import sabotage
from celery_agboss.core.executions import ExecutionState
from celery_agboss.core.log_events import EXECUTION_EXPIRED, EXECUTION_REVOKED, log_event
from celery_agboss.core.protections import REVOKED_ID_DROPS_LATER_MESSAGES
from celery_agboss.core.undo_steps import revoke_already_handled
from celery_agboss.errors import StoreError
from celery_agboss.runtime.app_runtime import Runtime

logger = logging.getLogger("celery_agboss")

_NOT_TO_RUN = frozenset({ExecutionState.EXPIRED, ExecutionState.CANCELLED})


def drop_expired_message(runtime: Runtime, execution_id: str, task_name: str | None) -> bool:
    """Whether a message past its ``expires`` (by this worker's clock) is dropped: yes
    when the store ends its execution ``EXPIRED`` now, by the sweep's own rule on the
    database's clock (never started, no live lease, nothing pending, past ``expires``
    there), or it is already expired or cancelled, or unknown to the store; no
    otherwise: a started execution may have charged and must finish, and a worker whose
    clock runs ahead must not expire a payment the database says still has time.
    When the store fails the message is dropped as Celery would drop it, and the sweep
    decides later: it expires a ``REQUESTED`` execution and re-drives a started one."""
    executions = runtime.executions
    try:
        moved = executions.expire_if_due(execution_id)
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


def drop_revoked_message(runtime: Runtime, execution_id: str) -> bool:
    """Whether a message whose id (or stamp) the worker holds revoked is dropped
    (design: cancel request). The revoke is recorded as a cancel request first
    (``record_revoke``); then the message is dropped only when its
    execution is cancelled, expired or unknown. Any other is delivered, and the delivery
    follows the cancel: a running or compensating one reconciles and runs its undos
    (the refund a revoked order owes), a finished one replays. The worker keeps a
    revoked id for hours (and mingle shares it), so dropping every later message of a
    revoked execution would strand its undo. An undo's task whose cancel an operator
    cleared to run it (``revoke_already_handled``) is not recorded again: that would
    undo the redrive. A store that fails: dropped, as Celery would, and the sweep
    re-drives it later."""
    if sabotage.active(REVOKED_ID_DROPS_LATER_MESSAGES):
        return True
    try:
        record = runtime.executions.read_execution(execution_id)
        if record is None or not revoke_already_handled(
            record.cancel_requested, record.cancel_reason
        ):
            record_revoke(runtime, [execution_id], terminated=False)
            record = runtime.executions.read_execution(execution_id)
    except (Exception, StoreError):
        logger.warning(
            "could not read the execution %s of a revoked message; dropped, the sweep re-drives it",
            execution_id,
            exc_info=True,
        )
        return True
    return record is None or record.state in _NOT_TO_RUN


def record_revoke(runtime: Runtime, task_ids: Sequence[str], *, terminated: bool) -> int:
    """Record a revoke as a cancel request of each known execution: a ``REQUESTED`` or
    waiting one is ``CANCELLED`` at once (so a lost message re-published later never
    runs); a running one is cancelled by the sweep once nothing is pending. Never raises."""
    recorded = 0
    why = "revoked with terminate" if terminated else "revoked"
    for task_id in task_ids:
        try:
            record = runtime.executions.request_cancel(str(task_id), why)
        except (Exception, StoreError):
            logger.warning("could not record the revoke of %s", task_id, exc_info=True)
            continue
        if record is not None:
            recorded += 1
            log_event(
                EXECUTION_REVOKED,
                execution_id=record.id,
                state=record.state.value,
                terminated=terminated,
            )
    return recorded


__all__ = ["drop_expired_message", "drop_revoked_message", "record_revoke"]
