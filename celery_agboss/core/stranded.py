"""The sweep's reconcile (design: sweep reconciles): take a PENDING intent that no live lease owns,
under the sweeper's own short lease, and ask the gateway — never send.

``Completed`` is stored; ``NotSent`` is recorded (``not_sent_confirmed``: the mark a
cancel settles by) and the intent handed back (no owner) for the execution's next
delivery, which decides a resend through the key-age compare-and-set. Its history row
and log line say whether it is proven (``not_sent_proven``): a lookup that cannot prove
absence only found nothing, and the payment may exist until the resend under the same
key settles it by the gateway's replay. ``Unknown`` flags the intent for an
operator; a lookup that raised or timed out hands the intent back, with its history
row, to be looked up again later. Lookups of the same intent back off, and so does an
intent whose call this process cannot name, or whose reconcile raised here (even one
no key of this process opens: ``back_off_stranded`` reads no sealed value): one rule,
``_lookup_failed_update``.

The sweep calls it, and so does a delivery of a cancelled execution (under its own
lease): ``by`` names the caller in the history rows and the log lines.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from celery_agboss.core import fault_points, sabotage
from celery_agboss.core.engine_settings import EngineSettings
from celery_agboss.core.history import HistoryEvent
from celery_agboss.core.log_events import (
    OUTBOUND_CALL_LOOKUP_FAILED,
    OUTBOUND_CALL_NOT_SENT_CONFIRMED,
    OUTBOUND_CALL_RECONCILED,
    OUTBOUND_CALL_UNRECONCILED,
    log_event,
)
from celery_agboss.core.lookup import (
    ask,
    completed_update,
    lookup_of,
    not_sent_proven,
    take_for_lookup,
)
from celery_agboss.core.outbound import CallContext, Completed, NotSent, OutboundCall, Unknown
from celery_agboss.core.protections import NOT_SENT_LOOKUPS_NOT_BACKED_OFF
from celery_agboss.core.store_protocol import (
    INTENT_RECORD,
    HistoryRow,
    IntentGuard,
    IntentRecord,
    IntentStatus,
    IntentUpdate,
    LeaseRef,
    Store,
    StoreTransaction,
)
from celery_agboss.core.transitions import (
    CallRef,
    HistoryTail,
    fault,
    masked_text,
    transition,
)
from celery_agboss.errors import LookupFailed

LOOKUP_BACKOFF_BASE_MS = 30_000
LOOKUP_BACKOFF_CAP_MS = 3_600_000


class StrandedOutcome(str, enum.Enum):
    """What ``reconcile_stranded`` did with one intent."""

    COMPLETED = "COMPLETED"  # found at the gateway and stored
    # NotSent recorded, proven or not (``StrandedLookup.proven``); the holder resends
    NOT_SENT_CONFIRMED = "NOT_SENT_CONFIRMED"
    UNRECONCILED = "UNRECONCILED"  # flagged for an operator
    LOOKUP_FAILED = "LOOKUP_FAILED"  # reconcile raised or timed out; looked up again later
    SKIPPED = "SKIPPED"  # not pending, owned by a live lease, or taken by someone else
    UNKNOWN_CALL = "UNKNOWN_CALL"  # no OutboundCall of that name known here; backed off


@dataclass(frozen=True)
class StrandedLookup:
    """What ``look_up_stranded`` did, and for a ``NOT_SENT_CONFIRMED`` whether the call's
    lookup proves the gateway never processed it (``not_sent_proven``)."""

    outcome: StrandedOutcome
    proven: bool = False


NOT_SENT_UNPROVEN_WHY = (
    "not found by the lookup, which cannot prove absence for this call "
    "(lookup_proves_absence=False): the payment may exist; the next delivery resends it "
    "under the same key, which the gateway replays if it processed it"
)
"""What a ``NotSent`` that proves nothing is recorded as (history detail ``why``) and logged."""


class _HasRef(Protocol):
    @property
    def ref(self) -> LeaseRef: ...


UNKNOWN_CALL_HINT = (
    "no OutboundCall of this name is known in this process, so its intent cannot be looked "
    "up here: import the module that declares the call in the sweeping worker (or "
    "AGBoss(app).register(call) when two calls share the name); looked up again later, "
    "backing off like a failed lookup"
)
"""What the log says of an intent whose call this process cannot name."""


def _backoff_ms(failures: int) -> int:
    return int(min(LOOKUP_BACKOFF_BASE_MS * 2 ** min(failures, 20), LOOKUP_BACKOFF_CAP_MS))


def _lookup_failed_update(failures: int) -> IntentUpdate:
    """The one back-off of an intent a lookup could not settle (``failures`` counts this
    one): a lookup that raised or timed out, a call this process cannot name, a reconcile
    step that raised. Without it the intent, listed oldest first, would stay at the head
    of every sweep's batch and hide every newer one."""
    return IntentUpdate(lookup_failures=failures, next_lookup_delay_ms=_backoff_ms(failures))


