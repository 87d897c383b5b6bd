"""``PaymentTask``: the base class of every Celery task that moves money.

The body runs again from the top on every delivery (a redelivery, a re-publish, a
retry), so every effect in it must go through ``self.outbound(...)`` (a call to
another system: recorded, sent once, reconciled) or ``self.fenced_effect(...)`` (a
write to the store's own database, once per key). Code between them runs again
and must be harmless to repeat.

Declared with ``bind=True`` (refused otherwise, when the task class is made), and
with ``acks_late=True`` and ``reject_on_worker_lost=True`` by default, so that a
killed worker's message comes back instead of being acknowledged as failed (design: trap 4).
Per-delivery state lives on ``self.request`` only: one task instance serves every
thread of a threads pool at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from celery import Task
from celery.canvas import Signature
from celery.exceptions import Ignore, Reject

from celery_agboss.core import compensation, sabotage
from celery_agboss.core.execution_context import ExecutionContext
from celery_agboss.core.executions import ExecutionState
from celery_agboss.core.log_events import RESULT_BACKEND_FAILURE_WITHHELD, log_event
from celery_agboss.core.outbound import OutboundCall, Outcome
from celery_agboss.core.protections import (
    BEFORE_START_OUTSIDE_THE_DELIVERY,
    EAGER_IGNORE_READ,
    FAILURE_FOR_AN_UNFINISHED_EXECUTION,
    NESTED_DIRECT_CALL_ALLOWED,
    PACKAGE_RETRIES_COUNTED,
    REPLACE_HANDED_TO_CELERY,
    RETRY_KEEPS_EXPIRES,
    RETRY_PUBLISH_FAILURE_REJECTS,
)
from celery_agboss.core.step_identity import refuse_reserved_effect_name
from celery_agboss.core.undo_steps import check_undo_name, undo_registry
from celery_agboss.delivery.lifecycle import BEFORE_START_ERROR, CONTEXT_ATTRIBUTE, Delivery
from celery_agboss.delivery.link_ends import after_a_failure, links_sent
from celery_agboss.delivery.waits import (
    OWN_RETRIES_HEADER,
    UNBOUNDED_RETRIES,
    application_retries,
    own_retries,
    retry_delay,
)
from celery_agboss.errors import (
    ConfigurationError,
    ExecutionNotFinishedError,
    LongWaitRequested,
    PauseRequested,
    RetryNotPublished,
    StoreError,
)
from celery_agboss.outbox import publishing as outbox
from celery_agboss.outbox.undo_tasks import undo_task_parts
from celery_agboss.runtime.app_runtime import Runtime
from celery_agboss.runtime.messages import dumps, loads

logger = logging.getLogger("celery_agboss")

T = TypeVar("T")


def _refuse_unbound(cls: type[Any]) -> None:
    """``@app.task(base=PaymentTask)`` without ``bind=True`` makes ``run`` a staticmethod."""
    run = cls.__dict__.get("run")
    if isinstance(run, staticmethod):
        name = cls.__dict__.get("name") or cls.__qualname__
        raise ConfigurationError(
            f"PaymentTask {name!r} must be declared with bind=True: "
            f"@app.task(base=PaymentTask, bind=True) — its body calls self.outbound() "
            "and self.fenced_effect()",
            task=str(name),
        )


def _raised_in_the_body(hook: Callable[..., Any]) -> Callable[..., Any]:
    """A task's ``before_start`` as a ``PaymentTask`` runs it: Celery calls it before the
    delivery, where its exception would fail only the message (acknowledged, the execution
    left ``REQUESTED`` for the sweep to re-publish for ever). Kept on the request instead,
    and raised as the body's first act (design: what fails an execution)."""
    if getattr(hook, "_agboss_in_the_body", False):
        return hook

    def before_start(self: Any, task_id: str, args: Any, kwargs: Any) -> None:
        if sabotage.active(BEFORE_START_OUTSIDE_THE_DELIVERY):
            hook(self, task_id, args, kwargs)
            return
        try:
            hook(self, task_id, args, kwargs)
        except Exception as exc:
            setattr(self.request, BEFORE_START_ERROR, exc)

    before_start._agboss_in_the_body = True  # type: ignore[attr-defined]
    before_start.__wrapped__ = hook  # type: ignore[attr-defined]
    return before_start


