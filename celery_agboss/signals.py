"""The Celery signals ``AGBoss(app)`` connects, each bound to that app.

- ``before_task_publish``: every ``PaymentTask`` message is recorded ``REQUESTED``
  (with its ETA, expiry and publish options) before it reaches the broker, so a
  message lost before any worker starts it is still known (trap 9). It fires for
  ``send_task`` too (by name: ``agboss_payment_tasks`` lists names a process knows
  without importing them), and for retries and re-publishes (which refresh the
  message). A publish the store cannot record is refused: the caller gets
  ``PublishRefusedError`` and nothing reaches the broker. A recorded message carries
  the header ``agboss_recorded`` (why it was taken for a ``PaymentTask``).
- ``task_prerun``: a recorded message that reaches a task which is not a
  ``PaymentTask`` (a plain task matching ``agboss_payment_tasks``, an old worker of a
  rolling deploy) ends its execution ``UNMANAGED`` before that task runs, logged once
  with the task's name and why it was recorded; the sweep never re-publishes it.
- ``worker_init`` and ``beat_init``: a worker or beat refuses to start on a wrong
  configuration, saying why once; a worker started by a test inherits the protections
  it switched off (``AGBOSS_SABOTAGE``, refused outside tests), and reads the tenant (a
  store without its deployment id stops it); ``worker_ready`` logs the tenant. What a
  worker says about its store at start is ``celery_agboss.store_check``.
- ``worker_process_init``: a forked child drops the connections it inherited.
- ``worker_shutting_down``: logged; running bodies keep their leases until they
  return (a warm shutdown waits for them; a cold one leaves the lease to expire).
- ``task_revoked``: a revoked execution that never started is cancelled (or
  expired); a running one gets a cancel request.
- ``app.control.revoke`` (and so ``AsyncResult.revoke``) records the revoke in the
  store before broadcasting it: a broadcast reaches only the workers running at that
  moment, while a recorded cancel request is honoured by every later delivery and by
  the sweep (DESIGN §2.2).
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import logging
from collections.abc import Sequence
from typing import Any

from celery import signals as celery_signals
from celery.utils.imports import symbol_by_name
from celery.worker import state as worker_state

from celery_agboss import body_publishes
from celery_agboss.body_publishes import (
    BODY_PUBLISHES_GET_NEW_IDS,
    UNDO_PUBLISHES_COUNTED_IN_THE_DELIVERY,
    body_context,
    derived_task_id,
    publish_position,
)
from celery_agboss.core import sabotage
from celery_agboss.core.executions import ExecutionState
from celery_agboss.core.log_events import (
    EXECUTION_NOT_RECORDED,
    EXECUTION_REVOKED,
    EXECUTION_UNMANAGED,
    WORKER_SHUTTING_DOWN,
    log_event,
)
from celery_agboss.core.store import LeaseRef
from celery_agboss.errors import (
    ConfigurationError,
    ExecutionIdConflictError,
    PublishNotRecorded,
    PublishRefusedError,
    SabotageRefusedError,
    StoreError,
    StoreNotMigratedError,
)
from celery_agboss.messages import message_from_publish
from celery_agboss.runtime import Runtime
from celery_agboss.task import PaymentTask
from celery_agboss.task_events import TASK_UNMANAGED, send_agboss_event

logger = logging.getLogger("celery_agboss")

LINK_IDS_NOT_FIXED = sabotage.register("link-ids-not-fixed")
"""Sabotage (DESIGN §4): an execution's unfrozen links get a new id each time a delivery
sends them, so a duplicate that replays them starts a second execution."""

PUBLISH_WITHOUT_RECORD = sabotage.register("publish-without-record")
"""Sabotage (trap 9): a publish the store could not record goes to the broker anyway, and
a message the broker then loses leaves no trace."""

SHUTDOWN_HANDS_OVER_RUNNING_LEASES = sabotage.register("shutdown-hands-over-running-leases")
"""Sabotage (PS12): a stopping worker releases the leases of the bodies it still runs, so
another worker re-runs a step whose charge is still on the wire here."""

PLAIN_TASK_LEFT_REQUESTED = sabotage.register("plain-task-left-requested")
"""Sabotage (DESIGN §2.1): a recorded message that runs as a plain task leaves its
execution ``REQUESTED``, so the sweep publishes it again and again until it is PARKED:
one charge per run."""

RECORDED_HEADER = "agboss_recorded"
"""The header of a message whose execution was recorded at publish: why the publisher
took the task for a ``PaymentTask`` (``PaymentTask``, or the pattern that matched)."""

PAYMENT_TASK = "PaymentTask"


def _payment_task_reason(agboss: Runtime, name: Any) -> str | None:
    """Why ``name`` is a ``PaymentTask`` here, or None: this app's task is one (looked up
    without finalizing the app), or, for a process that publishes by name without
    importing the task's module, the ``agboss_payment_tasks`` pattern it matches."""
    if not isinstance(name, str):
        return None
    tasks = getattr(agboss.app, "_tasks", None)
    task = tasks.get(name) if tasks is not None else None
    if task is not None:
        return PAYMENT_TASK if isinstance(task, PaymentTask) else None
    return _matched_pattern(agboss, name)


