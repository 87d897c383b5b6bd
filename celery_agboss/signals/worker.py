"""What a worker (or beat) process does with this app: refuse to start on a wrong
configuration, read the tenant, drop inherited connections after a fork, log its
shutdown, and end ``UNMANAGED`` a recorded message that runs as a plain task.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.worker import state as worker_state

from celery_agboss.core import sabotage
from celery_agboss.core.executions import ExecutionState
from celery_agboss.core.log_events import EXECUTION_UNMANAGED, WORKER_SHUTTING_DOWN, log_event
from celery_agboss.core.protections import (
    PLAIN_TASK_LEFT_REQUESTED,
    SHUTDOWN_HANDS_OVER_RUNNING_LEASES,
)
from celery_agboss.core.store_protocol import LeaseRef
from celery_agboss.errors import (
    ConfigurationError,
    SabotageRefusedError,
    StoreError,
    StoreNotMigratedError,
)
from celery_agboss.runtime.app_runtime import Runtime
from celery_agboss.runtime.task_events import TASK_UNMANAGED, send_agboss_event
from celery_agboss.signals.payment_tasks import matched_pattern
from celery_agboss.signals.publish import RECORDED_HEADER
from celery_agboss.task import PaymentTask

logger = logging.getLogger("celery_agboss")


def worker_init(runtime: Runtime, sender: Any = None, **_: Any) -> None:
    """Refuse to start on a wrong configuration or a refused sabotage; read the tenant."""
    if getattr(sender, "app", None) is not runtime.app:
        return
    refuse_to_start_unless_configured(runtime, "worker")
    try:
        sabotage.activate_from_environment()
    except SabotageRefusedError as exc:
        raise SystemExit(f"celery_agboss refuses to start this worker: {exc}") from None
    _read_tenant_at_start(runtime)
    _refuse_a_green_pool_on_sqlite(runtime, getattr(sender, "pool_cls", None))


def _refuse_a_green_pool_on_sqlite(runtime: Runtime, pool: Any) -> None:
    """SQLite waits for its write lock inside its C code, which no greenlet switch
    interrupts: under gevent or eventlet one waiting delivery freezes the whole worker
    for up to the busy timeout (30 s), its lease renewals with it, and the executions it
    holds are taken over again and again until PARKED. PostgreSQL's driver yields."""
    name = pool if isinstance(pool, str) else getattr(pool, "__module__", "")
    green = getattr(pool, "is_green", False) is True or any(
        kind in str(name) for kind in ("gevent", "eventlet")
    )
    if not green:
        return
    try:
        dialect = runtime.store.dialect_name
    except (Exception, StoreError):
        return  # the store's trouble is said by the first delivery
    if dialect == "sqlite":
        raise SystemExit(
            "celery_agboss refuses to start this worker: a gevent or eventlet pool with the "
            "SQLite store freezes the whole worker while one delivery waits for SQLite's "
            "write lock, and its leases lapse. Use -P prefork or -P threads with SQLite, "
            "or PostgreSQL (agboss_database_url) with -P gevent"
        )


def worker_ready(runtime: Runtime, sender: Any = None, **_: Any) -> None:
    """Log the tenant this worker's keys start with, and any retention too short."""
    if getattr(sender, "app", None) is runtime.app:
        _log_tenant(runtime)
        warning = runtime.settings.retention_warning()
        if warning is not None:
            logger.warning("celery_agboss: %s", warning)


def beat_init(runtime: Runtime, sender: Any = None, **_: Any) -> None:
    """Refuse to start beat on a wrong configuration."""
    if getattr(sender, "app", None) is runtime.app:
        refuse_to_start_unless_configured(runtime, "beat")


def worker_process_init(runtime: Runtime, **_: Any) -> None:
    """A forked child drops the connections it inherited."""
    runtime.after_fork()


