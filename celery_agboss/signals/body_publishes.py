"""What a ``PaymentTask``'s body publishes: the same executions on every re-run
(design: publishes from a body).

The body runs again from the top on every delivery, so a publish in it is reached
again by every re-run. Each publish from a body has a position — the n-th publish of
one name in the delivery (inside an undo, the n-th of that undo) — and what it
publishes gets task ids derived from the parent execution and that position:

- a ``PaymentTask`` published alone (``ship.delay(order)``) gets the derived id
  (``signals``); its consumer runs one execution under it however often it is sent;
- a canvas (chain, group, chord) gets a derived id for every task in it, and for its
  group, and is published once per parent execution and position: a fenced effect
  writes it as an outbox row (committed with the effect's record, or not at all),
  then the row is published. A re-run that reaches the same publish replays the
  effect and sends nothing new; a crash between the commit and the publish leaves the
  row to the next publish of the outbox or to the sweep, under the same ids.

Plain tasks in a canvas keep Celery's at-least-once contract: the outbox's worst case
(a publish whose "published" mark was lost) sends the canvas twice under the same ids,
which a ``PaymentTask`` runs once and a plain task twice.

A canvas inside a canvas cannot be given stable ids (Celery re-freezes nested chains,
groups and chords as they run, under ids of its own), so it is refused, naming what to
do instead.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import threading
import uuid
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from celery._state import get_current_worker_task
from celery.canvas import _chain, _chord, group

from celery_agboss.core import sabotage
from celery_agboss.core.execution_context import ExecutionContext
from celery_agboss.core.protections import (
    BODY_PUBLISH_IGNORES_CANCEL,
    BODY_PUBLISH_THROUGH_ANOTHER_APP_ALLOWED,
    BODY_PUBLISHES_GET_NEW_IDS,
    UNDO_PUBLISHES_COUNTED_IN_THE_DELIVERY,
)
from celery_agboss.errors import ConfigurationError, PublishNotRecorded, PublishRefusedError
from celery_agboss.outbox import publishing as outbox
from celery_agboss.runtime.app_runtime import Runtime
from celery_agboss.runtime.messages import dumps, loads
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore
from celery_agboss.task import execution_context_of

PUBLISH_EFFECT = "agboss.publish"
"""The fenced effect that records a canvas published from a body: ``<this>/<row id>``, the
row's id derived from the execution and the publish's position (a name of bounded length,
where the position holds task names and undo keys)."""

_DERIVED_IDS = uuid.UUID("5c0f6c62-9b6e-4bb1-9d3c-5a7c1f0e2d41")

# What a canvas's apply is given about how to send (not what): no meaning for a re-send.
_TRANSPORT_OPTIONS = ("producer", "publisher", "connection", "router", "result_cls")


def derived_task_id(parent_execution_id: str, position: str) -> str:
    """The id of a task an execution publishes (from its body, or as its link), the same
    on every re-run: derived from the parent's id and the publish's position or name."""
    return str(uuid.uuid5(_DERIVED_IDS, f"{parent_execution_id}/{position}"))


def body_context() -> ExecutionContext | None:
    """The execution whose body is running on this thread, or None (outside a
    ``PaymentTask``'s body, e.g. while Celery sends a chain's next step after it)."""
    current = get_current_worker_task()
    if current is None:
        return None
    ctx = execution_context_of(current.request)
    return ctx if isinstance(ctx, ExecutionContext) else None


def refuse_if_cancelled(ctx: ExecutionContext, task_id: Any = None) -> None:
    """``CancelRequestedError`` when a cancel of the body's execution was recorded, before
    a PaymentTask it publishes alone is recorded or sent: the body's next call would be
    refused, and the child would charge for a cancelled order (a canvas's fenced effect
    reads it the same way). Read as ``check_cancel`` reads it, in a fenced transaction.

    Not read again for the body's own retry (its own id), nor for an outbox row's send
    (its effect read it), nor inside a fenced effect's ``fn`` (its transaction did)."""
    if sabotage.active(BODY_PUBLISH_IGNORES_CANCEL) or outbox.sending_row():
        return
    if ctx.running_effect is not None or (task_id is not None and task_id == ctx.execution_id):
        return
    with ctx.fenced(engine_only=True) as tx:
        ctx.check_cancel(tx)


def _celerys_own_id(task_id: Any) -> bool:
    """Whether ``task_id`` has the form Celery gives the ids it makes (``str(uuid4())``,
    dashed, lower case): an id of that form may be one made for this call alone. An id
    of any other form (a digest, text, a UUID of another version) is the caller's."""
    text = str(task_id)
    try:
        parsed = uuid.UUID(text)
    except ValueError:
        return False
    return parsed.version == 4 and str(parsed) == text


