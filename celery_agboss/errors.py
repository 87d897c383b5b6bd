"""Every exception celery_agboss raises, in one place.

Two families. ``AGBossSignal`` derives from ``BaseException`` on purpose: it means
"not known yet" or "this delivery must stop", and a bare ``except Exception`` in a
task body must not be able to turn it into a failure. ``AGBossError`` is ordinary
bad input or misuse. Every class pickles with its fields (Celery result backends
store exceptions), and each docstring is its default message.

A third group, at the end, never reaches users: control flow raised and caught
inside celery_agboss (a pause or a long wait that ends a delivery, a publish the
store refused, a lookup with no answer).
"""

from __future__ import annotations

from typing import Any


class _Fielded(BaseException):
    """Mixin: keyword fields kept as attributes, the message as the only arg, pickles whole."""

    def __init__(self, message: str | None = None, **fields: Any) -> None:
        self.fields = dict(fields)
        for name, value in fields.items():
            setattr(self, name, value)
        super().__init__(
            message or (type(self).__doc__ or type(self).__name__).strip().splitlines()[0]
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.args[0] if self.args else None, self.fields))


def _rebuild(cls: type[Any], message: str | None, fields: dict[str, Any]) -> Any:
    return cls(message, **fields)


class AGBossSignal(_Fielded):
    """A delivery must stop here; what happened is decided from the store, not by this delivery."""


class AGBossError(_Fielded, Exception):
    """celery_agboss refused a request."""


# --- signals: never a failure of the execution ---------------------------------


class ExecutionFencedError(AGBossSignal):
    """This delivery no longer holds the execution's lease; another holder continues it."""


class OutboundCallOutcomeUnknownError(AGBossSignal):
    """The outbound call may or may not have reached the gateway; it will be reconciled."""


class OutboundCallInFlightError(AGBossSignal):
    """The outbound call is pending under a live lease held elsewhere; nothing was sent."""


class OutboundCallUnreconciledError(AGBossSignal):
    """Reconcile could not prove what happened; nothing was sent and an operator must decide."""


class OutboundCallResultNotStoredError(AGBossSignal):
    """The call completed but its result could not be stored; an operator must supply it."""


class OutboundCallFailureNotReplayableError(AGBossSignal):
    """A definite failure an earlier delivery went past cannot be raised again as it was;
    the body could take another path, so an operator decides."""


class CancelRequestedError(AGBossSignal):
    """A cancel was requested for this execution (a revoke, ``cancel()``): this delivery
    sends and writes nothing more; what is pending is reconciled, then it ends."""


class StoreError(AGBossSignal):
    """The store failed; what was committed is re-read from the store, never guessed.

    A signal, not an ``Exception``: inside a delivery a store failure means "this
    delivery must stop" (it is handed over, never recorded as the body's failure), and
    a body's ``except Exception`` fallback must not turn a payment the store could not
    record into a second payment elsewhere. Outside a delivery (the CLI, the sweep, an
    operator's script) catch it by name.
    """


class StoreUnavailableError(StoreError):
    """The store could not be reached, the connection broke or timed out, or a commit's
    outcome is unknown; a write may have committed."""


class StoreLockTimeoutError(StoreUnavailableError):
    """A row stayed locked longer than the fenced transaction's lock timeout: the store
    could not serve this transaction in time; nothing of it committed."""


class SealedValueUnopenableError(StoreUnavailableError):
    """A stored value is sealed with a key this process does not have, or it does not open
    with its key (moved from another row, or altered): the delivery waits for a process
    that has the key, as for an unreachable store; nothing is failed or undone.

    Fields: ``key_id`` (the key named in the value's envelope), ``table`` and ``column``.
    """


class EncryptionKeysMissingError(StoreUnavailableError):
    """The store is sealed (``agboss_meta`` says so) and this process has no
    ``agboss_encryption_keys``: it refuses to write plaintext and waits, as for an
    unreachable store, until it is started with the keys."""


# --- errors: bad input or misuse ----------------------------------------------


class IdempotencyKeyConflictError(AGBossError):
    """The same idempotency key was used with a different request; nothing was sent."""


class InvalidBusinessKeyError(AGBossError):
    """The business key was refused; normalise it where it enters your system."""

    # Typed fields (set per instance by ``core.keys``; defaults only for bare construction).
    rule: str = ""
    position: int | None = None
    code_point: str | None = None


class NotPausedError(AGBossError):
    """The pause is not waiting for an answer: already answered (early or not), its
    execution ended, or there is no such execution (``found=False``)."""


class MaskingPolicyError(AGBossError):
    """The masking policy failed, so nothing was stored (fail closed)."""

    # Typed fields (set per instance by ``core.masking``): which policy, field, and payload.
    policy: str = ""
    field: str | None = None
    what: str | None = None


class ConfigurationError(AGBossError):
    """celery_agboss is not configured correctly."""


class StoreNotMigratedError(ConfigurationError):
    """The store holds no deployment id: it was not migrated by this version (run
    ``celery -A <app> agboss migrate``). A worker waits for it: its deliveries are
    retried until then."""


class OutboundCallDefinitionError(AGBossError):
    """An OutboundCall was declared with invalid parameters."""