def _matched_pattern(agboss: Runtime, name: str) -> str | None:
    try:
        patterns = agboss.settings.payment_tasks
    except ConfigurationError:
        return None
    return next((p for p in patterns if fnmatch.fnmatchcase(name, p)), None)


def _is_payment_task(agboss: Runtime, name: Any) -> bool:
    return _payment_task_reason(agboss, name) is not None


def connect(agboss: Runtime) -> None:
    """Connect this app's handlers (strong references: they live as long as the app)."""

    def before_task_publish(
        sender: Any = None,
        body: Any = None,
        exchange: Any = None,
        routing_key: Any = None,
        headers: Any = None,
        properties: Any = None,
        **_: Any,
    ) -> None:
        headers = {} if headers is None else headers
        name = headers.get("task", sender)
        reason = _payment_task_reason(agboss, name)
        if reason is None:
            return
        # Kept with the recorded message, so every re-publish says it too.
        headers.setdefault(RECORDED_HEADER, reason)
        if not sabotage.active(LINK_IDS_NOT_FIXED):
            _fix_link_ids(body, str(headers.get("id")))
        message = message_from_publish(
            body=body,
            exchange=exchange,
            routing_key=routing_key,
            headers=headers,
            properties=properties or {},
        )
        if message is None:
            log_event(EXECUTION_NOT_RECORDED, logging.ERROR, task=name, reason="unreadable message")
            raise PublishNotRecorded(
                PublishRefusedError(
                    f"the publish of {name!r} could not be read (Celery's message protocol 2 "
                    "is needed: leave task_protocol at its default), so it was not recorded "
                    "and nothing was published",
                    task=name,
                )
            )
        if sabotage.active(PUBLISH_WITHOUT_RECORD):
            with contextlib.suppress(Exception, StoreError):
                agboss.executions.record_requested(message)
            return
        try:
            agboss.executions.record_requested(message)
        except ExecutionIdConflictError as exc:
            raise PublishNotRecorded(exc) from None
        except (StoreError, ConfigurationError) as exc:
            # A message the broker then lost would leave no trace: publish nothing.
            log_event(
                EXECUTION_NOT_RECORDED,
                logging.ERROR,
                execution=message.execution_id,
                task=name,
                reason=f"{type(exc).__name__} at publish",
            )
            if isinstance(exc, ConfigurationError):
                what_to_do = (
                    f"celery_agboss is not configured in this process ({exc}); fix that "
                    "setting and start the process again, then publish again"
                )
            else:
                what_to_do = (
                    f"it could not be recorded in the store ({type(exc).__name__}: {exc}); "
                    "publish again once the store answers"
                )
            refused = PublishRefusedError(
                f"the publish of {name!r} ({message.execution_id}) was refused and nothing "
                f"was published: {what_to_do}",
                task=name,
                execution_id=message.execution_id,
            )
            refused.__cause__ = exc
            raise PublishNotRecorded(refused) from None

    def worker_init(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is not agboss.app:
            return
        refuse_to_start_unless_configured(agboss, "worker")
        try:
            sabotage.activate_from_environment()
        except SabotageRefusedError as exc:
            raise SystemExit(f"celery_agboss refuses to start this worker: {exc}") from None
        _read_tenant_at_start(agboss)

    def worker_ready(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is agboss.app:
            _log_tenant(agboss)

    def beat_init(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is agboss.app:
            refuse_to_start_unless_configured(agboss, "beat")

    def worker_process_init(**_: Any) -> None:
        agboss.after_fork()

    def worker_shutting_down(
        sender: Any = None, sig: Any = None, how: Any = None, **_: Any
    ) -> None:
        try:
            tracked = len(agboss.renewer.tracked()) if agboss._process is not None else 0
        except Exception:
            tracked = -1
        log_event(WORKER_SHUTTING_DOWN, hostname=sender, signal=sig, how=how, leases=tracked)
        if sabotage.active(SHUTDOWN_HANDS_OVER_RUNNING_LEASES):
            _hand_over_running_leases(agboss)

    def task_prerun(sender: Any = None, task_id: Any = None, task: Any = None, **_: Any) -> None:
        task = task or sender
        if getattr(task, "app", None) is not agboss.app or isinstance(task, PaymentTask):
            return
        if sabotage.active(PLAIN_TASK_LEFT_REQUESTED):
            return
        _end_unmanaged(agboss, task, task_id)

    def task_revoked(
        sender: Any = None,
        request: Any = None,
        terminated: bool = False,
        expired: bool = False,
        **_: Any,
    ) -> None:
        name = getattr(sender, "name", None) or getattr(request, "task_name", None)
        execution_id = getattr(request, "id", None)
        if not execution_id or not _is_payment_task(agboss, name):
            return
        try:
            if expired:
                agboss.executions.move(
                    execution_id, [ExecutionState.REQUESTED], ExecutionState.EXPIRED, "expired"
                )
            else:
                why = "revoked with terminate" if terminated else "revoked"
                agboss.executions.request_cancel(execution_id, why)
        except (Exception, StoreError):
            logger.exception("could not record the revoke of %s", execution_id)

    handlers = {
        celery_signals.before_task_publish: before_task_publish,
        celery_signals.worker_init: worker_init,
        celery_signals.worker_ready: worker_ready,
        celery_signals.beat_init: beat_init,
        celery_signals.worker_process_init: worker_process_init,
        celery_signals.worker_shutting_down: worker_shutting_down,
        celery_signals.task_revoked: task_revoked,
        celery_signals.task_prerun: task_prerun,
    }
    for signal, handler in handlers.items():
        signal.connect(handler, weak=False)
    agboss._signal_handlers = handlers
    _refuse_unrecorded_publishes(agboss)
    install_revoke_recorder(agboss)
    body_publishes.install()


def _end_unmanaged(agboss: Runtime, task: Any, task_id: Any) -> None:
    """A message whose execution was recorded is about to run as ``task``, which is not a
    ``PaymentTask``: it runs once, unprotected, and its execution ends ``UNMANAGED`` now,
    so the sweep never publishes it again. Never raises: the plain task runs regardless."""
    request = getattr(task, "request", None)
    if not task_id or getattr(request, "is_eager", False):
        return
    headers = getattr(request, "headers", None) or {}
    reason = headers.get(RECORDED_HEADER) if isinstance(headers, dict) else None
    reason = reason or getattr(request, RECORDED_HEADER, None)
    if not reason:  # a publisher without the header: this worker's own patterns decide
        reason = _matched_pattern(agboss, str(task.name))
    if not reason:
        return
    why = (
        f"recorded at publish ({reason}), run by a worker where {task.name!r} is not a PaymentTask"
    )
    try:
        record = agboss.executions.move(
            str(task_id), [ExecutionState.REQUESTED], ExecutionState.UNMANAGED, why
        )
    except (Exception, StoreError):
        logger.warning("could not end the execution %s UNMANAGED", task_id, exc_info=True)
        return
    if record is None:
        return  # not recorded, or not waiting for its first run: left as it is
    log_event(
        EXECUTION_UNMANAGED,
        logging.ERROR,
        "runs unprotected as a plain task and is never re-published: make it a "
        "PaymentTask on every worker, or take its name out of agboss_payment_tasks",
        execution=record.id,
        task=task.name,
        pattern=str(reason),
    )
    send_agboss_event(task, TASK_UNMANAGED, agboss_state=ExecutionState.UNMANAGED.value)


def _read_tenant_at_start(agboss: Runtime) -> None:
    """Read the tenant before the pool forks, so every child uses the one read here. A
    store not migrated yet (no deployment id) or that does not answer is asked again by
    the first delivery, which is retried until it does: a worker started before
    ``agboss migrate`` goes on once it ran."""
    try:
        agboss.engine_settings  # noqa: B018 - resolving it reads the tenant
    except StoreNotMigratedError as exc:
        logger.error("celery_agboss: %s. Its payment tasks wait (retried) until then", exc)
    except StoreError as exc:
        logger.warning(
            "celery_agboss could not read the tenant from the store at start (%s: %s); "
            "the first delivery reads it",
            type(exc).__name__,
            exc,
        )


def _log_tenant(agboss: Runtime) -> None:
    """Which tenant this worker's keys start with, and where it came from (docs/keys.md)."""
    engine = agboss._engine_settings
    if engine is None:
        logger.info("celery_agboss tenant: not read yet (the store did not answer at start)")
        return
    origin = "agboss_tenant" if agboss.settings.tenant is not None else "the store's deployment id"
    logger.info("celery_agboss tenant: %s (%s)", engine.tenant, origin)


def refuse_to_start_unless_configured(agboss: Runtime, what: str) -> None:
    """A worker or beat with a wrong configuration does not start; the reason is said
    once, as the process's exit message (Celery swallows Exceptions raised by signal
    handlers; SystemExit stops it)."""
    try:
        agboss.settings  # noqa: B018 - resolving them is the check
    except ConfigurationError as exc:
        raise SystemExit(f"celery_agboss refuses to start this {what}: {exc}") from None


def _hand_over_running_leases(agboss: Runtime) -> None:
    """The sabotage above: release every live lease of this worker's running requests."""
    for request in tuple(worker_state.active_requests):
        found = agboss.store.read_lease(request.id)
        if found is not None and found.live:
            agboss.store.release_lease(LeaseRef(found.scope, found.holder, found.token))


def _fix_link_ids(body: Any, execution_id: str) -> None:
    """Links, errbacks and the chain of an execution go out under ids fixed before its
    first publish, derived from the execution: every delivery that sends them (a
    duplicate replaying, a retry) sends the same executions, never a second charge.
    The signatures are replaced by copies, never changed: the caller's may be reused."""
    if not isinstance(body, (tuple, list)) or len(body) != 3 or not isinstance(body[2], dict):
        return
    embed = body[2]
    for part in ("callbacks", "errbacks", "chain"):
        signatures = embed.get(part)
        if not signatures:
            continue
        embed[part] = [
            _with_fixed_id(sig, derived_task_id(execution_id, f"{part}#{n}"))
            for n, sig in enumerate(signatures, 1)
        ]


def _with_fixed_id(signature: Any, task_id: str) -> Any:
    if not isinstance(signature, dict):
        return signature
    options = dict(signature.get("options") or {})
    if options.get("task_id"):
        return signature  # frozen already (a chain's own ids, or the caller's choice)
    options["task_id"] = task_id
    return {**signature, "options": options}


def _published_from_a_body(agboss: Runtime, name: Any) -> str | None:
    """The stable id of a PaymentTask published from inside a PaymentTask's delivery
    (``ship.delay(order)`` in ``charge_order``'s body), or None: outside a delivery,
    or a task that is not a PaymentTask. The n-th publish of one task name in a
    delivery gets the same id on every re-run (DESIGN §4)."""
    if not isinstance(name, str):
        return None
    ctx = body_context()
    if ctx is None or not _is_payment_task(agboss, name):
        return None
    return derived_task_id(ctx.execution_id, publish_position(ctx, name))


def _refuse_unrecorded_publishes(agboss: Runtime) -> None:
    """Make ``app.send_task`` (which ``apply_async``, ``delay``, canvas and ``retry`` all
    go through) raise the error ``before_task_publish`` refused a publish with, as an
    ordinary exception for the caller; nothing reached the broker. A PaymentTask
    published from a PaymentTask's body without a ``task_id`` gets a stable one."""
    app = agboss.app
    original = app.send_task
    if getattr(original, "_agboss_refuses_unrecorded", False):
        return

    @functools.wraps(original)
    def send_task(name: Any, *args: Any, **kwargs: Any) -> Any:
        if (
            not args[3:4]
            and kwargs.get("task_id") is None
            and not sabotage.active(BODY_PUBLISHES_GET_NEW_IDS)
        ):
            stable = _published_from_a_body(agboss, name)
            if stable is not None:
                kwargs["task_id"] = stable
        try:
            return original(name, *args, **kwargs)
        except PublishNotRecorded as refused:
            raise refused.error from refused.error.__cause__

    send_task._agboss_refuses_unrecorded = True  # type: ignore[attr-defined]
    app.send_task = send_task


def record_revoke(agboss: Runtime, task_ids: Sequence[str], *, terminated: bool) -> int:
    """Record a revoke as a cancel request of each known execution: a ``REQUESTED`` or
    waiting one is ``CANCELLED`` at once (so a lost message re-published later never
    runs); a running one is cancelled by the sweep once nothing is pending. Never raises."""
    recorded = 0
    why = "revoked with terminate" if terminated else "revoked"
    for task_id in task_ids:
        try:
            record = agboss.executions.request_cancel(str(task_id), why)
        except (Exception, StoreError):
            logger.warning("could not record the revoke of %s", task_id, exc_info=True)
            continue
        if record is not None:
            recorded += 1
            log_event(
                EXECUTION_REVOKED,
                execution=record.id,
                state=record.state.value,
                terminated=terminated,
            )
    return recorded


def install_revoke_recorder(agboss: Runtime) -> None:
    """Make ``app.control.revoke`` (and so ``AsyncResult.revoke``) record the revoke in the
    store before broadcasting it: workers that are not running (or not born yet) never
    hear a broadcast, but every worker reads the store."""
    app = agboss.app
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
            record_revoke(agboss, _ids(task_id), terminated=bool(terminate))
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
            record_revoke(agboss, _ids(task_id), terminated=bool(terminate))
            return super().revoke(task_id, destination, terminate, *args, **kwargs)

    app.control_cls = RecordingControl


def _ids(task_id: Any) -> list[str]:
    if isinstance(task_id, (list, tuple, set, frozenset)):
        return [str(item) for item in task_id]
    return [str(task_id)]


def disconnect(agboss: Runtime) -> None:
    """Disconnect this app's handlers (tests that build many apps in one process)."""
    for signal, handler in getattr(agboss, "_signal_handlers", {}).items():
        signal.disconnect(handler)
    agboss._signal_handlers = {}


__all__ = [
    "BODY_PUBLISHES_GET_NEW_IDS",
    "EXECUTION_REVOKED",
    "PLAIN_TASK_LEFT_REQUESTED",
    "PUBLISH_WITHOUT_RECORD",
    "RECORDED_HEADER",
    "UNDO_PUBLISHES_COUNTED_IN_THE_DELIVERY",
    "connect",
    "disconnect",
    "install_revoke_recorder",
    "record_revoke",
]