def refuse_a_new_id_from_a_body(name: Any, task_id: Any) -> None:
    """Refuse a PaymentTask published from a body past the app's ``send_task`` (another
    Celery app's, a producer of its own) under an id Celery made for this call alone: each
    re-run of the body would publish it again under a new id, and charge again. An id that
    is not a random UUID is the caller's, kept as given. Raised as ``PublishNotRecorded``,
    the one error Celery lets out of ``before_task_publish``: its ``error`` is the
    ``PublishRefusedError``."""
    if sabotage.active(BODY_PUBLISH_THROUGH_ANOTHER_APP_ALLOWED) or body_context() is None:
        return
    made_by_celery = _celerys_own_id(task_id)
    if not made_by_celery:
        return
    raise PublishNotRecorded(
        PublishRefusedError(
            f"{name} was published from a PaymentTask's body through another Celery app, "
            "under a new id on every re-run of the body, so a retried body would charge "
            f"again; nothing was published. Publish it through the task's own app "
            f"({name}.delay / app.send_task), or give a task_id= that is the same on every "
            "re-run (a task_id in Celery's own form, a dashed UUID version 4, is taken for "
            "one Celery made: use uuid5 or text of your own)",
            task=name,
            execution_id=str(task_id),
        )
    )


@dataclass(frozen=True)
class Position:
    """The position one publish from a body took: what its stable id is derived from."""

    ctx: ExecutionContext
    counted_as: str  # what ``next_publish`` counted: the name, or ``<undo key>/<name>``
    n: int
    text: str  # ``publish/<name>#<n>``, or ``<undo key>/publish/<name>#<n>``

    def refused(self, request: str) -> None:
        """Its send raised: the body's next publish of the name, if it is the same
        ``request`` (a retry of this one), takes this position again, so it is the same
        execution, not one more beside it. Any other publish takes the next position."""
        with _refused_lock:
            _refused.setdefault(self.ctx, {})[self.counted_as] = (self.n, request)


# Per delivery: the position a publish whose send raised left, by what it counted, with
# the request it carried (the delivery's context is dropped with the delivery).
_refused: weakref.WeakKeyDictionary[ExecutionContext, dict[str, tuple[int, str]]] = (
    weakref.WeakKeyDictionary()
)
_refused_lock = threading.Lock()


def request_of(args: Any, kwargs: Any) -> str:
    """What tells a retry of a publish from another publish of the same task: its
    arguments, as kombu's JSON (their ``repr`` when JSON cannot carry them)."""
    try:
        return dumps([list(args or ()), dict(kwargs or {})])
    except (TypeError, ValueError):
        return repr((args, kwargs))


def take_position(ctx: ExecutionContext, name: str, request: str | None = None) -> Position:
    """The position of this publish of ``name`` from the body: the n-th in the delivery,
    or inside an undo the n-th of that undo (a delivery that continues the undos after a
    crash skips those already done, so a position in the delivery would shift). A retry
    of a publish whose send raised (the same ``request``) takes that one's position."""
    undo = getattr(ctx, "current", None)
    prefix = ""  # ``<undo key>/`` inside an undo
    if undo is not None and not sabotage.active(UNDO_PUBLISHES_COUNTED_IN_THE_DELIVERY):
        prefix = f"{undo.key}/"
    counted_as = f"{prefix}{name}"
    with _refused_lock:
        left = _refused.get(ctx, {}).pop(counted_as, None)
    if left is not None and request is not None and left[1] == request:
        ctx.give_back_publish(counted_as, left[0])  # False: a later one was taken since
    n = ctx.next_publish(counted_as)
    return Position(ctx, counted_as, n, f"{prefix}publish/{name}#{n}")


def publish_position(ctx: ExecutionContext, name: str) -> str:
    """``take_position``'s text, for a publish that never gives its position back."""
    return take_position(ctx, name).text


# --- canvases ---------------------------------------------------------------------------


class _Refused(Exception):
    """The canvas holds something that is not a task's signature."""