class OutboundCallCompensatedError(AGBossError):
    """This step was claimed by an undo, so its stored success is never handed out again.
    ``undone``: that undo is done (refunded, released…); False while it is not (its
    refund in flight, or refused and waiting for an operator). ``undo_by``: the execution
    that claimed it. Only when ``undone``, open a new attempt under a new business key
    (e.g. ``business_key=f"order:{order_id}:attempt:2"``) if the body must pay again;
    while it is not, re-raise: the first payment may never be refunded."""


class ExecutionIdConflictError(AGBossError):
    """This execution id belongs to another task; nothing of that task was run or returned.

    An execution (a Celery task id) belongs to one task name: ``refund.apply(task_id=…)``
    under the id of a charge must not be handed the charge's receipt."""


class PublishRefusedError(AGBossError):
    """The publish of a PaymentTask could not be recorded in the store, so nothing was
    published; publish again once the store answers (a message the broker lost before
    any worker started it would otherwise leave no trace)."""


class ExecutionNotFinishedError(AGBossError):
    """An eager run (``apply()``, ``task_always_eager``) ended without finishing the
    execution: it is paused, waiting (for an operator, a retry, a live delivery) or was
    cancelled. Nothing was returned; ``.state`` names where it is."""


class ResultNotStorableError(AGBossError):
    """The task's result cannot be stored (JSON cannot hold it), so the execution was not
    recorded as done; return JSON, or set ``result_serializer = "pickle"``."""


class LeaseNotHeldError(AGBossError):
    """The lease is held by another live delivery; this one must not run the body."""


class SabotageRefusedError(AGBossError):
    """Sabotage switches only work inside the test suite (AGBOSS_ALLOW_SABOTAGE=1 under pytest)."""


class FencedEffectConflictError(AGBossError):
    """A fenced effect's key was recorded by a step of another name; nothing was replayed."""


class CommitInsideFencedEffectError(AGBossError):
    """A fenced effect's function may not commit; its writes commit with the effect's record."""


class FencedEffectInsideAtomicError(AGBossError):
    """A fenced effect was called inside the body's own ``transaction.atomic()`` (Django):
    it would be a savepoint there, holding the lease row locked until the outer block
    ends. Call it outside any atomic block."""


class OutsideFenceWriteError(AGBossError):
    """A fenced effect's ``fn`` wrote to another database than the store's (a Django
    alias): that write would commit on its own, outside the fence. Nothing was written."""


class FaultInjected(AGBossError):
    """A test armed a fault point to raise here."""


class StoredFailureError(AGBossError):
    """The execution failed earlier; its original exception could not be rebuilt here."""


class OperatorRefusedError(AGBossError):
    """The operator command was refused and nothing was changed; the message says what to do.

    ``code`` names the reason for scripts: ``not-found``, ``pending-intent``,
    ``lease-live``, ``owner-live``, ``wrong-state``, ``conflict``, ``bad-input``.
    """


# --- control flow: raised and caught inside celery_agboss, never a user's ------


class PauseRequested(BaseException):
    """``self.pause()`` ends the delivery here; not an application failure."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


class UndoMustWait(BaseException):
    """An undo of a step another execution still uses waits for that one to end (the
    delivery stops here, ``COMPENSATING``, and is re-driven later); not a failure."""

    def __init__(self, other: str, step: str) -> None:
        super().__init__(other)
        self.other = other
        self.step = step


class LongWaitRequested(BaseException):
    """``self.retry()`` asked for a wait the broker must not hold; not a failure."""

    def __init__(self, delay_seconds: float, args: Any = None, kwargs: Any = None) -> None:
        super().__init__(delay_seconds)
        self.delay_seconds = delay_seconds
        self.args_after = args
        self.kwargs_after = kwargs


class RetryNotPublished(BaseException):
    """A retry's message could not be published (the broker or the store refused it):
    Celery would turn that into ``Reject(requeue=False)`` — FAILURE in the result backend
    and the errbacks fired — for an execution that is only waiting. The delivery keeps
    ``WAITING`` in the store instead; the sweep publishes it."""

    def __init__(
        self, delay_seconds: float, cause: BaseException, args: Any = None, kwargs: Any = None
    ) -> None:
        super().__init__(str(cause))
        self.delay_seconds = delay_seconds
        self.cause = cause
        self.args_after = args
        self.kwargs_after = kwargs


class PublishNotRecorded(BaseException):
    """Carries why a publish was refused out of ``before_task_publish``: Celery logs and
    swallows an ``Exception`` raised by a signal handler and publishes anyway, so the
    handler raises this instead, and ``AGBoss``'s ``send_task`` turns it back into the
    error for the caller (``PublishRefusedError`` or ``ExecutionIdConflictError``)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def store_trouble_behind(error: BaseException) -> StoreError | None:
    """The store's failure behind a refused publish (``PublishRefusedError``, or the
    ``PublishNotRecorded`` carrying it), if that is why it was refused: transient, so a
    body or an undo that meets it is handed over as for any store failure, never failed
    (a failure would run its undos: a refund of a good charge)."""
    refused = error.error if isinstance(error, PublishNotRecorded) else error
    cause = refused.__cause__ if isinstance(refused, PublishRefusedError) else None
    return cause if isinstance(cause, StoreError) else None


class LookupFailed(Exception):
    """A reconcile gave no answer (it raised or ran out of time): never a ``NotSent``."""

    def __init__(self, detail: dict[str, Any]) -> None:
        super().__init__(detail.get("reason"))
        self.detail = detail