class _FailureOnlyWhenFailed:
    """The result backend as a ``PaymentTask`` writes to it: ``FAILURE`` (and with it the
    errbacks, the chain's failure, a chord part counted as failed) only for an execution
    the store holds ``FAILED``. Celery writes FAILURE on its own in several places — a
    hard time limit (from the worker's main process), a retry whose publish failed, a
    ``Reject(requeue=False)`` — while the execution is only waiting, or about to be
    continued; an errback that refunds the order would then refund a paid one."""

    def __init__(self, backend: Any, task: PaymentTask) -> None:
        self._backend = backend
        self._task = task

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def mark_as_failure(self, task_id: str, exc: BaseException, *args: Any, **kwargs: Any) -> Any:
        if self._failed(task_id) or sabotage.active(FAILURE_FOR_AN_UNFINISHED_EXECUTION):
            return self._backend.mark_as_failure(task_id, exc, *args, **kwargs)
        log_event(
            RESULT_BACKEND_FAILURE_WITHHELD,
            logging.WARNING,
            "the task raised, but the execution is not FAILED: nothing written to the result "
            "backend, no errback fired",
            execution_id=task_id,
            task=self._task.name,
            error=type(exc).__name__,
        )
        return None

    def _failed(self, task_id: str) -> bool:
        try:
            record = Runtime.of(self._task.app).executions.read_execution(task_id)
        except (Exception, StoreError):
            return False  # unknown: never a FAILURE on a guess (the store decides later)
        return record is None or record.state is ExecutionState.FAILED


UndoFunctionT = TypeVar("UndoFunctionT", bound=Callable[..., Any])


def undo_function(app: Any, name: str) -> Callable[[UndoFunctionT], UndoFunctionT]:
    """Register ``fn(task, undo, **arguments)`` as the undo ``name`` of ``app``'s payment
    tasks (``self.undo_with(name, ...)``); every worker must import it. ``undo`` is an
    ``UndoStep``: its ``key`` is what a refund inside it is keyed by, by default."""

    def register(fn: UndoFunctionT) -> UndoFunctionT:
        compensation.undo_registry(app).register(name, fn)
        return fn

    return register


def execution_context_of(request: Any) -> ExecutionContext | None:
    """The execution a delivery is running in (None outside a ``PaymentTask``'s body):
    what ``self.outbound()`` and a publish from the body belong to."""
    ctx: ExecutionContext | None = getattr(request, CONTEXT_ATTRIBUTE, None)
    return ctx