@dataclass(frozen=True)
class CanvasPlan:
    """A canvas as it will be recorded and sent: JSON, every id fixed by ``fix_ids``."""

    kind: str  # chain, group or chord
    data: dict[str, Any]
    call: dict[str, Any]  # args, kwargs and publish options of the apply

    @property
    def name(self) -> str:
        """What its position is counted by: the kind and its first task's name."""
        return f"{self.kind}:{self.leaves()[0]['task']}"

    def leaves(self) -> list[dict[str, Any]]:
        return [leaf for _, leaf in self._parts()]

    def _parts(self) -> Iterator[tuple[str, dict[str, Any]]]:
        kwargs = self.data["kwargs"]
        if self.kind == "chord":
            for n, leaf in enumerate(_header_tasks(kwargs["header"])):
                yield f"header/{n}", leaf
            yield "body", kwargs["body"]
            return
        for n, leaf in enumerate(kwargs["tasks"]):
            yield str(n), leaf

    def fix_ids(self, derive: Callable[[str], str]) -> dict[str, Any]:
        """Give every task, and the group, an id (one the caller chose stays); what the
        result handed back is built from."""
        fixed: dict[str, Any] = {"kind": self.kind, "group": None, "tasks": [], "body": None}
        for part, leaf in self._parts():
            task_id = _options(leaf).setdefault("task_id", derive(part))
            if part == "body":
                fixed["body"] = task_id
            else:
                fixed["tasks"].append(task_id)
        if self.kind == "group":
            fixed["group"] = _options(self.data).setdefault("task_id", derive("group"))
        elif self.kind == "chord":
            header = self.data["kwargs"]["header"]
            given = _options(header).get("task_id") if isinstance(header, dict) else None
            gid = given or derive("header")
            if isinstance(header, dict):
                _options(header)["task_id"] = gid
            # A header given as a list becomes a group named by the chord's own task id.
            _options(self.data)["task_id"] = fixed["group"] = gid
        return fixed


def _options(sig: dict[str, Any]) -> dict[str, Any]:
    options = sig.get("options")
    if not isinstance(options, dict):
        options = sig["options"] = {}
    return options


def _header_tasks(header: Any) -> list[Any]:
    if isinstance(header, dict):
        if header.get("subtask_type") != "group":
            raise _Refused(str(header.get("subtask_type") or "a task"))
        return list(header["kwargs"]["tasks"])
    return list(header or ())


def _check_leaves(sigs: list[Any]) -> None:
    for sig in sigs:
        kind = sig.get("subtask_type") if isinstance(sig, dict) else None
        if kind or not isinstance(sig, dict) or not isinstance(sig.get("task"), str):
            raise _Refused(str(kind or type(sig).__name__))


def plan_canvas(canvas: Any, args: Any, kwargs: Any, options: dict[str, Any]) -> CanvasPlan | None:
    """The canvas ``canvas.apply_async(args, kwargs, **options)`` would publish, as JSON;
    None when it holds no task (nothing to publish). ``ConfigurationError`` for a canvas
    holding another canvas, and for one that JSON cannot carry."""
    kind = str(canvas.get("subtask_type"))
    call_kwargs = dict(kwargs or {})
    body = call_kwargs.pop("body", None) if kind == "chord" else None
    publish = {k: v for k, v in options.items() if k not in _TRANSPORT_OPTIONS}
    given = publish.pop("task_id", None)
    publish.pop("add_to_parent", None)
    if kind == "group" and (publish.get("link") or publish.get("link_error")):
        raise TypeError("Cannot add link to group: use a chord")  # Celery's own refusal
    try:
        data = loads(dumps(canvas))
        if body is not None:
            data["kwargs"]["body"] = loads(dumps(body))
        call = loads(dumps({"args": list(args or ()), "kwargs": call_kwargs, "options": publish}))
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"a {kind} published from a PaymentTask's body is recorded as JSON (kombu's), and "
            f"this one cannot be: {exc}",
        ) from None
    given = given or _options(data).pop("task_id", None)
    try:
        plan = _plan(kind, data, call)
    except _Refused as inner:
        raise ConfigurationError(
            f"a {kind} published from a PaymentTask's body holds a {inner}: a canvas inside a "
            "canvas cannot be given task ids that stay the same on every re-run (Celery "
            "gives its tasks ids of its own as it runs), so a re-run would publish them "
            "again. Publish its first task from the body (a PaymentTask published from a "
            "body gets a stable id) with the rest linked to it (link=...), or enqueue that "
            "task with celery_agboss.outbox.enqueue in a fenced effect",
            canvas=kind,
        ) from None
    if plan is None:
        return None
    if given:  # the caller's id: the chain's last task, the group, the chord's body
        target = data if kind == "group" else plan.leaves()[-1]
        _options(target)["task_id"] = str(given)
    return plan