def worker_shutting_down(
    runtime: Runtime, sender: Any = None, sig: Any = None, how: Any = None, **_: Any
) -> None:
    """Logged; running bodies keep their leases until they return."""
    try:
        tracked = len(runtime.renewer.tracked()) if runtime._process is not None else 0
    except Exception:
        tracked = -1
    log_event(WORKER_SHUTTING_DOWN, hostname=sender, signal=sig, how=how, leases=tracked)
    if sabotage.active(SHUTDOWN_HANDS_OVER_RUNNING_LEASES):
        _hand_over_running_leases(runtime)


def task_prerun(
    runtime: Runtime, sender: Any = None, task_id: Any = None, task: Any = None, **_: Any
) -> None:
    """A recorded message about to run as a task that is not a PaymentTask ends UNMANAGED."""
    task = task or sender
    if getattr(task, "app", None) is not runtime.app or isinstance(task, PaymentTask):
        return
    if sabotage.active(PLAIN_TASK_LEFT_REQUESTED):
        return
    _end_unmanaged(runtime, task, task_id)


def _end_unmanaged(runtime: Runtime, task: Any, task_id: Any) -> None:
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
        reason = matched_pattern(runtime, str(task.name))
    if not reason:
        return
    why = (
        f"recorded at publish ({reason}), run by a worker where {task.name!r} is not a PaymentTask"
    )
    try:
        record = runtime.executions.move(
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
        execution_id=record.id,
        task=task.name,
        pattern=str(reason),
    )
    send_agboss_event(task, TASK_UNMANAGED, agboss_state=ExecutionState.UNMANAGED.value)


def _read_tenant_at_start(runtime: Runtime) -> None:
    """Read the tenant before the pool forks, so every child uses the one read here. A
    store not migrated yet (no deployment id) or that does not answer is asked again by
    the first delivery, which is retried until it does: a worker started before
    ``agboss migrate`` goes on once it ran."""
    try:
        runtime.engine_settings  # noqa: B018 - resolving it reads the tenant
    except StoreNotMigratedError as exc:
        logger.error("celery_agboss: %s. Its payment tasks wait (retried) until then", exc)
    except StoreError as exc:
        logger.warning(
            "celery_agboss could not read the tenant from the store at start (%s: %s); "
            "the first delivery reads it",
            type(exc).__name__,
            exc,
        )


def _log_tenant(runtime: Runtime) -> None:
    """Which tenant this worker's keys start with, and where it came from (docs/keys.md)."""
    engine = runtime._engine_settings
    if engine is None:
        logger.info("celery_agboss tenant: not read yet (the store did not answer at start)")
        return
    origin = "agboss_tenant" if runtime.settings.tenant is not None else "the store's deployment id"
    logger.info("celery_agboss tenant: %s (%s)", engine.tenant, origin)


def refuse_to_start_unless_configured(runtime: Runtime, what: str) -> None:
    """A worker or beat with a wrong configuration does not start; the reason is said
    once, as the process's exit message (Celery swallows Exceptions raised by signal
    handlers; SystemExit stops it)."""
    try:
        runtime.settings  # noqa: B018 - resolving them is the check
    except ConfigurationError as exc:
        raise SystemExit(f"celery_agboss refuses to start this {what}: {exc}") from None
    late = runtime.settings_written_after_read()
    if late:
        raise SystemExit(
            f"celery_agboss refuses to start this {what}: {', '.join(late)} changed in "
            "app.conf after celery_agboss had read its settings, so the new value would not "
            "be used. Write every agboss_* setting before anything reads them: in the "
            "configuration the app is created with (config_from_object, or one "
            "app.conf.update(...) right after Celery(...)), before the tasks are imported"
        )


def _hand_over_running_leases(runtime: Runtime) -> None:
    """The sabotage above: release every live lease of this worker's running requests."""
    for request in tuple(worker_state.active_requests):
        found = runtime.store.read_lease(request.id)
        if found is not None and found.live:
            runtime.store.release_lease(LeaseRef(found.scope, found.holder, found.token))