class StrandedFacts(Protocol):
    """What the back-off of a stranded intent decides and writes by: columns never
    sealed at rest. ``IntentRecord`` has them all."""

    @property
    def idempotency_key(self) -> str: ...
    @property
    def status(self) -> IntentStatus: ...
    @property
    def attempt(self) -> int: ...
    @property
    def owner(self) -> LeaseRef | None: ...
    @property
    def owner_live(self) -> bool: ...
    @property
    def lookup_failures(self) -> int: ...


class UnsealedStranded(StrandedFacts, Protocol):
    """``StrandedFacts`` read without opening a sealed value, and the intent's last
    history row to chain to, its detail unopened (``store.unsealed_intents``)."""

    @property
    def last_history(self) -> HistoryRow | None: ...


UnsealedRead = Callable[[StoreTransaction, str], "UnsealedStranded | None"]
"""Reads ``UnsealedStranded`` of an intent in a transaction; None when it is gone."""


def _back_off_in(
    tx: StoreTransaction,
    settings: EngineSettings,
    record: StrandedFacts,
    lease: LeaseRef,
    detail: dict[str, Any],
    execution_id: str | None,
    tail: HistoryTail | None = None,
) -> bool:
    """Write the lookup-failed back-off on ``record`` (PENDING, read in ``tx``) without a
    lookup, with its history row (after ``tail``'s, when given): handed back if this
    lease took it, else left to its dead owner (the guard re-checks it is dead). False
    when someone moved it first."""
    mine = record.owner == lease
    failures = record.lookup_failures + 1
    update = _lookup_failed_update(failures)
    return transition(
        tx,
        settings.pseudonym_key,
        record.idempotency_key,
        IntentGuard(IntentStatus.PENDING, record.attempt, record.owner, owner_not_live=not mine),
        replace(update, owner=None) if mine else update,
        HistoryEvent.LOOKUP_FAILED,
        from_status=IntentStatus.PENDING,
        to_status=IntentStatus.PENDING,
        attempt=record.attempt,
        owner=lease,
        detail={**detail, "lookup_failures": failures},
        execution_id=execution_id,
        tail=tail,
    )


def back_off_stranded(
    store: Store,
    settings: EngineSettings,
    idempotency_key: str,
    *,
    read: UnsealedRead,
    sweeper_lease: LeaseRef,
    sweeper_ttl_ms: int,
    reason: str,
) -> bool:
    """The sweep's ``reconcile_stranded`` of this intent raised (not the user's lookup:
    that is a failed lookup already): back it off as a failed lookup, handing it back if
    the sweeper had taken it, so the next runs reach the intents behind it. False when it
    is settled, owned by a live lease, or gone.

    Decided and written on what ``read`` gives, no sealed value opened: an intent sealed
    under a key this process lacks (its reconcile raised reading it) backs off too, else
    it heads every run's batch for ever (design: sealed at rest)."""
    with store.fenced(sweeper_lease, sweeper_ttl_ms) as tx:
        facts = read(tx, idempotency_key)
        if facts is None or facts.status is not IntentStatus.PENDING:
            return False
        if facts.owner_live and facts.owner != sweeper_lease:
            return False
        tail = HistoryTail()
        if facts.last_history is not None:
            tail.keep(facts.last_history)  # chained without opening its detail
        detail = {"by": "sweep", "reason": reason}
        return _back_off_in(tx, settings, facts, sweeper_lease, detail, None, tail)


def reconcile_stranded(
    store: Store,
    settings: EngineSettings,
    idempotency_key: str,
    *,
    sweeper_lease: LeaseRef | _HasRef,
    sweeper_ttl_ms: int | None = None,
    by: str = "sweep",
    for_execution: str | None = None,
) -> StrandedOutcome:
    """Take a PENDING intent with no live owner under the sweeper's own lease and reconcile
    it. Never sends: the execution's next delivery does, through the key-age CAS.

    ``by`` says who asked ("sweep", "cancel"…) in the history detail and the logs;
    ``for_execution``, the execution whose delivery asks (a cancel's: it relies on what
    the lookup finds), None for the sweep."""
    return look_up_stranded(
        store,
        settings,
        idempotency_key,
        sweeper_lease=sweeper_lease,
        sweeper_ttl_ms=sweeper_ttl_ms,
        by=by,
        for_execution=for_execution,
    ).outcome


