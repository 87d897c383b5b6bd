"""A ``PaymentTask``'s publish, recorded ``REQUESTED`` before it reaches the broker.

``before_task_publish`` records the message (or refuses the publish: nothing reaches
the broker); ``app.send_task`` is wrapped so that refusal reaches the caller as an
ordinary exception, and so that a PaymentTask published from a body gets a stable id;
``PaymentTask.apply`` (and ``apply_async`` under ``task_always_eager``), which run the task
in process without ``send_task``, give one run from a body the same id.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import uuid
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from celery import Celery

from celery_agboss import outbox
from celery_agboss.core import sabotage
from celery_agboss.core.executions import ExecutionState
from celery_agboss.core.log_events import EXECUTION_EXPIRED, EXECUTION_NOT_RECORDED, log_event
from celery_agboss.core.protections import (
    BODY_PUBLISHES_GET_NEW_IDS,
    EAGER_BODY_PUBLISH_UNKEYED,
    LINK_IDS_NOT_FIXED,
    PUBLISH_WITHOUT_RECORD,
    REFUSED_PUBLISH_KEEPS_ITS_POSITION,
    REFUSED_PUBLISH_LEFT_FOR_THE_SWEEP,
    SEND_TASK_ID_READ_FROM_ETA,
)
from celery_agboss.core.step_identity import DERIVED_ID_HEADER
from celery_agboss.errors import (
    ConfigurationError,
    ExecutionIdConflictError,
    PublishNotRecorded,
    PublishRefusedError,
    StoreError,
)
from celery_agboss.runtime.app_runtime import Runtime
from celery_agboss.runtime.messages import ArgumentsNotKeptError, message_from_publish
from celery_agboss.signals.body_publishes import (
    Position,
    body_context,
    derived_task_id,
    refuse_a_new_id_from_a_body,
    refuse_if_cancelled,
    request_of,
    take_position,
)
from celery_agboss.signals.link_ids import fix_link_ids
from celery_agboss.signals.payment_tasks import (
    is_payment_task,
    payment_task_reason,
    records_its_own,
)
from celery_agboss.task import PaymentTask

logger = logging.getLogger("celery_agboss")

RECORDED_HEADER = "agboss_recorded"
"""The header of a message whose execution was recorded at publish: why the publisher
took the task for a ``PaymentTask`` (``PaymentTask``, or the pattern that matched)."""


@dataclass
class _ThisPublish:
    """What ``before_task_publish`` recorded for the ``send_task`` call running on this
    thread: the execution, and whether this publish's record created it."""

    execution_id: str | None = None
    created: bool = False
    # The app whose send_task runs: another AGBoss app's publish is not this one's.
    app: Any = None


_this_publish: ContextVar[_ThisPublish | None] = ContextVar("agboss_this_publish", default=None)


def before_task_publish(
    runtime: Runtime,
    sender: Any = None,
    body: Any = None,
    exchange: Any = None,
    routing_key: Any = None,
    headers: Any = None,
    properties: Any = None,
    **_: Any,
) -> None:
    """Record a PaymentTask's message ``REQUESTED``, or refuse its publish."""
    headers = {} if headers is None else headers
    name = headers.get("task", sender)
    reason = payment_task_reason(runtime, name)
    if reason is None:
        return
    through = _this_publish.get()
    if through is not None and through.app is not runtime.app:
        if records_its_own(through.app, name):
            return  # another AGBoss app's own payment task: it records and checks it
        refuse_a_new_id_from_a_body(name, headers.get("id"))
    elif through is None:  # not through any AGBoss app's send_task
        refuse_a_new_id_from_a_body(name, headers.get("id"))
    # Kept with the recorded message, so every re-publish says it too.
    headers.setdefault(RECORDED_HEADER, reason)
    if not sabotage.active(LINK_IDS_NOT_FIXED):
        fix_link_ids(body, str(headers.get("id")))
    try:
        message = message_from_publish(
            body=body,
            exchange=exchange,
            routing_key=routing_key,
            headers=headers,
            properties=properties or {},
        )
    except ArgumentsNotKeptError as exc:
        log_event(EXECUTION_NOT_RECORDED, logging.ERROR, task=name, reason="arguments not kept")
        raise PublishNotRecorded(
            PublishRefusedError(
                f"the publish of {name!r} was refused and nothing was published: {exc}",
                task=name,
            )
        ) from None
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
            runtime.executions.record_requested(message)
        return
    try:
        created = runtime.executions.record_requested(message)
    except ExecutionIdConflictError as exc:
        raise PublishNotRecorded(exc) from None
    except (StoreError, ConfigurationError) as exc:
        raise PublishNotRecorded(_refused(name, message.execution_id, exc)) from None
    noted = _this_publish.get()
    if noted is not None:
        noted.execution_id, noted.created = message.execution_id, created


