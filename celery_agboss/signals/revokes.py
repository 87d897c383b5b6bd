"""A revoke recorded in the store, not only broadcast.

A broadcast reaches only the workers running at that moment, while a recorded cancel
request is honoured by every later delivery and by the sweep: ``task_revoked`` and
``app.control.revoke`` (and so ``AsyncResult.revoke``) both record it.
"""

from __future__ import annotations

from typing import Any

from celery.utils.imports import symbol_by_name

from celery_agboss.core import sabotage
from celery_agboss.core.protections import REVOKE_BROADCAST_NOT_RECORDED
from celery_agboss.runtime.app_runtime import Runtime
from celery_agboss.runtime.expiry import drop_expired_message, record_revoke
from celery_agboss.signals.payment_tasks import is_payment_task


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


def install_revoke_recorder(runtime: Runtime) -> None:
    """Make every revoke by id this app sends record the revoke in the store before it is
    broadcast: ``app.control.revoke`` (so ``AsyncResult.revoke``, ``GroupResult.revoke``)
    and ``celery -A proj control revoke ID`` all go through ``Control.broadcast``, which
    is wrapped here. Workers that are not running (or not born yet) never hear a
    broadcast, but every worker reads the store. A revoke by stamped headers names no
    execution the store can find: each worker records it when a message it matches
    arrives (``delivery.time_limits.PaymentRequest.revoked``)."""
    app = runtime.app
    if "control" in vars(app):  # already made: wrap this instance's method
        control = app.control
        if getattr(control.broadcast, "_agboss_records_revokes", False):
            return
        original = control.broadcast

        def broadcast(command: Any, arguments: Any = None, *args: Any, **kwargs: Any) -> Any:
            _record_if_revoke(runtime, command, arguments)
            return original(command, arguments, *args, **kwargs)

        broadcast._agboss_records_revokes = True  # type: ignore[attr-defined]
        control.broadcast = broadcast
        return
    base = symbol_by_name(app.control_cls)
    if getattr(base, "_agboss_records_revokes", False):
        return

    class RecordingControl(base):  # type: ignore[misc, valid-type]
        """Celery's control, recording revokes in the celery_agboss store first."""

        _agboss_records_revokes = True

        def broadcast(self, command: Any, arguments: Any = None, *args: Any, **kwargs: Any) -> Any:
            _record_if_revoke(runtime, command, arguments)
            return super().broadcast(command, arguments, *args, **kwargs)

    app.control_cls = RecordingControl


def _record_if_revoke(runtime: Runtime, command: Any, arguments: Any) -> None:
    """A ``revoke`` command's task ids, recorded as cancel requests (design: cancel request)."""
    if command != "revoke" or not isinstance(arguments, dict):
        return
    if sabotage.active(REVOKE_BROADCAST_NOT_RECORDED):
        return
    task_id = arguments.get("task_id")
    if task_id is not None:
        record_revoke(runtime, _ids(task_id), terminated=bool(arguments.get("terminate")))


def _ids(task_id: Any) -> list[str]:
    if isinstance(task_id, (list, tuple, set, frozenset)):
        return [str(item) for item in task_id]
    return [str(task_id)]
