"""The public shape of an outbound call: its declaration, what send and reconcile get,
and what reconcile answers. The state machine that drives them lives in ``state_machine``.
"""

from __future__ import annotations

import enum
import inspect
import re
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Generic, TypeVar

from celery_agboss.core.durations import to_ms, to_seconds
from celery_agboss.core.masking import MaskingPolicy
from celery_agboss.errors import OutboundCallDefinitionError

ResultT = TypeVar("ResultT")

_NAME = re.compile(r"^[a-z0-9_]+(?:[.-][a-z0-9_]+)*(?:\.[a-z0-9_-]+)+$", re.IGNORECASE)


class Outcome(str, enum.Enum):
    """How the last outbound call of a delivery got its result."""

    SENT = "SENT"  # this delivery sent it and the gateway answered
    REPLAYED = "REPLAYED"  # a completed intent's stored result, nothing sent
    RECONCILED = "RECONCILED"  # a pending intent looked up at the gateway, nothing sent
    JOINED = "JOINED"  # another thread of this process was sending it; its result


@dataclass(frozen=True)
class CallContext:
    """What ``send`` gets: pass ``idempotency_key`` to the gateway, always.

    ``after_possible_send``: an earlier attempt under this key may have been processed,
    and nothing proved it was not (a reconcile's ``NotSent``, or an intent settled as
    never sent): the gateway's answer to this one is what settles the key. False for a
    first attempt, and for one after a definite failure (nothing was processed)."""

    idempotency_key: str
    request: Any
    attempt: int
    name: str
    after_possible_send: bool = False


@dataclass(frozen=True)
class Lookup:
    """What ``reconcile`` gets. ``request`` is as stored (masked); times are the database's."""

    idempotency_key: str
    request: Any
    attempt: int
    attempt_started_at: float | None  # epoch seconds, database clock
    key_age: timedelta | None  # from the first attempt, database clock


@dataclass(frozen=True)
class Completed(Generic[ResultT]):
    """Reconcile found the payment: this is its result; nothing will be sent."""

    result: ResultT


@dataclass(frozen=True)
class NotSent:
    """Reconcile proved the gateway never processed the attempt; it may be sent again."""


@dataclass(frozen=True)
class Unknown:
    """Reconcile cannot tell; nothing is sent and an operator decides."""

    reason: str


ReconcileAnswer = Completed[Any] | NotSent | Unknown
SendFn = Callable[[CallContext], Any]
ReconcileFn = Callable[[CallContext, Lookup], ReconcileAnswer]


def _never_definite(exc: BaseException) -> bool:
    return False


@dataclass(frozen=True, eq=False)
class OutboundCall:
    """A call that leaves the system: recorded as an intent before it is sent.

    ``key_retention`` is the gateway's documented minimum key retention; it bounds
    when a ``NotSent()`` may be resent under the same key (design: R26). It may be omitted
    only with ``lookup_proves_absence=True``.
    """

    name: str
    send: SendFn
    reconcile: ReconcileFn
    key_retention: timedelta | float | None = None
    is_definite_failure: Callable[[BaseException], bool] = _never_definite
    lookup_proves_absence: bool = False
    max_key_length: int | None = None
    mask: MaskingPolicy | None = None
    transaction_id: Callable[[Any], str | None] | None = None
    # Checks a result an operator supplies (``agboss resolve --completed``) before it is
    # stored: raise with what is wrong. Without it, ``transaction_id`` must find an id.
    validate_result: Callable[[Any], object] | None = None
    # False: the call moves no money (a stock hold at an inventory service). An operator's
    # ``--payments-handled`` then leaves its undo to run; by default every call is a
    # payment, whose undo the operator's word stands for (never run twice).
    moves_money: bool = True
    key_retention_seconds: float | None = field(init=False, default=None)
    key_retention_ms: int | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise OutboundCallDefinitionError(
                f"OutboundCall name {self.name!r} must be dotted, like 'stripe.charge' "
                "(letters, digits, '_' or '-', parts joined by '.')",
                rule="name",
            )
        if not callable(self.send) or not callable(self.reconcile):
            raise OutboundCallDefinitionError(
                f"OutboundCall {self.name!r} needs callables for send and reconcile",
                rule="callables",
            )
        _check_reconcile_takes_ctx_and_lookup(self.name, self.reconcile)
        _check_kinds(self)
        if self.key_retention is None:
            if not self.lookup_proves_absence:
                raise OutboundCallDefinitionError(
                    f"OutboundCall {self.name!r} needs key_retention (the gateway's documented "
                    "minimum, e.g. timedelta(hours=24)); only lookup_proves_absence=True may "
                    "omit it",
                    rule="key_retention",
                )
        else:
            try:
                seconds = to_seconds(self.key_retention, what="key_retention")
            except (TypeError, ValueError) as exc:
                raise OutboundCallDefinitionError(
                    f"OutboundCall {self.name!r}: {exc}, e.g. timedelta(hours=24) (the "
                    "gateway's documented minimum key retention)",
                    rule="key_retention",
                ) from None
            if seconds <= 0:
                raise OutboundCallDefinitionError(
                    f"OutboundCall {self.name!r}: key_retention must be positive",
                    rule="key_retention",
                )
            object.__setattr__(self, "key_retention_seconds", seconds)
            object.__setattr__(self, "key_retention_ms", to_ms(seconds, what="key_retention"))
        if self.mask is not None and not isinstance(self.mask, MaskingPolicy):
            raise OutboundCallDefinitionError(
                f"OutboundCall {self.name!r}: mask must be a MaskingPolicy (or None), not "
                f"{type(self.mask).__name__} {self.mask!r}: it would mask nothing. Pass "
                "mask=MaskingPolicy(mask=[...], keep_for_reconcile=[...], mask_errors=...), "
                "from celery_agboss.core.masking",
                rule="mask",
            )
        if self.max_key_length is not None and self.max_key_length < 16:
            raise OutboundCallDefinitionError(
                f"OutboundCall {self.name!r}: max_key_length {self.max_key_length} is too short "
                "for a collision-safe digest (at least 16)",
                rule="max_key_length",
            )
        _declared_in_this_process(self)


