"""What every gateway adapter shares: its shape, its timeouts and its error verdicts.

An adapter is the one place where a gateway's errors become "nothing was processed"
(definite: the call may be sent again under the same key) or "it may have been"
(unknown: reconcile asks the gateway first). Getting that wrong is a double charge, so
every adapter routes its verdict through :func:`definite_verdict`, where a test's
sabotage switch can turn every error definite and show the second payment.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Protocol, runtime_checkable

from celery_agboss.core import sabotage
from celery_agboss.core.durations import to_seconds
from celery_agboss.core.outbound import OutboundCall

EVERY_ERROR_DEFINITE = sabotage.register("adapter-every-error-definite")
"""Sabotage: every adapter calls every error definite (a timeout is resent as new)."""

DEFAULT_HTTP_TIMEOUT = 30.0
DEFAULT_ATTEMPT_TIMEOUT = 120.0  # agboss_attempt_timeout's default


@runtime_checkable
class GatewayAdapter(Protocol):
    """What ``celery -A proj agboss checklist --adapter module:object`` probes.

    ``send`` makes one payment of ``amount`` (minor units) under ``idempotency_key``
    through the adapter's own charge path; ``lookup`` answers what that key made, or
    None when the gateway shows nothing (raise when the gateway cannot be asked).
    """

    name: str

    def send(self, amount: int, idempotency_key: str) -> Any: ...

    def lookup(self, idempotency_key: str) -> Any: ...

    @property
    def calls(self) -> tuple[OutboundCall, ...]: ...


def require_sdk(module: str, *, pip_extra: str, gateway: str) -> None:
    """Refuse, naming the extra to install, when the gateway's SDK is missing.

    Called by an adapter module before it imports its SDK, so the error says what to do
    instead of naming a module the user never heard of.
    """
    if importlib.util.find_spec(module) is None:
        raise ImportError(
            f"celery_agboss.adapters.{pip_extra} talks to {gateway} through its official SDK "
            f"({module!r}), which is not installed: pip install 'celery_agboss[{pip_extra}]'",
            name=module,
        )


def http_timeout_seconds(
    timeout: float | timedelta, attempt_timeout: float | timedelta = DEFAULT_ATTEMPT_TIMEOUT
) -> float:
    """The SDK's HTTP timeout, refused unless it is positive and below ``attempt_timeout``.

    A send the SDK keeps waiting on past the attempt's bound outlives the lease that
    covers it: another worker may then reconcile and resend while it still waits.
    """
    seconds = to_seconds(timeout, what="timeout")
    bound = to_seconds(attempt_timeout, what="attempt_timeout")
    if not 0 < seconds < bound:
        raise ValueError(
            f"the adapter's HTTP timeout ({seconds:g} s) must be positive and below "
            f"agboss_attempt_timeout ({bound:g} s): pass timeout=... lower, or "
            "attempt_timeout= the value your app sets"
        )
    return seconds


def definite_verdict(classify: Callable[[BaseException], bool]) -> Callable[[BaseException], bool]:
    """``is_definite_failure`` for an OutboundCall, from the adapter's own ``classify``.

    Under the ``adapter-every-error-definite`` sabotage (tests only) every error is
    definite, so the test guarding the classification can show the double charge.
    """

    def is_definite_failure(exc: BaseException) -> bool:
        if sabotage.active(EVERY_ERROR_DEFINITE):
            return True
        return classify(exc)

    is_definite_failure.__doc__ = classify.__doc__
    return is_definite_failure


__all__ = [
    "DEFAULT_ATTEMPT_TIMEOUT",
    "DEFAULT_HTTP_TIMEOUT",
    "EVERY_ERROR_DEFINITE",
    "GatewayAdapter",
    "definite_verdict",
    "http_timeout_seconds",
    "require_sdk",
]