def look_up_stranded(
    store: Store,
    settings: EngineSettings,
    idempotency_key: str,
    *,
    sweeper_lease: LeaseRef | _HasRef,
    sweeper_ttl_ms: int | None = None,
    by: str = "sweep",
    for_execution: str | None = None,
) -> StrandedLookup:
    """``reconcile_stranded``, telling also whether a ``NotSent`` it recorded is proven:
    the sweep counts the two apart."""
    lease = sweeper_lease if isinstance(sweeper_lease, LeaseRef) else sweeper_lease.ref
    ttl = settings.lease_ttl_ms if sweeper_ttl_ms is None else sweeper_ttl_ms
    with store.fenced(lease, ttl) as tx:
        record = tx.read_intent(idempotency_key)
        if record is None or record.status is not IntentStatus.PENDING or record.owner_live:
            return StrandedLookup(StrandedOutcome.SKIPPED)
        call = settings.call_named(record.name)
        ref = CallRef(record.name, record.execution_id, idempotency_key, record.business_key_handle)
        if call is None:
            detail = {"by": by, "reason": "unknown-call"}
            if not _back_off_in(tx, settings, record, lease, detail, for_execution):
                return StrandedLookup(StrandedOutcome.SKIPPED)
            log_event(
                OUTBOUND_CALL_UNRECONCILED,
                logging.WARNING,
                UNKNOWN_CALL_HINT,
                **ref.fields(attempt=record.attempt, by=by, reason="unknown-call"),
            )
            return StrandedLookup(StrandedOutcome.UNKNOWN_CALL)
        won = take_for_lookup(
            tx, settings.pseudonym_key, record, lease, detail={"by": by}, execution_id=for_execution
        )
        if not won:
            return StrandedLookup(StrandedOutcome.SKIPPED)
    attempt = record.attempt
    context = CallContext(idempotency_key, record.request, attempt, call.name)
    try:
        answer: Completed[Any] | NotSent | Unknown | None = ask(
            call, context, lookup_of(record), settings.attempt_timeout_ms
        )
        failure: dict[str, Any] | None = None
    except LookupFailed as failed:
        answer, failure = None, failed.detail
    fault(
        fault_points.RECONCILE_AFTER_LOOKUP,
        lease,
        ref,
        attempt=attempt,
        answer=type(answer).__name__,
    )
    return _settle_stranded(
        store, settings, lease, ttl, record, call, ref, answer, failure, by, for_execution
    )


def _settle_stranded(
    store: Store,
    settings: EngineSettings,
    lease: LeaseRef,
    ttl: int,
    record: IntentRecord,
    call: OutboundCall,
    ref: CallRef,
    answer: Completed[Any] | NotSent | Unknown | None,
    failure: dict[str, Any] | None,
    by: str,
    for_execution: str | None,
) -> StrandedLookup:
    """Write what the lookup answered (one transition under the sweeper's lease), then log it."""
    key = record.idempotency_key
    relier = for_execution if record.business_key_handle is not None else None
    change = _stranded_change(call, answer, failure, record.lookup_failures + 1, by, relier)
    with store.fenced(lease, ttl) as tx:
        won = transition(
            tx,
            settings.pseudonym_key,
            key,
            IntentGuard(IntentStatus.PENDING, record.attempt, lease),
            change.update,
            change.event,
            from_status=IntentStatus.PENDING,
            to_status=change.to_status,
            attempt=record.attempt,
            owner=lease,
            detail=change.detail,
            execution_id=for_execution,
        )
        if won and change.relier is not None:
            tx.rely_on(INTENT_RECORD, key, change.relier, counted=True)
    if not won:
        return StrandedLookup(StrandedOutcome.SKIPPED)
    _log_stranded(change, ref, record.attempt, by, failure)
    return StrandedLookup(change.outcome, change.proven)


@dataclass(frozen=True)
class _StrandedChange:
    """What one lookup's answer writes on the stranded intent."""

    outcome: StrandedOutcome
    update: IntentUpdate
    event: HistoryEvent
    to_status: IntentStatus
    detail: dict[str, Any]
    relier: str | None  # the execution that relies on a completed shared intent, or None
    proven: bool = False  # a NotSent the call's lookup proves (``not_sent_proven``)


