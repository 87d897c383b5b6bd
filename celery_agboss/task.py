"""``PaymentTask``: the base class of every Celery task that moves money.

The body runs again from the top on every delivery (a redelivery, a re-publish, a
retry), so every effect in it must go through ``self.outbound(...)`` (a call to
another system: recorded, sent once, reconciled) or ``self.fenced_effect(...)`` (a
write to the store's own database, once per key). Code between them runs again
and must be harmless to repeat.

Declared with ``bind=True`` (refused otherwise, when the task class is made), and
with ``acks_late=True`` and ``reject_on_worker_lost=True`` by default, so that a
killed worker's message comes back instead of being acknowledged as failed (trap 4).
Per-delivery state lives on ``self.request`` only: one task instance serves every
thread of a threads pool at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from celery import Task

from celery_agboss.core import sabotage
from celery_agboss.core.execution import ExecutionContext
from celery_agboss.core.outbound import OutboundCall, Outcome
from celery_agboss.delivery import CONTEXT_ATTRIBUTE, Delivery, PauseRequested
from celery_agboss.errors import ConfigurationError, StoreError
from celery_agboss.messages import dumps, loads
from celery_agboss.waits import LongWaitRequested, seconds_until

logger = logging.getLogger("celery_agboss")

RETRY_KEEPS_EXPIRES = sabotage.register("retry-keeps-expires")
"""Sabotage (DESIGN §2.1): ``self.retry()`` carries the message's ``expires``, so a retry
after it is dropped by the worker while the execution, charged, waits for it."""

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


class PaymentTask(Task):  # type: ignore[misc]  # celery has no type information
    """A Celery task whose payment side effects happen exactly once (see the module doc)."""

    abstract = True
    acks_late = True
    reject_on_worker_lost = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _refuse_unbound(cls)

    # --- the delivery -------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        if getattr(request, "id", None) is None or getattr(request, "called_directly", True):
            raise ConfigurationError(
                f"PaymentTask {self.name!r} runs only as a Celery task (delay, apply_async, "
                "apply): called directly, its effects would have no execution to belong to"
            )
        from celery_agboss.app import AGBoss

        return Delivery(self, AGBoss.of(self.app), request).run(args, kwargs)

    # --- what the body calls ----------------------------------------------------------------

    def _context(self) -> ExecutionContext:
        ctx = getattr(self.request, CONTEXT_ATTRIBUTE, None)
        if not isinstance(ctx, ExecutionContext):
            raise ConfigurationError(
                f"{self.name}: outbound(), fenced_effect() and pause() work only inside the "
                "task body, while a delivery runs"
            )
        return ctx

    def outbound(self, call: OutboundCall, request: Any, business_key: str | None = None) -> Any:
        """Send ``request`` through ``call`` exactly once; the gateway's result.

        Recorded as an intent before it is sent; a pending intent is reconciled (looked
        up) before anything is sent again; a stored result is replayed.
        """
        from celery_agboss.app import AGBoss

        AGBoss.of(self.app).register(call)
        return self._context().outbound(call, request, business_key=business_key)

    def fenced_effect(
        self,
        name: str,
        fn: Callable[[Any], T],
        business_key: str | None = None,
        request: Any = None,
    ) -> T:
        """Run ``fn(conn)`` once per key inside the transaction that checks the lease;
        its JSON result is stored and returned again on every later run."""
        return self._context().fenced_effect(
            name, fn, business_key=business_key, request=request
        )

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
        """Celery's ``retry()``, except that a wait longer than half the shortest
        visibility timeout is kept in the store, not in a broker message (trap 1): the
        execution waits ``WAITING`` and the sweep publishes it again when it is due. The
        retry carries no ``expires``: an execution that started (and may have charged)
        continues whatever its ``expires`` (DESIGN §2.1); pass one to bound the retry."""
        if not sabotage.active(RETRY_KEEPS_EXPIRES):
            options.setdefault("expires", None)
        ctx = getattr(self.request, CONTEXT_ATTRIBUTE, None)
        if isinstance(ctx, ExecutionContext) and not getattr(self.request, "is_eager", False):
            from celery_agboss.app import AGBoss

            delay = seconds_until(eta if countdown is None and eta is not None else countdown)
            if countdown is None and eta is None:
                delay = float(self.default_retry_delay or 0)
            limit = self.max_retries if max_retries is None else max_retries
            exhausted = limit is not None and int(self.request.retries or 0) >= limit
            if delay > AGBoss.of(self.app).settings.max_broker_countdown_seconds and not exhausted:
                raise LongWaitRequested(delay, args, kwargs)
        return super().retry(
            args=args, kwargs=kwargs, exc=exc, throw=throw, eta=eta, countdown=countdown,
            max_retries=max_retries, **options,
        )

    @property
    def last_outcome(self) -> Outcome | None:
        """How the last outbound call of this delivery got its result."""
        ctx = getattr(self.request, CONTEXT_ATTRIBUTE, None)
        return ctx.last_outcome if isinstance(ctx, ExecutionContext) else None

    def pause(self, name: str, payload: Any = None) -> Any:
        """End this delivery ``PAUSED`` the first time; return the answer once answered.

        ``answer_pause(app, "<execution id>:<name>", answer)`` answers it (once) and
        publishes the task again.
        """
        from celery_agboss.app import AGBoss

        ctx = self._context()
        executions = AGBoss.of(self.app).executions
        with ctx.fenced() as tx:
            answered, answer = executions.pause_in(
                tx, name, None if payload is None else dumps(payload)
            )
        if answered:
            return None if answer is None else loads(answer)
        raise PauseRequested(name)

    # --- Celery's hooks ----------------------------------------------------------------------

    def on_success(self, retval: Any, task_id: str, args: Any, kwargs: Any) -> None:
        """Called after Celery sent the chain and callbacks: replays must not send them."""
        self._links_sent(task_id)

    def on_failure(
        self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any
    ) -> None:
        self._links_sent(task_id)

    def _links_sent(self, task_id: str) -> None:
        from celery_agboss.app import AGBoss

        try:
            AGBoss.of(self.app).executions.mark_links_dispatched(task_id)
        except (StoreError, ConfigurationError):
            logger.warning("could not record that %s sent its links", task_id, exc_info=True)


__all__ = ["PaymentTask"]
