"""A revoke recorded in the store, not only broadcast.

A broadcast reaches only the workers running at that moment, while a recorded cancel
request is honoured by every later delivery and by the sweep: ``task_revoked`` and
``app.control.revoke`` (and so ``AsyncResult.revoke``) both record it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from celery.utils.imports import symbol_by_name

from celery_agboss.core.log_events import EXECUTION_REVOKED, log_event
from celery_agboss.errors import StoreError
from celery_agboss.runtime.app_runtime import Runtime
from celery_agboss.runtime.expiry import drop_expired_message
from celery_agboss.signals.publish import is_payment_task

logger = logging.getLogger("celery_agboss")


def task_revoked(
    runtime: Runtime,
    sender: Any = None,
    request: Any = None,
    terminated: bool = False,
    expired: bool = False,
    **_: Any,
) -> None:
    """A revoked execution that never started is cancelled (or expired); a running one
    gets a cancel request."""
    name = getattr(sender, "name", None) or getattr(request, "task_name", None)
    execution_id = getattr(request, "id", None)
    if not execution_id or not is_payment_task(runtime, name):
        return
    if not expired:  # a revoke is a cancel request, decided in one place
        record_revoke(runtime, [execution_id], terminated=terminated)
        return
    # PaymentRequest already asked the store; a worker with another Request class did not.
    drop_expired_message(runtime, execution_id, name)


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


def install_revoke_recorder(runtime: Runtime) -> None:
    """Make ``app.control.revoke`` (and so ``AsyncResult.revoke``) record the revoke in the
    store before broadcasting it: workers that are not running (or not born yet) never
    hear a broadcast, but every worker reads the store."""
    app = runtime.app
    if "control" in vars(app):  # already made: wrap this instance's method
        control = app.control
        if getattr(control.revoke, "_agboss_records_revokes", False):
            return
        original = control.revoke

        def revoke(
            task_id: Any,
            destination: Any = None,
            terminate: bool = False,
            *args: Any,
            **kwargs: Any,
        ) -> Any:
            record_revoke(runtime, _ids(task_id), terminated=bool(terminate))
            return original(task_id, destination, terminate, *args, **kwargs)

        revoke._agboss_records_revokes = True  # type: ignore[attr-defined]
        control.revoke = revoke
        return
    base = symbol_by_name(app.control_cls)
    if getattr(base, "_agboss_records_revokes", False):
        return

    class RecordingControl(base):  # type: ignore[misc, valid-type]
        """Celery's control, recording revokes in the celery_agboss store first."""

        _agboss_records_revokes = True

        def revoke(
            self,
            task_id: Any,
            destination: Any = None,
            terminate: bool = False,
            *args: Any,
            **kwargs: Any,
        ) -> Any:
            record_revoke(runtime, _ids(task_id), terminated=bool(terminate))
            return super().revoke(task_id, destination, terminate, *args, **kwargs)

    app.control_cls = RecordingControl


def _ids(task_id: Any) -> list[str]:
    if isinstance(task_id, (list, tuple, set, frozenset)):
        return [str(item) for item in task_id]
    return [str(task_id)]