class PaymentTask(Task):  # type: ignore[misc]  # celery has no type information
    """A Celery task whose payment side effects happen exactly once (see the module doc)."""

    abstract = True
    acks_late = True
    reject_on_worker_lost = True
    # A hard time limit kills the child mid-body: the message is given back, not
    # acknowledged as failed; every take-over counts toward the recovery cap, so a body
    # that always overruns its limit ends PARKED, visibly.
    acks_on_timeout = False
    # Celery 5.7's task_retry_on_worker_lost publishes a retry of a killed child's task
    # from the main process: it would count against the body's own max_retries (crashes
    # could end an execution FAILED, its undos run) and bypass PaymentTask.retry. A lost
    # worker is the message's redelivery and the sweep's to recover, never a retry.
    retry_on_worker_lost = False
    # (Celery < 5.7 has no acks_on_timeout: the worker request below does it, for every
    # version, from the worker's main process.)
    Request = "celery_agboss.delivery.time_limits:PaymentRequest"

    @property
    def backend(self) -> Any:
        """Celery's result backend, writing FAILURE only for a FAILED execution."""
        return _FailureOnlyWhenFailed(Task.backend.fget(self), self)

    @backend.setter
    def backend(self, value: Any) -> None:
        Task.backend.fset(self, value)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _refuse_unbound(cls)

    @classmethod
    def on_bound(cls, app: Any) -> None:
        """Say so when a task's options or the app's annotations turned off what brings a
        killed worker's message back: still paid once, but only the sweep recovers it."""
        super().on_bound(app)
        # Celery applied the app's annotations before this: the hook it will call is
        # resolved now, wherever it came from (the class, a mixin, an annotation), and
        # wrapped once, so a super() chain inside it runs as written.
        hook = getattr(cls, "before_start", None)
        if callable(hook) and hook is not Task.before_start and not cls.__dict__.get("abstract"):
            cls.before_start = _raised_in_the_body(hook)
        off = [name for name in ("acks_late", "reject_on_worker_lost") if not getattr(cls, name)]
        if off and not cls.__dict__.get("abstract"):
            logger.warning(
                "PaymentTask %s has %s off: a message whose worker dies is not redelivered, "
                "and only the sweep (beat, or the workers' own) continues its execution",
                cls.name,
                " and ".join(off),
            )

    # --- the delivery -------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        if getattr(request, "id", None) is None or getattr(request, "called_directly", True):
            raise ConfigurationError(
                f"PaymentTask {self.name!r} runs only as a Celery task (delay, apply_async, "
                "apply): called directly, its effects would have no execution to belong to"
            )
        if execution_context_of(request) is not None and not sabotage.active(
            NESTED_DIRECT_CALL_ALLOWED
        ):
            raise ConfigurationError(
                f"PaymentTask {self.name!r} was called directly inside its own running body: "
                "that is the same execution, which this delivery already runs. Publish "
                "another execution (delay, apply_async) for another payment"
            )
        runtime = Runtime.of(self.app)
        try:
            return Delivery(self, runtime, request).run(args, kwargs)
        except Ignore:
            if not getattr(request, "is_eager", False) or sabotage.active(EAGER_IGNORE_READ):
                raise
            # Eager: Celery would read an Ignore as a result of None. Say where it is.
            record = runtime.executions.read_execution(str(request.id))
            state = "unknown" if record is None else record.state.value
            raise ExecutionNotFinishedError(
                f"{self.name}[{request.id}] did not finish in this eager run: the execution "
                f"is {state}"
                + ("" if record is None or not record.reason else f" ({record.reason})")
                + ". A worker (or the sweep) continues it; nothing was returned",
                execution_id=str(request.id),
                state=state,
            ) from None

    # --- what the body calls ----------------------------------------------------------------

    def _context(self) -> ExecutionContext:
        ctx = execution_context_of(self.request)
        if not isinstance(ctx, ExecutionContext):
            raise ConfigurationError(
                f"{self.name}: outbound(), fenced_effect() and pause() work only inside the "
                "task body, while a delivery runs"
            )
        return ctx

    def outbound(self, call: OutboundCall, request: Any, business_key: str | None = None) -> Any:
        """Send ``request`` through ``call`` exactly once; the gateway's result.

        Recorded as an intent before it is sent; a pending intent is reconciled (looked
        up) before anything is sent again; a stored result is replayed. The call is
        registered (its name checked against the app's other calls) on its first use,
        once, by the context, before anything is recorded.
        """
        return self._context().outbound(call, request, business_key=business_key)

    def fenced_effect(
        self,
        name: str,
        fn: Callable[[Any], T],
        business_key: str | None = None,
        request: Any = None,
    ) -> T:
        """Run ``fn(conn)`` once per key inside the transaction that checks the lease;
        its JSON result is stored and returned again on every later run. The follow-up
        tasks ``fn`` wrote with ``celery_agboss.outbox.enqueue`` are published once that
        transaction committed, never before. Names starting ``agboss.`` are the package's."""
        refuse_reserved_effect_name(name)
        return self._run_fenced_effect(name, fn, business_key=business_key, request=request)

    def _run_fenced_effect(
        self,
        name: str,
        fn: Callable[[Any], T],
        business_key: str | None = None,
        request: Any = None,
    ) -> T:
        """``fenced_effect`` under any name: the package's own effects (undo tasks) too."""
        ctx = self._context()
        business_key = ctx.business_key_for(business_key)  # the outbox keys fn's enqueues by it
        return outbox.run_fenced_effect(
            self.app, ctx, name, fn, business_key=business_key, request=request
        )

    def undo_with(self, undo: str | Signature, /, **arguments: Any) -> None:
        """Declare the undo of the step that just returned (the last ``outbound()`` or
        ``fenced_effect()``): the undo function registered as ``undo`` (``undo_function``),
        called with these JSON ``arguments`` if the execution fails for real after it, or
        is cancelled. Stored under the lease, so it survives a crash; it runs once, under
        ``<step key>:compensation``, the default business key of the calls it makes.
        ``undo`` may be a Celery signature instead (``refund.s(payment_id)``, JSON
        arguments): it is then published once, under a task id derived from that key."""
        ctx = self._context()
        if isinstance(undo, Signature):
            parts = undo_task_parts(undo)
            compensation.declare_undo(ctx, parts["task"], arguments, task=parts)
            return
        check_undo_name(undo)
        try:
            # Checked here, not when the body fails: a name nobody registered (a typo)
            # would leave the step's payment waiting for an operator, never undone.
            undo_registry(self.app).require(undo)
        except ConfigurationError as exc:
            raise ConfigurationError(
                f"{self.name}: self.undo_with({undo!r}) refused: {exc}. The name is the one "
                "given to undo_function(app, name), which must run before this body does",
                task=self.name,
                undo=undo,
            ) from None
        compensation.declare_undo(ctx, undo, arguments)

    def retry(
        self,
        args: Any = None,
        kwargs: Any = None,
        exc: BaseException | None = None,
        throw: bool = True,
        eta: Any = None,
        countdown: float | None = None,
        max_retries: int | None = None,
        **options: Any,
    ) -> Any:
        """Celery's ``retry()``, with three differences inside a delivery. ``max_retries``
        counts the application's retries only (``self.retry()``, ``autoretry_for``), never
        celery_agboss's own. A wait longer than half the shortest visibility timeout is
        kept in the store, not in a broker message (design: trap 1): the execution waits
        ``WAITING`` and the sweep publishes it again when it is due. The retry carries no
        ``expires``: an execution that started (and may have charged) continues whatever
        its ``expires`` (design: expires bounds the start); pass one to bound the retry."""
        if not sabotage.active(RETRY_KEEPS_EXPIRES):
            options.setdefault("expires", None)
        given: dict[str, Any] = dict(
            args=args, kwargs=kwargs, exc=exc, throw=throw, eta=eta, countdown=countdown, **options
        )
        request = self.request
        ctx = execution_context_of(request)
        if not isinstance(ctx, ExecutionContext) or getattr(request, "is_eager", False):
            return super().retry(max_retries=max_retries, **given)
        delay = retry_delay(self.name, countdown, eta, self.default_retry_delay)
        if countdown is not None:
            given["countdown"] = delay  # a timedelta too: Celery takes only a number
        limit = self.max_retries if max_retries is None else max_retries
        counted = (
            int(request.retries or 0)
            if sabotage.active(PACKAGE_RETRIES_COUNTED)
            else application_retries(request)
        )
        if limit is not None and counted + 1 > limit:
            if exc is not None:
                raise exc
            raise self.MaxRetriesExceededError(
                f"Can't retry {self.name}[{request.id}]: {counted} retries of max_retries={limit}",
                task_args=request.args,
                task_kwargs=request.kwargs,
            )
        if delay > Runtime.of(self.app).settings.max_broker_countdown_seconds:
            raise LongWaitRequested(delay, args, kwargs)
        return self._retry_checked(delay, **given)

    def _retry_checked(self, delay: float, **options: Any) -> Any:
        """Celery's retry once the budget was checked here: unbounded for Celery, and
        Celery's memory of that bound (``override_max_retries``, which ``autoretry_for``
        reads on the shared task object) put back as it was. A publish that fails is a
        ``RetryNotPublished``, not Celery's ``Reject(requeue=False)``."""
        state: dict[str, Any] = self.__dict__
        had = "override_max_retries" in state
        before = state.get("override_max_retries")
        try:
            return super().retry(max_retries=UNBOUNDED_RETRIES, **options)
        except Reject as refused:
            if sabotage.active(RETRY_PUBLISH_FAILURE_REJECTS):
                raise
            raise RetryNotPublished(
                delay, refused.reason or refused, options.get("args"), options.get("kwargs")
            ) from None
        finally:
            if had:
                state["override_max_retries"] = before
            else:
                state.pop("override_max_retries", None)

    def package_retry(self, delay: float) -> Any:
        """celery_agboss's own retry of this delivery (an unknown outcome, a store
        outage): one more in the ``agboss_retries`` header, outside the application's
        ``max_retries``, with no ``expires``."""
        request = self.request
        headers = {
            **(getattr(request, "headers", None) or {}),
            OWN_RETRIES_HEADER: own_retries(request) + 1,
        }
        return self._retry_checked(delay, countdown=delay, expires=None, headers=headers)

    def replace(self, sig: Any) -> Any:
        """Refused: Celery's ``replace()`` hands this task id to another signature, which
        would then find this execution recorded and replay its result instead of running
        (three installments would make one payment, and a chain would get ``None``)."""
        if sabotage.active(REPLACE_HANDED_TO_CELERY):
            return super().replace(sig)
        raise ConfigurationError(
            f"PaymentTask {self.name!r} cannot use self.replace(): the replacement would run "
            "under this execution's id and replay its stored result instead of running. "
            "Publish the follow-up from the body instead (a PaymentTask's .delay() from a "
            "body gets an id of its own, stable across re-runs) and return, or link it "
            "(link=...) when you publish this task",
            task=self.name,
        )

    @property
    def last_outcome(self) -> Outcome | None:
        """How the last outbound call of this delivery got its result."""
        ctx = execution_context_of(self.request)
        return ctx.last_outcome if isinstance(ctx, ExecutionContext) else None

    def pause(self, name: str, payload: Any = None, *, accept_early: bool = False) -> Any:
        """End this delivery ``PAUSED`` the first time; return the answer once answered.

        ``answer_pause(app, "<execution id>:<name>", answer)`` answers it (once) and
        publishes the task again. ``accept_early``: an answer given before the body got
        here (a 3-D Secure return racing the task) is kept and taken now, and the body goes
        on in this delivery; never for an approval, whose answerer must see ``payload``.
        """
        if accept_early and ":" in name:
            raise ConfigurationError(
                f"pause name {name!r} has a ':': an early answer finds its execution by the "
                "part of the pause id before the last ':'. Name the pause without one",
                task=self.name,
            )
        ctx = self._context()
        name = ctx.pause_name(name)  # an undo's pause is its own
        executions = Runtime.of(self.app).executions
        # A store failure or a cancel met here stops the delivery too: a body that swallowed
        # it would otherwise go on to charge with its approval never asked.
        with ctx.stop_on_signal(), ctx.fenced() as tx:
            ctx.check_cancel(tx)
            ctx.pass_failures()  # waiting for a person is going on past a failure
            answered, answer = executions.pause_in(
                tx, name, None if payload is None else dumps(payload), accept_early=accept_early
            )
        if answered:
            return None if answer is None else loads(answer)
        raise ctx.stop(PauseRequested(name))  # a body that swallows it still stops here

    # --- Celery's hooks ----------------------------------------------------------------------

    def delay_on_commit(self, *args: Any, **kwargs: Any) -> None:
        """Celery's ``DjangoTask.delay_on_commit`` for a payment task. Inside Django's
        ``atomic`` on the store's alias a plain ``delay()`` is already recorded in that
        transaction and sent once it commits (contrib.django); elsewhere it is sent now.
        Returns None, as Celery's does."""
        self.apply_async(args, kwargs)

    def apply_async_on_commit(self, args: Any = None, kwargs: Any = None, **options: Any) -> None:
        """Celery's ``DjangoTask.apply_async_on_commit``: see :meth:`delay_on_commit`."""
        self.apply_async(args, kwargs, **options)

    def on_success(self, retval: Any, task_id: str, args: Any, kwargs: Any) -> None:
        """Called after Celery sent the chain and callbacks: replays must not send them."""
        links_sent(self, task_id)

    def on_failure(
        self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any
    ) -> None:
        """The errbacks went out only with a FAILURE written; a failure held back for a
        completed execution (its links' send raised) hands the message back instead."""
        after_a_failure(self, exc, task_id, einfo)


__all__ = ["PaymentTask", "undo_function"]