def _stranded_change(
    call: OutboundCall,
    answer: Completed[Any] | NotSent | Unknown | None,
    failure: dict[str, Any] | None,
    failures: int,
    by: str,
    relier: str | None,
) -> _StrandedChange:
    """The change, its history event and the outcome for each answer a lookup can give
    (None: the lookup itself failed; ``failures`` counts this one)."""
    if isinstance(answer, Completed):
        stored_ok, update, gateway_id = completed_update(call, answer.result)
        relies = relier if stored_ok else None
        return _StrandedChange(
            StrandedOutcome.COMPLETED,
            update if relies is None else replace(update, rely=True),
            HistoryEvent.RECONCILED_COMPLETED if stored_ok else HistoryEvent.RESULT_NOT_STORED,
            IntentStatus.COMPLETED,
            {"gateway_transaction_id": gateway_id, "by": by},
            relies,
        )
    if isinstance(answer, NotSent):
        # Not settled either: until the execution's holder resends, lookups of it back
        # off like any other that could not settle it (30 s, 60 s, … to an hour).
        backoff = 0 if sabotage.active(NOT_SENT_LOOKUPS_NOT_BACKED_OFF) else failures - 1
        # ``not_sent_confirmed`` marks the NotSent for a cancel to settle, proven or not
        # (``settle_not_sent_for_cancel`` flags an unproven one); the row says which.
        proven = bool(not_sent_proven(call))
        update = IntentUpdate(
            owner=None,
            not_sent_confirmed=True,
            lookup_failures=failures,
            next_lookup_delay_ms=_backoff_ms(backoff),
        )
        why = {} if proven else {"why": NOT_SENT_UNPROVEN_WHY}
        return _StrandedChange(
            StrandedOutcome.NOT_SENT_CONFIRMED,
            update,
            HistoryEvent.RECONCILED_NOT_SENT,
            IntentStatus.PENDING,
            {"by": by, "resend": False, "proven": proven, **why},
            None,
            proven,
        )
    if isinstance(answer, Unknown):
        update = IntentUpdate(
            owner=None,
            needs_operator=True,
            operator_reason=f"unknown: {masked_text(call, answer.reason)}"[:500],
            lookup_failures=failures,
            next_lookup_delay_ms=_backoff_ms(failures),
        )
        return _StrandedChange(
            StrandedOutcome.UNRECONCILED,
            update,
            HistoryEvent.UNRECONCILED,
            IntentStatus.PENDING,
            {"by": by, "reason": masked_text(call, answer.reason)},
            None,
        )
    update = replace(_lookup_failed_update(failures), owner=None)
    return _StrandedChange(
        StrandedOutcome.LOOKUP_FAILED,
        update,
        HistoryEvent.LOOKUP_FAILED,
        IntentStatus.PENDING,
        # the error's text is masked by the call's policy (error_detail)
        {"by": by, "lookup_failures": failures, **(failure or {})},
        None,
    )


def _log_stranded(
    change: _StrandedChange,
    ref: CallRef,
    attempt: int,
    by: str,
    failure: dict[str, Any] | None,
) -> None:
    more = (
        {}
        if failure is None
        else {"error_type": failure.get("error_type"), "http_status": failure.get("http_status")}
    )
    fields = ref.fields(attempt=attempt, by=by, **more)
    outcome = change.outcome
    if outcome is StrandedOutcome.COMPLETED:
        log_event(
            OUTBOUND_CALL_RECONCILED,
            logging.INFO,
            f"found at the gateway by a lookup ({by})",
            **fields,
        )
    elif outcome is StrandedOutcome.NOT_SENT_CONFIRMED:
        log_event(
            OUTBOUND_CALL_NOT_SENT_CONFIRMED,
            logging.WARNING,
            f"a lookup ({by}) proved it was not sent; the execution's holder resends"
            if change.proven
            else f"a lookup ({by}): {NOT_SENT_UNPROVEN_WHY}",
            proven=change.proven,
            **fields,
        )
    elif outcome is StrandedOutcome.UNRECONCILED:
        log_event(
            OUTBOUND_CALL_UNRECONCILED,
            logging.WARNING,
            f"a lookup ({by}) could not tell; an operator decides",
            **fields,
        )
    else:  # StrandedOutcome.LOOKUP_FAILED
        log_event(
            OUTBOUND_CALL_LOOKUP_FAILED,
            logging.WARNING,
            "reconcile could not be asked; looked up again later",
            **fields,
        )


__all__ = [
    "LOOKUP_BACKOFF_BASE_MS",
    "StrandedLookup",
    "StrandedOutcome",
    "back_off_stranded",
    "look_up_stranded",
    "reconcile_stranded",
]