def _plan(kind: str, data: dict[str, Any], call: dict[str, Any]) -> CanvasPlan | None:
    kwargs = data.get("kwargs") or {}
    if kind == "chord":
        _check_leaves(_header_tasks(kwargs.get("header")))
        body = kwargs.get("body")
        if body is None:
            raise ConfigurationError(
                "a chord needs a body: chord(header)(body) or chord(header, body)"
            )
        _check_leaves([body])
        if not _header_tasks(kwargs.get("header")):
            return None
    elif kind in ("chain", "group"):
        kwargs["tasks"] = list(kwargs.get("tasks") or ())
        _check_leaves(kwargs["tasks"])
        if not kwargs["tasks"]:
            return None
    else:
        raise _Refused(kind)
    return CanvasPlan(kind, data, call)


def publish_canvas(runtime: Runtime, ctx: ExecutionContext, plan: CanvasPlan) -> Any:
    """Publish ``plan`` once for this execution and position; the result Celery's apply
    returns (an ``AsyncResult`` for a chain or chord, a ``GroupResult`` for a group)."""
    position = publish_position(ctx, plan.name)
    fixed = plan.fix_ids(lambda part: derived_task_id(ctx.execution_id, f"{position}/{part}"))
    row = derived_task_id(ctx.execution_id, position)
    store = ctx.store
    offset_ms = store.offset_ms() if isinstance(store, SQLAlchemyStore) else 0

    def record(conn: Any) -> dict[str, Any]:
        outbox.record_canvas(
            conn,
            runtime.app,
            row,
            plan.data,
            plan.call,
            execution_id=ctx.execution_id,
            offset_ms=offset_ms,
        )
        return fixed

    recorded = ctx.fenced_effect(f"{PUBLISH_EFFECT}/{row}", record)
    outbox.publish(runtime.app, row)  # sends nothing once the row is marked published
    return _result(runtime.app, recorded)


def _result(app: Any, fixed: dict[str, Any]) -> Any:
    """What Celery's apply of the recorded canvas returns, rebuilt from its ids."""
    tasks = [app.AsyncResult(task_id) for task_id in fixed["tasks"]]
    if fixed["kind"] == "chain":
        for parent, child in itertools.pairwise(tasks):
            child.parent = parent
        return tasks[-1]
    header = app.GroupResult(fixed["group"], tasks)
    if fixed["kind"] == "group":
        return header
    return app.AsyncResult(fixed["body"], parent=header)


# --- the hook on Celery's canvases ---------------------------------------------------------


def _publishing_body(canvas: Any) -> tuple[Runtime, ExecutionContext] | None:
    """The runtime and the delivery when ``canvas`` is published from a body, else None."""
    if outbox.sending_canvas() or sabotage.active(BODY_PUBLISHES_GET_NEW_IDS):
        return None
    ctx = body_context()
    if ctx is None:
        return None
    current = get_current_worker_task()
    try:
        runtime = Runtime.of(current.app)
    except ConfigurationError:
        return None
    if canvas.app.conf.task_always_eager:
        # Run in process, nothing published: each PaymentTask in it takes its position
        # and derived id in ``apply`` (``signals.publish.key_in_process_runs``).
        return None
    return runtime, ctx


def _hooked(original: Callable[..., Any]) -> Callable[..., Any]:
    parameters = inspect.signature(original)

    @functools.wraps(original)
    def apply_async(self: Any, *given: Any, **named: Any) -> Any:
        where = _publishing_body(self)
        if where is not None:
            # Each canvas names its own publish options (a chord's task_id, a group's
            # producer…): read them as Celery would, however they were passed.
            bound = dict(parameters.bind(self, *given, **named).arguments)
            bound.pop("self", None)
            args, kwargs = bound.pop("args", None), bound.pop("kwargs", None)
            options = {**bound.pop("options", {}), **bound}
            plan = plan_canvas(self, args, kwargs, options)
            if plan is not None:
                return publish_canvas(*where, plan)
        return original(self, *given, **named)

    apply_async._agboss_body_publishes = True  # type: ignore[attr-defined]
    return apply_async


def install() -> None:
    """Hook the publish of Celery's canvases (once per process; a canvas published
    anywhere but a ``PaymentTask``'s body goes to Celery unchanged)."""
    for cls in (_chain, group, _chord):
        current = vars(cls)["apply_async"]
        if not getattr(current, "_agboss_body_publishes", False):
            cls.apply_async = _hooked(current)


__all__ = [
    "CanvasPlan",
    "Position",
    "body_context",
    "derived_task_id",
    "install",
    "plan_canvas",
    "refuse_a_new_id_from_a_body",
    "refuse_if_cancelled",
    "request_of",
    "take_position",
]
