"""Every structured log event of celery_agboss: its name, and the one way to log it.

Each record on the ``celery_agboss`` logger that reports a decision is written by
``log_event``, in one shape:

- ``record.event`` is the event's name, one of the constants below (docs/api.md lists
  them all; the names are public: dashboards and alerts grep them);
- each field is an attribute of the record of its own (``record.execution_id``,
  ``record.call``…), which JSON formatters pick up as they are;
- the message reads ``<event> key=value …`` (keys sorted), then ``: <message>`` when
  the call gives a sentence for people.

Fields carry ids, holders, tokens, counts and type names only: never a business key
in clear, an amount or a card field (design: R17). A value that is not a str, int, float,
bool or None is logged as its type's name, never its repr (a repr may hold an amount).
A field named like an attribute ``logging`` gives every record (``name``, ``msg``,
``process``…) is logged with a trailing underscore (``name_``): ``logging`` refuses
to overwrite its own.

Observers added with ``add_event_observer`` are told of every event before it is
logged, whatever the logger's level (``celery_agboss.metrics`` counts them so).

Custom task events for Flower (``task-deferred``…) are not log records: they are in
``celery_agboss.runtime.task_events``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

logger = logging.getLogger("celery_agboss")

# --- outbound calls (the engine) --------------------------------------------------------
OUTBOUND_CALL_SENT = "outbound-call.sent"  # sent, and its answer settled
OUTBOUND_CALL_REPLAYED = "outbound-call.replayed"  # the stored result returned
OUTBOUND_CALL_JOINED = "outbound-call.joined"  # joined a send in flight in this process
OUTBOUND_CALL_FAILED = "outbound-call.failed"  # a definite failure recorded
OUTBOUND_CALL_FAILURE_REPLAYED = "outbound-call.failure-replayed"  # raised again, not resent
OUTBOUND_CALL_COMPENSATED = "outbound-call.compensated"  # claimed by an undo: never replayed
OUTBOUND_CALL_OUTCOME_UNKNOWN = "outbound-call.outcome-unknown"  # reconciled later
OUTBOUND_CALL_ANSWERED_AFTER_HAND_OVER = "outbound-call.answered-after-hand-over"
OUTBOUND_CALL_SUPERSEDED = "outbound-call.superseded"  # another holder took the intent
OUTBOUND_CALL_HISTORY_NOT_WRITTEN = "outbound-call.history-not-written"
OUTBOUND_CALL_RECONCILING = "outbound-call.reconciling"  # a lookup before anything is sent
OUTBOUND_CALL_RECONCILED = "outbound-call.reconciled"  # found at the gateway
OUTBOUND_CALL_NOT_SENT_CONFIRMED = "outbound-call.not-sent-confirmed"  # by a lookup
OUTBOUND_CALL_UNRECONCILED = "outbound-call.unreconciled"  # an operator decides
OUTBOUND_CALL_LOOKUP_FAILED = "outbound-call.lookup-failed"  # looked up again later
OUTBOUND_CALL_POSITION_KEYS = "outbound-call.position-keys"  # keyed by position: a warning
OUTBOUND_CALL_TRANSACTION_ID_FAILED = "outbound-call.transaction-id-failed"

# --- fenced effects ---------------------------------------------------------------------
FENCED_EFFECT_APPLIED = "fenced-effect.applied"
FENCED_EFFECT_REPLAYED = "fenced-effect.replayed"

# --- the transactional outbox (celery_agboss.outbox) ------------------------------------
OUTBOX_PUBLISHED = "outbox.published"  # after the commit, by the delivery (or the app)
OUTBOX_REPUBLISHED = "outbox.republished"  # by the sweep: rows a dead worker left
OUTBOX_PUBLISH_FAILED = "outbox.publish-failed"  # the row stays for the sweep

# --- leases -----------------------------------------------------------------------------
LEASE_RELEASE_REFUSED = "lease.release-refused"  # a send under it may still be running
LEASE_RELEASE_FAILED = "lease.release-failed"
LEASE_RENEWAL_FAILED = "lease.renewal-failed"
LEASE_RENEWER_ROUND_FAILED = "lease.renewer-round-failed"

# --- executions (the Celery layer) ------------------------------------------------------
EXECUTION_STARTED = "execution.started"
EXECUTION_DEFERRED = "execution.deferred"
EXECUTION_TAKEN_OVER = "execution.taken-over"
EXECUTION_FENCED = "execution.fenced"
EXECUTION_PARKED = "execution.parked"
EXECUTION_WAITING = "execution.waiting"
EXECUTION_WAITING_OPERATOR = "execution.waiting-operator"
EXECUTION_COMPLETED = "execution.completed"
EXECUTION_FAILED = "execution.failed"
EXECUTION_REPLAYED = "execution.replayed"
EXECUTION_REPUBLISHED = "execution.republished"
EXECUTION_RELEASE_FAILED = "execution.release-failed"
EXECUTION_STORE_FAILED = "execution.store-failed"
EXECUTION_NOT_RECORDED = "execution.not-recorded"
EXECUTION_NOT_RECORDED_AT_PUBLISH = "execution.not-recorded-at-publish"
EXECUTION_REFUSED = "execution.refused"  # another task's execution id
EXECUTION_CANCELLING = "execution.cancelling"  # a delivery reconciles before cancelling
EXECUTION_CANCELLED = "execution.cancelled"  # by a delivery or by the sweep
EXECUTION_EXPIRED = "execution.expired"
EXECUTION_REVOKED = "execution.revoked"
EXECUTION_UNMANAGED = "execution.unmanaged"  # a plain task got a recorded execution's message
EXECUTION_TIME_LIMIT = "execution.time-limit"
RESULT_BACKEND_FAILURE_WITHHELD = "result-backend.failure-withheld"

# --- undo (celery_agboss.core.compensation, celery_agboss.delivery.compensating) --------
EXECUTION_COMPENSATING = "execution.compensating"  # a delivery starts (or continues) undos
UNDO_DONE = "undo.done"  # an undo ran and its done mark committed: never run again
UNDO_KEPT = "undo.kept"  # a shared step another execution completed on: not undone
UNDO_COVERED = "undo.covered"  # a shared step another execution's undo claimed: not run here
UNDO_WAITS = "undo.waits"  # a shared step another execution still uses: wait for it

# --- the sweep --------------------------------------------------------------------------
SWEEP_REPUBLISHED = "sweep.republished"
SWEEP_LINKS_REPUBLISHED = "sweep.links-republished"  # completed, its links never sent
SWEEP_FINISHED = "sweep.finished"
SWEEP_SKIPPED = "sweep.skipped"
SWEEP_STALE = "sweep.stale"
SWEEP_ERROR = "sweep.error"
SWEEP_QUEUE_NOT_CONSUMED = "sweep.queue-not-consumed"

# --- operators --------------------------------------------------------------------------
OPERATOR_RESOLVED = "operator.resolved"
OPERATOR_CANCELLED = "operator.cancelled"
OPERATOR_UNPARKED = "operator.unparked"
OPERATOR_REDRIVEN = "operator.redriven"
OPERATOR_ACCEPTED = "operator.accepted"
OPERATOR_PAYMENTS_HANDLED = "operator.payments-handled"
OPERATOR_PAUSE_ANSWERED = "pause.answered"
OPERATOR_PAUSE_ANSWERED_EARLY = "pause.answered-early"
PAUSE_EARLY_ANSWER_DROPPED = "pause.early-answer-dropped"

# --- processes and the store ------------------------------------------------------------
STORE_OPENED = "store.opened"
STORE_UNREACHABLE = "store.unreachable"  # a worker at start: the store does not answer
STORE_ANSWERS = "store.answers"  # ... and now it does
STORE_SQLITE_WATCHDOG_ROLLBACK_FAILED = "store.sqlite-watchdog-rollback-failed"
STORE_SQLITE_FENCED_TRANSACTION_INTERRUPTED = "store.sqlite-fenced-transaction-interrupted"
STORE_SQLITE_WATCHDOG_FAILED = "store.sqlite-watchdog-failed"
WORKER_SHUTTING_DOWN = "worker.shutting-down"

LOG_EVENTS = frozenset(
    value
    for name, value in dict(globals()).items()
    if name.isupper() and not name.startswith("_") and isinstance(value, str)
)
"""Every name above: ``log_event`` is only ever called with one of them."""

_SAFE_TYPES = (str, int, float, bool, type(None))

_RESERVED = frozenset(
    {
        *logging.LogRecord("", logging.INFO, "", 0, "", (), None).__dict__,
        "message",  # set by Formatter.format
        "asctime",  # set by Formatter.format
        "event",  # the event's own name
    }
)
"""Record attributes a field may not overwrite (``logging`` raises ``KeyError``)."""


def safe_value(value: Any) -> Any:
    """What a log line (or a task event) may carry of a value: str, int, float, bool and
    None as they are, a list or tuple item by item, anything else its type's name (never
    its repr: a repr could carry an amount or a card number)."""
    if isinstance(value, _SAFE_TYPES):
        return value
    if isinstance(value, (list, tuple)):
        return [safe_value(item) for item in value]
    return type(value).__name__


def field_name(name: str) -> str:
    """The record attribute a field is logged as: its own name, or with a trailing ``_``
    when ``logging`` owns that name (``name`` → ``name_``)."""
    return f"{name}_" if name in _RESERVED else name


EventObserver = Callable[[str, Mapping[str, Any]], None]
"""``observer(event, fields)``: told of every event, its fields made safe as logged."""

_observers: tuple[EventObserver, ...] = ()
_observers_lock = threading.Lock()
_listens: dict[EventObserver, Callable[[], bool]] = {}


def add_event_observer(
    observer: EventObserver, *, listens: Callable[[], bool] | None = None
) -> None:
    """Tell ``observer`` of every event from now on (metrics count them this way).

    It is called before the record is logged, whatever the logger's level, with the
    event's name and its fields as ``safe_value`` made them (names as the caller gave
    them). What it raises is swallowed: counting must never break a payment.
    ``listens``: asked first, cheaply, whether the observer wants this event at all
    (tracing only while a span records); when nobody does, nothing is built.
    """
    global _observers
    with _observers_lock:
        if observer not in _observers:
            _observers = (*_observers, observer)
        if listens is not None:
            _listens[observer] = listens


def remove_event_observer(observer: EventObserver) -> None:
    """Stop telling ``observer``; one that was never added is ignored."""
    global _observers
    with _observers_lock:
        _observers = tuple(known for known in _observers if known != observer)
        _listens.pop(observer, None)


def _listening() -> tuple[EventObserver, ...]:
    """The observers that want the event being made now."""
    if not _listens:
        return _observers
    return tuple(o for o in _observers if _asks(_listens.get(o)))


def _asks(listens: Callable[[], bool] | None) -> bool:
    if listens is None:
        return True  # an observer that did not say hears every event
    try:
        return listens()
    except Exception:  # an observer never breaks the caller
        return False


def _tell_observers(
    observers: tuple[EventObserver, ...], event: str, values: Mapping[str, Any]
) -> None:
    for observer in observers:
        try:
            observer(event, values)
        except Exception:  # an observer never breaks the caller (nor the next observer)
            continue


def log_event(
    event: str,
    level: int = logging.INFO,
    message: str | None = None,
    /,
    *,
    exc_info: bool = False,
    **fields: Any,
) -> None:
    """Log one structured event on the ``celery_agboss`` logger.

    ``event`` is one of this module's constants; ``message`` an optional sentence for
    people (ids, counts and the like go in fields). The record gets ``event`` and each
    field as attributes; its text is ``<event> key=value …[: message]``.
    """
    logged = logger.isEnabledFor(level)
    observers = _listening() if _observers else _observers
    if not logged and not observers:
        return  # nobody listens (a worker at -l warning, no metrics): nothing to build
    values = {name: safe_value(value) for name, value in fields.items()}
    if observers:
        _tell_observers(observers, event, MappingProxyType(values))
    if not logged:
        return
    safe = {field_name(name): value for name, value in values.items()}
    parts = [event, *(f"{name}={value}" for name, value in sorted(safe.items()))]
    text = " ".join(parts)
    if message:
        text = f"{text}: {message}"
    logger.log(level, "%s", text, exc_info=exc_info, extra={"event": event, **safe})


__all__ = [
    "EXECUTION_CANCELLED",
    "EXECUTION_CANCELLING",
    "EXECUTION_COMPENSATING",
    "EXECUTION_COMPLETED",
    "EXECUTION_DEFERRED",
    "EXECUTION_EXPIRED",
    "EXECUTION_FAILED",
    "EXECUTION_FENCED",
    "EXECUTION_NOT_RECORDED",
    "EXECUTION_NOT_RECORDED_AT_PUBLISH",
    "EXECUTION_PARKED",
    "EXECUTION_REFUSED",
    "EXECUTION_RELEASE_FAILED",
    "EXECUTION_REPLAYED",
    "EXECUTION_REPUBLISHED",
    "EXECUTION_REVOKED",
    "EXECUTION_STARTED",
    "EXECUTION_STORE_FAILED",
    "EXECUTION_TAKEN_OVER",
    "EXECUTION_TIME_LIMIT",
    "EXECUTION_UNMANAGED",
    "EXECUTION_WAITING",
    "EXECUTION_WAITING_OPERATOR",
    "FENCED_EFFECT_APPLIED",
    "FENCED_EFFECT_REPLAYED",
    "LEASE_RELEASE_FAILED",
    "LEASE_RELEASE_REFUSED",
    "LEASE_RENEWAL_FAILED",
    "LEASE_RENEWER_ROUND_FAILED",
    "LOG_EVENTS",
    "OPERATOR_ACCEPTED",
    "OPERATOR_CANCELLED",
    "OPERATOR_PAUSE_ANSWERED",
    "OPERATOR_PAUSE_ANSWERED_EARLY",
    "OPERATOR_PAYMENTS_HANDLED",
    "OPERATOR_REDRIVEN",
    "OPERATOR_RESOLVED",
    "OPERATOR_UNPARKED",
    "OUTBOUND_CALL_ANSWERED_AFTER_HAND_OVER",
    "OUTBOUND_CALL_COMPENSATED",
    "OUTBOUND_CALL_FAILED",
    "OUTBOUND_CALL_FAILURE_REPLAYED",
    "OUTBOUND_CALL_HISTORY_NOT_WRITTEN",
    "OUTBOUND_CALL_JOINED",
    "OUTBOUND_CALL_LOOKUP_FAILED",
    "OUTBOUND_CALL_NOT_SENT_CONFIRMED",
    "OUTBOUND_CALL_OUTCOME_UNKNOWN",
    "OUTBOUND_CALL_POSITION_KEYS",
    "OUTBOUND_CALL_RECONCILED",
    "OUTBOUND_CALL_RECONCILING",
    "OUTBOUND_CALL_REPLAYED",
    "OUTBOUND_CALL_SENT",
    "OUTBOUND_CALL_SUPERSEDED",
    "OUTBOUND_CALL_TRANSACTION_ID_FAILED",
    "OUTBOUND_CALL_UNRECONCILED",
    "OUTBOX_PUBLISHED",
    "OUTBOX_PUBLISH_FAILED",
    "OUTBOX_REPUBLISHED",
    "PAUSE_EARLY_ANSWER_DROPPED",
    "RESULT_BACKEND_FAILURE_WITHHELD",
    "STORE_ANSWERS",
    "STORE_OPENED",
    "STORE_SQLITE_FENCED_TRANSACTION_INTERRUPTED",
    "STORE_SQLITE_WATCHDOG_FAILED",
    "STORE_SQLITE_WATCHDOG_ROLLBACK_FAILED",
    "STORE_UNREACHABLE",
    "SWEEP_ERROR",
    "SWEEP_FINISHED",
    "SWEEP_LINKS_REPUBLISHED",
    "SWEEP_QUEUE_NOT_CONSUMED",
    "SWEEP_REPUBLISHED",
    "SWEEP_SKIPPED",
    "SWEEP_STALE",
    "UNDO_COVERED",
    "UNDO_DONE",
    "UNDO_KEPT",
    "UNDO_WAITS",
    "WORKER_SHUTTING_DOWN",
    "add_event_observer",
    "field_name",
    "log_event",
    "remove_event_observer",
    "safe_value",
]