def _refuse(call: str, rule: str, value: Any, what: str) -> OutboundCallDefinitionError:
    return OutboundCallDefinitionError(
        f"OutboundCall {call!r}: {rule} must be {what}, not {type(value).__name__} {value!r}",
        rule=rule,
    )


# The fields that must be functions: what each must be. All but the first may be None.
_FUNCTIONS = {
    "is_definite_failure": "a function (exception) -> bool, e.g. "
    "is_definite_failure=lambda exc: isinstance(exc, CardDeclined)",
    "transaction_id": "a function (result) -> id or None, e.g. "
    "transaction_id=lambda receipt: receipt['id']",
    "validate_result": "a function (result) -> None, raising when the result is not what "
    "send returns",
}

_FLAGS = {
    "lookup_proves_absence": "True or False (a bool: text read from the environment or a "
    "file is not converted; True lets a NotSent be resent at any key age, so say it only "
    "when the gateway's lookup proves absence)",
    "moves_money": "True or False (a bool: False lets its undo run after an operator's "
    "--payments-handled, so say it only of a call that moves no money)",
}


def _check_kinds(call: OutboundCall) -> None:
    """Values of the wrong kind are refused here: each was read later as something else
    (text for ``lookup_proves_absence`` as True, switching off the key-age bound of a
    resend; a tuple for ``is_definite_failure`` as "never definite", or a crash)."""
    for rule, what in _FLAGS.items():
        value = getattr(call, rule)
        if not isinstance(value, bool):
            raise _refuse(call.name, rule, value, what)
    for rule, what in _FUNCTIONS.items():
        value = getattr(call, rule)
        if not callable(value) and (value is not None or rule == "is_definite_failure"):
            raise _refuse(call.name, rule, value, what)
    length = call.max_key_length
    if length is not None and (isinstance(length, bool) or not isinstance(length, int)):
        raise _refuse(call.name, "max_key_length", length, "a whole number of characters (int)")


def _check_reconcile_takes_ctx_and_lookup(name: str, reconcile: Callable[..., Any]) -> None:
    """A reconcile that cannot be called as ``reconcile(ctx, lookup)`` raises TypeError at
    every lookup, which is exactly when an unknown outcome needs it. One whose signature
    Python cannot read is taken as it is."""
    try:
        signature = inspect.signature(reconcile)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(None, None)
    except TypeError as exc:
        raise OutboundCallDefinitionError(
            f"OutboundCall {name!r}: reconcile{signature} cannot be called as "
            f"reconcile(ctx, lookup) ({exc}): declare it as def reconcile(ctx, lookup)",
            rule="reconcile",
        ) from None


_declared: dict[str, weakref.WeakSet[OutboundCall]] = {}
_declared_lock = threading.Lock()


def _declared_in_this_process(call: OutboundCall) -> None:
    with _declared_lock:
        _declared.setdefault(call.name, weakref.WeakSet()).add(call)


def declared_call(name: str) -> OutboundCall | None:
    """The ``OutboundCall`` of this name declared in this process, when there is exactly
    one: how a process that never ran a task using it (a worker's main process sweeping,
    ``celery agboss sweep``) still reconciles its intents — importing the app's module
    declared it. None when unknown, or when two calls share the name (then only an
    explicit registration, ``AGBoss(app).register(call)``, says which one an app uses)."""
    with _declared_lock:
        found = list(_declared.get(name, ()))
    return found[0] if len(found) == 1 else None
