"""The transactional outbox: follow-up tasks published if and only if a transaction committed.

A publish inside a fenced effect's ``fn`` would reach the broker before the effect's
transaction commits — and a rolled-back effect would still have its follow-up — while
a publish after it is lost when the worker dies in between. So ``enqueue(conn, …)``
writes the follow-up as a row on ``fn``'s connection, in the effect's transaction;
``PaymentTask.fenced_effect`` publishes the rows its effect wrote once that transaction
committed, and marks them published; the sweep publishes the rows a dead worker left
unpublished past their grace (``agboss_outbox_grace``, unless the call gave one). Every
row has a stable task id (derived from the effect's key and the row's position in
``fn``, or from the application's ``key``), so the worst case — a publish whose
"published" mark was lost, then the sweep's — is one message twice under one id,
which a ``PaymentTask`` consumer runs once. A plain Celery task would run twice: the
consumer of an outbox message must be a ``PaymentTask`` (or deduplicate on its task id
itself).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

from celery import current_app
from celery.canvas import Signature
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from celery_agboss.core import sabotage
from celery_agboss.core.durations import to_ms
from celery_agboss.core.execution_context import ExecutionContext
from celery_agboss.core.keys import KEY_COLUMN_LENGTH
from celery_agboss.core.log_events import (
    OUTBOX_PUBLISH_FAILED,
    OUTBOX_PUBLISHED,
    OUTBOX_REPUBLISHED,
    SWEEP_ERROR,
    log_event,
)
from celery_agboss.core.protections import PUBLISHED_WITHOUT_COMMIT, SWEEP_NOT_REPUBLISHING
from celery_agboss.errors import ConfigurationError, StoreError
from celery_agboss.runtime.app_runtime import Runtime
from celery_agboss.runtime.known_settings import (
    DEFAULT_OUTBOX_GRACE_MS,
    DEFAULT_OUTBOX_GRACE_SECONDS,
)
from celery_agboss.runtime.messages import dumps, loads
from celery_agboss.store import outbox_rows as rows
from celery_agboss.store.driver_errors import translated
from celery_agboss.store.outbox_rows import OutboxMessage, OutboxRow
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore

T = TypeVar("T")

DEFAULT_GRACE = timedelta(seconds=DEFAULT_OUTBOX_GRACE_SECONDS)
"""How long the sweep leaves a committed row to the process that committed it (which
publishes it at once) before it publishes the row itself: ``agboss_outbox_grace``'s
default."""

_IDS = uuid.UUID("0b7d3c4e-8f21-4a6b-9c55-2e1f7a9d4b10")


@dataclass
class _EffectScope:
    """The fenced effect whose ``fn`` is running on this thread: what ``enqueue`` derives
    the task id from, and what its delivery publishes once the effect committed."""

    conn: Connection
    key: str
    execution_id: str
    offset_ms: int
    grace_ms: int  # the app's agboss_outbox_grace
    enqueued: list[OutboxMessage] = field(default_factory=list)


_current: ContextVar[_EffectScope | None] = ContextVar("agboss_outbox_effect", default=None)


def enqueue(
    conn: Connection | Session,
    task: Signature | str | Any,
    args: Sequence[Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    *,
    options: Mapping[str, Any] | None = None,
    key: str | None = None,
    grace: float | timedelta | None = None,
) -> str:
    """Write a follow-up task in ``conn``'s transaction; its task id.

    ``task`` is a signature (``send_receipt.s(order_id).set(queue="mail")``), a task, or
    a task name with ``args``, ``kwargs`` and publish ``options``. Inside a fenced
    effect's ``fn`` (``conn`` is ``fn``'s connection, or an ORM session joined to it) the
    id is derived from the effect's key and this call's position in ``fn``, so every
    re-run of the body names the same task; elsewhere (the application's own transaction
    on the store's database) give ``key`` — unique in the store — or a ``task_id`` in
    the options. Published once the transaction committed (by the fenced effect, or by
    your ``publish(app, task_id)`` after your commit); the sweep publishes it ``grace``
    after the commit if nobody did. Without ``grace``: the app's ``agboss_outbox_grace``
    (outside a fenced effect, the current Celery app's, else :data:`DEFAULT_GRACE`).
    """
    connection = conn.connection() if isinstance(conn, Session) else conn
    name, call_args, call_kwargs, call_options = _message_parts(task, args, kwargs, options)
    scope = _current.get()
    if scope is not None and connection is not scope.conn:
        raise ConfigurationError(
            "outbox.enqueue() inside a fenced effect takes the connection fn was given: a "
            "row written on another connection would not commit with the effect",
            task=name,
        )
    task_id = _task_id(scope, key, call_options.pop("task_id", None), name)
    message = OutboxMessage(
        task_id=task_id,
        task_name=name,
        args=dumps(call_args),
        kwargs=dumps(call_kwargs),
        options=dumps(call_options),
        execution_id=None if scope is None else scope.execution_id,
    )
    runtime = _current_runtime() if scope is None else None
    if grace is not None:
        grace_ms = to_ms(grace, what="grace")
        if grace_ms < 0:
            raise ValueError("grace must not be negative")
    elif scope is not None:
        grace_ms = scope.grace_ms
    else:
        grace_ms = DEFAULT_OUTBOX_GRACE_MS if runtime is None else runtime.settings.outbox_grace_ms
    with translated():
        rows.insert_txn(
            connection,
            message,
            grace_ms=grace_ms,
            offset_ms=0 if scope is None else scope.offset_ms,
            sealer=None if runtime is None else runtime.store.sealer,
        )
    if scope is not None:
        scope.enqueued.append(message)
    return task_id


def _current_runtime() -> Runtime | None:
    """Outside a fenced effect no app is at hand: the current Celery app's ``AGBoss`` (the
    one process-wide app of most projects), whose grace and keys the row takes; None when
    it has none (the default grace, sealed as the connection's)."""
    try:
        return Runtime.of(current_app._get_current_object())
    except ConfigurationError:
        return None


def _message_parts(
    task: Any,
    args: Sequence[Any] | None,
    kwargs: Mapping[str, Any] | None,
    options: Mapping[str, Any] | None,
) -> tuple[str, list[Any], dict[str, Any], dict[str, Any]]:
    if isinstance(task, Signature):
        if task.get("subtask_type"):
            raise ConfigurationError(
                "outbox.enqueue() takes one task, not a canvas (chain, group, chord): enqueue "
                "its first task and link the rest (link=…)",
                task=str(task.get("task")),
            )
        if args is not None or kwargs is not None or options is not None:
            raise TypeError("give a signature, or a task name with args/kwargs/options: not both")
        return (
            str(task.task),
            list(task.args or ()),
            dict(task.kwargs or {}),
            dict(task.options or {}),
        )
    name = task if isinstance(task, str) else getattr(task, "name", None)
    if not isinstance(name, str) or not name:
        raise TypeError(f"outbox.enqueue() needs a signature, a task or a task name, not {task!r}")
    return name, list(args or ()), dict(kwargs or {}), dict(options or {})


def _task_id(scope: _EffectScope | None, key: str | None, given: Any, name: str) -> str:
    if given is not None and key is not None:
        raise ConfigurationError(
            f"outbox.enqueue() was given both key={key!r} and task_id={str(given)!r}: each "
            "names the row's task id on its own, so one of them would be ignored. Give one",
            task=name,
        )
    if given is not None:
        if len(str(given)) > KEY_COLUMN_LENGTH:
            raise ValueError(
                f"an outbox task_id has at most {KEY_COLUMN_LENGTH} characters (the store's "
                f"id column), not {len(str(given))}: give a shorter one, or key=…"
            )
        return str(given)
    if key is not None:
        if not isinstance(key, str) or not key:
            raise ValueError(f"an outbox key must be a non-empty string, not {key!r}")
        return str(uuid.uuid5(_IDS, f"key/{key}"))
    if scope is None:
        raise ConfigurationError(
            "outbox.enqueue() outside a PaymentTask's fenced effect needs key=… (unique in "
            "the store) or a task_id: a retried transaction must name the same task again",
            task=name,
        )
    return str(uuid.uuid5(_IDS, f"effect/{scope.key}/{len(scope.enqueued) + 1}"))


# --- the delivery: after the effect's commit ------------------------------------------------


def run_fenced_effect(
    app: Any,
    ctx: ExecutionContext,
    name: str,
    fn: Callable[[Any], T],
    *,
    business_key: str | None = None,
    request: Any = None,
) -> T:
    """``ctx.fenced_effect`` with the outbox: what ``fn`` enqueued is published after the
    effect's transaction committed, and only then. ``PaymentTask.fenced_effect`` calls it."""
    offset_ms = ctx.store.offset_ms() if isinstance(ctx.store, SQLAlchemyStore) else 0
    grace_ms = Runtime.of(app).settings.outbox_grace_ms
    runs: list[_EffectScope] = []

    def with_outbox(conn: Any) -> T:
        # The effect's key as its delivery decided it (``core.step_identity``): the same on
        # every re-run of the body, and so the task ids derived from it.
        step = ctx.running_effect
        assert step is not None  # fn runs inside ctx.fenced_effect, on this thread
        scope = _EffectScope(conn, step.key, ctx.execution_id, offset_ms, grace_ms)
        runs[:] = [scope]  # a run that lost its insert was rolled back: only the last counts
        token = _current.set(scope)
        try:
            return fn(conn)
        finally:
            _current.reset(token)

    try:
        result = ctx.fenced_effect(name, with_outbox, business_key=business_key, request=request)
    finally:
        if runs and sabotage.active(PUBLISHED_WITHOUT_COMMIT):
            for message in runs[-1].enqueued:
                _send(app, message)
    if runs and runs[-1].enqueued:
        task_ids = [message.task_id for message in runs[-1].enqueued]
        _publish(Runtime.of(app), task_ids, ctx.execution_id)
    return result


def publish(app: Any, *task_ids: str) -> list[str]:
    """Publish these outbox rows if they committed and are not published yet; the ids
    published. Never raises for a publish that failed: the row stays, the sweep
    publishes it. Call it after your own transaction committed (a fenced effect does)."""
    return _publish(Runtime.of(app), list(task_ids), None)


def _publish(runtime: Runtime, task_ids: list[str], execution: str | None) -> list[str]:
    try:
        committed = rows.unpublished(runtime.store, task_ids)
    except (Exception, StoreError):
        _publish_failed("read", count=len(task_ids), execution_id=execution)
        return []
    published: list[str] = []
    for row in committed:
        task_id = row.message.task_id
        try:
            _send(runtime.app, row.message)
        except (Exception, StoreError):
            _publish_failed("send", task_id=task_id, task=row.message.task_name)
            continue
        published.append(task_id)
        try:
            rows.mark_published(runtime.store, task_id)
        except (Exception, StoreError):
            # Sent, not marked: the sweep sends it again, under the same id (harmless
            # for a PaymentTask consumer, the reason it must be one).
            _publish_failed("mark", task_id=task_id, task=row.message.task_name, sent=True)
    if published:
        log_event(OUTBOX_PUBLISHED, execution_id=execution, count=len(published))
    return published


def _publish_failed(stage: str, *, sent: bool = False, **fields: Any) -> None:
    """Never more than a warning: the committed row stays, and the sweep publishes it."""
    log_event(
        OUTBOX_PUBLISH_FAILED,
        logging.WARNING,
        "sent, not marked: the sweep sends it again under its id"
        if sent
        else "the row stays: the sweep publishes it after its grace",
        exc_info=True,
        stage=stage,
        **fields,
    )


_sending_row: ContextVar[bool] = ContextVar("agboss_outbox_sending_row", default=False)


def sending_row() -> bool:
    """True while a committed row is being sent: its record decided (a body's cancel was
    read when its effect committed), so the publish from a body is not checked again."""
    return _sending_row.get()


def _send(app: Any, message: OutboxMessage) -> Any:
    """The message as enqueued, under its own task id (never one derived for a publish
    from a body: the outbox's id is the one that must be stable)."""
    token = _sending_row.set(True)
    try:
        if message.task_name == CANVAS_TASK_NAME:
            return _send_canvas(app, message)
        options = dict(loads(message.options) or {})
        return app.send_task(
            message.task_name,
            args=loads(message.args) or [],
            kwargs=loads(message.kwargs) or {},
            task_id=message.task_id,
            add_to_parent=False,
            **options,
        )
    finally:
        _sending_row.reset(token)


# --- a canvas published from a body (celery_agboss.signals.body_publishes) ----------------------

CANVAS_TASK_NAME = "celery_agboss.canvas"
"""The task name of an outbox row that holds a canvas (chain, group, chord) published from
a body: its ``args`` are the canvas, every task id in it fixed; its ``kwargs`` the
arguments it was applied with. Sending the row applies the canvas, under those ids."""

_sending_canvas: ContextVar[bool] = ContextVar("agboss_outbox_sending_canvas", default=False)


def sending_canvas() -> bool:
    """True while a recorded canvas is being sent: Celery's own apply, left alone."""
    return _sending_canvas.get()


def record_canvas(
    conn: Connection,
    app: Any,
    task_id: str,
    canvas: Mapping[str, Any],
    call: Mapping[str, Any],
    *,
    execution_id: str,
    offset_ms: int = 0,
) -> None:
    """Write ``canvas`` as an outbox row in ``conn``'s transaction (a fenced effect's),
    published once that transaction committed; the sweep publishes it after the app's
    ``agboss_outbox_grace`` if nobody did. ``call``: ``args``, ``kwargs`` and publish
    ``options`` of the apply."""
    message = OutboxMessage(
        task_id=task_id,
        task_name=CANVAS_TASK_NAME,
        args=dumps([dict(canvas)]),
        kwargs=dumps(dict(call)),
        options=dumps({}),
        execution_id=execution_id,
    )
    grace_ms = Runtime.of(app).settings.outbox_grace_ms
    with translated():
        rows.insert_txn(conn, message, grace_ms=grace_ms, offset_ms=offset_ms)


def _send_canvas(app: Any, message: OutboxMessage) -> Any:
    canvas = app.signature((loads(message.args) or [{}])[0])
    call = dict(loads(message.kwargs) or {})
    token = _sending_canvas.set(True)
    try:
        return canvas.apply_async(
            call.get("args") or None, call.get("kwargs") or None, **(call.get("options") or {})
        )
    finally:
        _sending_canvas.reset(token)


# --- the sweep ------------------------------------------------------------------------------


@dataclass
class OutboxSweep:
    """What the sweep's outbox step did: rows published, published rows deleted, errors."""

    published: int = 0
    deleted: int = 0
    errors: int = 0
    oldest_age_ms: int = 0  # of the rows published: how long after its commit
    published_ids: list[str] = field(default_factory=list)


def sweep_outbox(runtime: Runtime, batch_size: int) -> OutboxSweep:
    """Publish the committed rows nobody published within their grace (the process that
    committed them died, or the broker refused), at most ``batch_size``, each claimed
    first; then delete published rows older than the fenced-effect retention."""
    done = OutboxSweep()
    settings = runtime.settings
    store = runtime.store
    if not sabotage.active(SWEEP_NOT_REPUBLISHING):
        # The claim keeps other sweepers away while this one publishes (or dies trying).
        retry_after_ms = max(2 * settings.sweep_period_ms, settings.lease_ttl_ms)
        claimed = rows.claim_due(store, batch_size, retry_after_ms)
        now_ms = store.now_ms() if claimed else 0
        for row in claimed:
            try:
                # Read (and opened) after the claim committed: a row no key opens keeps its
                # claim and fails alone, by name (design: outbox leftovers, sealed at rest).
                if not _publish_claimed(runtime, row.task_id):
                    continue
            except (Exception, StoreError):
                done.errors += 1
                log_event(
                    SWEEP_ERROR,
                    logging.ERROR,
                    exc_info=True,
                    step="outbox",
                    task=row.task_name,
                    task_id=row.task_id,
                )
                continue
            done.published += 1
            done.published_ids.append(row.task_id)
            done.oldest_age_ms = max(done.oldest_age_ms, now_ms - row.created_at_ms)
        if done.published:
            log_event(
                OUTBOX_REPUBLISHED,
                logging.WARNING,
                "committed rows nobody published within their grace",
                count=done.published,
                oldest_age_ms=done.oldest_age_ms,
            )
    cutoff = store.now_ms() - settings.fenced_effect_retention_ms
    done.deleted = rows.delete_published_before(store, cutoff, batch_size)
    return done


def _publish_claimed(runtime: Runtime, task_id: str) -> bool:
    """Send a claimed row and mark it published; False when it was published since the
    claim (by the process that committed it, which is then not sent twice)."""
    found = rows.read(runtime.store, task_id)
    if found is None or found.published:
        return False
    _send(runtime.app, found.message)
    rows.mark_published(runtime.store, task_id)
    return True


# --- what operators and tests read ----------------------------------------------------------


def read(app: Any, task_id: str) -> OutboxRow | None:
    """The committed outbox row of ``task_id`` (None: never committed, or retention's)."""
    return rows.read(Runtime.of(app).store, task_id)


def count_unpublished(app: Any) -> int:
    """Committed rows still waiting for their publish."""
    return rows.count_unpublished(Runtime.of(app).store)


__all__ = [
    "CANVAS_TASK_NAME",
    "DEFAULT_GRACE",
    "OutboxMessage",
    "OutboxRow",
    "OutboxSweep",
    "count_unpublished",
    "enqueue",
    "publish",
    "read",
    "record_canvas",
    "run_fenced_effect",
    "sending_canvas",
    "sending_row",
    "sweep_outbox",
]