def _refused(name: Any, execution_id: str, exc: StoreError | ConfigurationError) -> Exception:
    """The error a publish the store could not record is refused with: a message the
    broker then lost would leave no trace, so nothing is published."""
    log_event(
        EXECUTION_NOT_RECORDED,
        logging.ERROR,
        execution_id=execution_id,
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
        f"the publish of {name!r} ({execution_id}) was refused and nothing "
        f"was published: {what_to_do}",
        task=name,
        execution_id=execution_id,
    )
    refused.__cause__ = exc
    return refused


@dataclass(frozen=True)
class _FromABody:
    """A PaymentTask published from a PaymentTask's body: its stable id, its position and
    its request (what tells a retry of it)."""

    task_id: str
    position: Position
    request: str

    def refused(self) -> None:
        """Its send raised: a retry of it takes its position again.

        (design: publishes from a body)"""
        if not sabotage.active(REFUSED_PUBLISH_KEEPS_ITS_POSITION):
            self.position.refused(self.request)


def _published_from_a_body(
    runtime: Runtime, name: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> _FromABody | None:
    """The stable id of a PaymentTask published from inside a PaymentTask's delivery
    (``ship.delay(order)`` in ``charge_order``'s body), or None: outside a delivery,
    or a task that is not a PaymentTask. The n-th publish of one task name in a
    delivery gets the same id on every re-run (design: publishes from a body)."""
    if not isinstance(name, str):
        return None
    ctx = body_context()
    if ctx is None or not is_payment_task(runtime, name):
        return None
    request = request_of(
        args[0] if args else kwargs.get("args"), args[1] if args[1:] else kwargs.get("kwargs")
    )
    position = take_position(ctx, name, request)
    return _FromABody(derived_task_id(ctx.execution_id, position.text), position, request)


def _keyed_in_process(original: Callable[..., Any], eager_only: bool) -> Callable[..., Any]:
    """``PaymentTask.apply`` (or ``apply_async``, when ``task_always_eager`` makes it run
    ``apply``) as a body calls it: the task runs in this process, never reaching
    ``send_task``, so it takes the same position and derived id here that a published one
    gets there; a re-run replays its execution instead of running another
    (design: publishes from a body). An id the caller gave is kept."""
    parameters = inspect.signature(original)

    @functools.wraps(original)
    def run_here(self: Any, *given: Any, **named: Any) -> Any:
        if sabotage.active(EAGER_BODY_PUBLISH_UNKEYED) or sabotage.active(
            BODY_PUBLISHES_GET_NEW_IDS
        ):
            return original(self, *given, **named)
        if eager_only and not self.app.conf.task_always_eager:
            return original(self, *given, **named)  # published: send_task derives its id
        call = parameters.bind(self, *given, **named)
        ctx = body_context()
        if ctx is None:
            return original(self, *given, **named)
        try:
            runtime = Runtime.of(self.app)
        except ConfigurationError:
            return original(self, *given, **named)
        if is_payment_task(runtime, self.name):
            refuse_if_cancelled(ctx, call.arguments.get("task_id"))
        if call.arguments.get("task_id") is not None:
            return original(self, *given, **named)
        request = (call.arguments.get("args"), call.arguments.get("kwargs"))
        body = _published_from_a_body(runtime, self.name, request, {})
        if body is None:
            return original(self, *given, **named)
        call.arguments["task_id"] = body.task_id
        try:
            return original(*call.args, **call.kwargs)
        except Exception:
            # As a send that raised: the body's retry of it is the same execution, which
            # replays or continues, never one more beside it that charges again.
            body.refused()
            raise

    run_here._agboss_keyed_in_process = True  # type: ignore[attr-defined]
    return run_here


def key_in_process_runs() -> None:
    """Hook ``PaymentTask.apply`` and ``apply_async`` (once per process; outside a body,
    or given a ``task_id``, they are Celery's unchanged)."""
    for name, eager_only in (("apply", False), ("apply_async", True)):
        current = getattr(PaymentTask, name)
        if not getattr(current, "_agboss_keyed_in_process", False):
            setattr(PaymentTask, name, _keyed_in_process(current, eager_only))


def _task_id_index(send: Callable[..., Any]) -> int:
    """Where ``task_id`` sits among ``send_task``'s positional arguments after the name
    (``args, kwargs, countdown, eta, task_id``: 4), read from ``send``'s signature, or
    from Celery's when ``send`` does not name it (a wrapper taking ``*args``)."""
    for candidate in (send, Celery.send_task):
        try:
            parameters = inspect.signature(candidate).parameters.values()
        except (TypeError, ValueError):
            continue
        positional = [
            p.name
            for p in parameters
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "self"
        ]
        if positional[:1] == ["name"] and "task_id" in positional:
            return positional.index("task_id") - 1
    raise RuntimeError("Celery's send_task no longer takes a task_id")  # pragma: no cover


def _chosen_task_id(at: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether the caller named the task id, positionally or by keyword; otherwise a
    body's publish gets a stable one (design: publishes from a body). The sabotage
    reads it one place off, where ``eta`` is."""
    if sabotage.active(SEND_TASK_ID_READ_FROM_ETA):
        return bool(args[at - 1 : at]) or kwargs.get("task_id") is not None
    given = args[at] if len(args) > at else kwargs.get("task_id")
    return given is not None


def _with_task_id(
    at: int, args: tuple[Any, ...], kwargs: dict[str, Any], task_id: str
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The call with ``task_id`` where the caller left it empty (a positional ``None``
    stays positional: naming it again would be a second value for it)."""
    if len(args) > at:
        return (*args[:at], task_id, *args[at + 1 :]), kwargs
    return args, {**kwargs, "task_id": task_id}


def _after_a_raised_send(
    runtime: Runtime,
    name: Any,
    noted: _ThisPublish,
    body: _FromABody | None,
    fresh_id: bool,
    error: BaseException,
) -> None:
    """What a publish whose send raised leaves behind; the caller then gets the error
    unchanged and retries or gives up (design: trap 9, publishes from a body).

    From a body, the position is left for a retry: the body's retry of the publish (the
    same arguments) is the same execution, not one more beside it. A recorded execution
    under an id Celery made for this call alone (nobody can publish it again) is ended
    ``EXPIRED`` by compare-and-set while still ``REQUESTED``, so the sweep never revives
    what the caller retried under a new id or gave up; one a worker started (the broker
    did take the message) is left.
    An id that is published again as it is (derived in a body, chosen by the caller, an
    outbox row's, a re-publish's) stays ``REQUESTED``: its publisher's retry, a re-run,
    or else the sweep sends it, and ending it would turn those into silent drops."""
    if body is not None:
        body.refused()
    if noted.execution_id is None or not noted.created:
        return
    if not fresh_id or sabotage.active(REFUSED_PUBLISH_LEFT_FOR_THE_SWEEP):
        logger.info(
            "the publish of %s (%s) raised %s; its execution stays REQUESTED under its "
            "stable id: a publish of that id again, or the sweep, sends it",
            name,
            noted.execution_id,
            type(error).__name__,
        )
        return
    reason = (
        f"never started: its publish was refused ({type(error).__name__}) and the "
        "publisher was told, so it publishes again under a new id or gives up"
    )
    try:
        ended = runtime.executions.move(
            noted.execution_id, [ExecutionState.REQUESTED], ExecutionState.EXPIRED, reason
        )
    except (Exception, StoreError):
        logger.warning(
            "the publish of %s (%s) raised and its execution could not be ended; the "
            "sweep re-publishes it after agboss_requested_grace",
            name,
            noted.execution_id,
            exc_info=True,
        )
        return
    if ended is not None:
        log_event(
            EXECUTION_EXPIRED,
            logging.WARNING,
            reason,
            execution_id=noted.execution_id,
            task=name,
        )


def refuse_unrecorded_publishes(runtime: Runtime) -> None:
    """Make ``app.send_task`` (which ``apply_async``, ``delay``, canvas and ``retry`` all
    go through) raise the error ``before_task_publish`` refused a publish with, as an
    ordinary exception for the caller; nothing reached the broker. A PaymentTask
    published from a PaymentTask's body without a ``task_id`` gets a stable one. A
    publish whose send raised is cleaned up after (``_after_a_raised_send``)."""
    key_in_process_runs()
    app = runtime.app
    original = app.send_task
    if getattr(original, "_agboss_refuses_unrecorded", False):
        return
    at = _task_id_index(original)

    @functools.wraps(original)
    def send_task(name: Any, *args: Any, **kwargs: Any) -> Any:
        ctx = body_context()
        if ctx is not None and is_payment_task(runtime, name):
            refuse_if_cancelled(ctx, args[at] if len(args) > at else kwargs.get("task_id"))
        chosen = _chosen_task_id(at, args, kwargs)
        body = None
        if not chosen and not sabotage.active(BODY_PUBLISHES_GET_NEW_IDS):
            body = _published_from_a_body(runtime, name, args, kwargs)
            if body is not None:
                args, kwargs = _with_task_id(at, args, kwargs, body.task_id)
                headers = {**(kwargs.get("headers") or {}), DERIVED_ID_HEADER: True}
                kwargs = {**kwargs, "headers": headers}
        deferred = _publish_on_commit(runtime, name, args, kwargs)
        if deferred is not None:
            return deferred
        noted = _ThisPublish(app=app)
        token = _this_publish.set(noted)
        try:
            return original(name, *args, **kwargs)
        except PublishNotRecorded as refused:
            if body is not None:
                body.refused()  # nothing recorded: a retry of it takes its position again
            raise refused.error from refused.error.__cause__
        except Exception as error:
            fresh_id = not chosen and body is None
            _after_a_raised_send(runtime, name, noted, body, fresh_id, error)
            raise
        finally:
            _this_publish.reset(token)

    send_task._agboss_refuses_unrecorded = True  # type: ignore[attr-defined]
    app.send_task = send_task


# What a publish recorded in the caller's transaction cannot carry: a group's or a chord's
# part (its results are set up as the canvas is applied, now) and a live producer. Callbacks
# and the rest of a chain are the message's own options: the outbox row keeps them.
_NOT_RECORDABLE = ("chord", "group_id", "producer", "connection")
_NOT_MESSAGE_OPTIONS = frozenset({"result_cls", "task_type", "add_to_parent", "task_id"})


def _publish_on_commit(runtime: Runtime, name: Any, args: tuple[Any, ...], kwargs: Any) -> Any:
    """A ``PaymentTask`` published inside the caller's transaction on the store's database
    (Django's ``atomic`` on its alias), outside a delivery: recorded in that transaction
    as an outbox row and sent once it commits (``outbox.publish``; the sweep sends it
    after ``agboss_outbox_grace`` if this process dies first). A rolled-back request
    records and sends nothing. Its ``AsyncResult`` at once, under the id fixed here; None
    when the publish is not such a one (it goes on as usual)."""
    try:
        in_django = runtime.settings.django_database is not None
    except ConfigurationError:
        return None  # the usual path refuses the publish, naming the setting
    if not in_django or not isinstance(name, str) or args[2:]:
        return None
    if body_context() is not None or not is_payment_task(runtime, name):
        return None
    users = runtime.store.users_database
    pending = None if users is None else users.open_transaction()
    if pending is None:
        return None
    unrecordable = [option for option in _NOT_RECORDABLE if kwargs.get(option)]
    if unrecordable:
        raise PublishRefusedError(
            f"{name} is published inside transaction.atomic() on the store's database as "
            f"part of a group or chord, or with its own producer ({', '.join(unrecordable)}): "
            "that cannot wait for the commit, and sent now it would charge even if the "
            "transaction rolls back. Publish it after the commit: "
            "transaction.on_commit(lambda: canvas.apply_async())",
            task=name,
        )
    call_args = args[0] if args else kwargs.get("args")
    call_kwargs = args[1] if args[1:] else kwargs.get("kwargs")
    task_id = str(kwargs.get("task_id") or uuid.uuid4())
    options = {
        key: value
        for key, value in kwargs.items()
        if key not in ("args", "kwargs") and key not in _NOT_MESSAGE_OPTIONS and value is not None
    }
    with pending.engine.connect() as conn:
        outbox.enqueue(
            conn,
            name,
            call_args,
            call_kwargs,
            options={**options, "task_id": task_id},
            grace=runtime.settings.outbox_grace_seconds,
        )

    def send() -> None:
        outbox.publish(runtime.app, task_id)  # a failed send is logged; the sweep's then

    pending.on_commit(send)
    result_cls = kwargs.get("result_cls") or runtime.app.AsyncResult
    return result_cls(task_id)
