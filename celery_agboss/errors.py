"""Every exception celery_agboss raises, in one place.

Two families. ``AGBossSignal`` derives from ``BaseException`` on purpose: it means
"not known yet" or "this delivery must stop", and a bare ``except Exception`` in a
task body must not be able to turn it into a failure. ``AGBossError`` is ordinary
bad input or misuse. Every class pickles with its fields (Celery result backends
store exceptions), and each docstring is its default message.
"""

from __future__ import annotations

from typing import Any


class _Fielded(BaseException):
    """Mixin: keyword fields kept as attributes, the message as the only arg, pickles whole."""

    def _init_fields(self, message: str | None, fields: dict[str, Any]) -> str:
        self.fields = dict(fields)
        for name, value in fields.items():
            setattr(self, name, value)
        return message or (type(self).__doc__ or type(self).__name__).strip().splitlines()[0]

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.args[0] if self.args else None, self.fields))


def _rebuild(cls: type[Any], message: str | None, fields: dict[str, Any]) -> Any:
    return cls(message, **fields)


class AGBossSignal(_Fielded):
    """A delivery must stop here; what happened is decided from the store, not by this delivery."""

    def __init__(self, message: str | None = None, **fields: Any) -> None:
        super().__init__(self._init_fields(message, fields))


class AGBossError(_Fielded, Exception):
    """celery_agboss refused a request."""

    def __init__(self, message: str | None = None, **fields: Any) -> None:
        super().__init__(self._init_fields(message, fields))


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
    """The pause is not waiting for an answer (already answered, or never paused)."""


class MaskingPolicyError(AGBossError):
    """The masking policy failed, so nothing was stored (fail closed)."""

    # Typed fields (set per instance by ``core.masking``): which policy, field, and payload.
    policy: str = ""
    field: str | None = None
    what: str | None = None


class ConfigurationError(AGBossError):
    """celery_agboss is not configured correctly."""


class OutboundCallDefinitionError(AGBossError):
    """An OutboundCall was declared with invalid parameters."""


class LeaseNotHeldError(AGBossError):
    """The lease is held by another live delivery; this one must not run the body."""


class StoreError(AGBossError):
    """The store failed; what was committed is re-read from the store, never guessed."""


class StoreUnavailableError(StoreError):
    """The store could not be reached or the connection broke; a write may have committed."""


class StoreLockTimeoutError(StoreError):
    """A row stayed locked longer than the fenced transaction's lock timeout."""


class SabotageRefusedError(AGBossError):
    """Sabotage switches only work inside the test suite (AGBOSS_ALLOW_SABOTAGE=1 under pytest)."""


class FencedEffectConflictError(AGBossError):
    """A fenced effect's key was recorded by a step of another name; nothing was replayed."""


class CommitInsideFencedEffectError(AGBossError):
    """A fenced effect's function may not commit; its writes commit with the effect's record."""


class FaultInjected(AGBossError):
    """A test armed a fault point to raise here."""


class StoredFailureError(AGBossError):
    """The execution failed earlier; its original exception could not be rebuilt here."""


class OperatorRefusedError(AGBossError):
    """The operator command was refused and nothing was changed; the message says what to do.

    ``code`` names the reason for scripts: ``not-found``, ``pending-intent``,
    ``lease-live``, ``owner-live``, ``wrong-state``, ``conflict``, ``bad-input``.
    """
