"""The store interface: domain verbs the engine needs, and the records they return.

The core speaks only this protocol; ``celery_agboss.store`` implements it on
SQLAlchemy. Times are integer milliseconds since the epoch *on the database clock*
(PostgreSQL ``clock_timestamp()``, SQLite the host's), plus a test-only offset.
Every method that writes either commits whole or raises; driver errors surface as
``celery_agboss.errors.StoreError`` subclasses, never as driver exceptions.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias

JSON: TypeAlias = dict[str, Any] | list[Any] | str | int | float | bool | None


class _Unset(enum.Enum):
    UNSET = "UNSET"


UNSET = _Unset.UNSET


INTENT_RECORD = "intent"
EFFECT_RECORD = "effect"
"""The two kinds of record an execution can use without having created it."""


class IntentStatus(str, enum.Enum):
    PENDING = "PENDING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"


@dataclass(frozen=True)
class LeaseRef:
    """One delivery's claim on a scope: who (holder uuid) with which fencing token."""

    scope: str
    holder: str
    token: int

    def fields(self) -> dict[str, Any]:
        """How fault points, logs and errors name the claim."""
        return {"scope": self.scope, "holder": self.holder, "token": self.token}


@dataclass(frozen=True)
class LeaseGrant:
    lease: LeaseRef
    expires_at_ms: int
    db_now_ms: int
    took_over: bool  # an earlier holder's lease had expired or been released


@dataclass(frozen=True)
class LeaseState:
    scope: str
    holder: str
    token: int
    expires_at_ms: int
    released: bool
    live: bool  # not released and expires_at > now, on the database clock
    db_now_ms: int


class RenewOutcome(str, enum.Enum):
    RENEWED = "RENEWED"
    LOST = "LOST"  # expired, released or taken over: never revived (design: R19)
    BUSY = "BUSY"  # row locked by a running fenced transaction, which extends it itself


@dataclass(frozen=True)
class IntentRecord:
    idempotency_key: str
    execution_id: str
    name: str
    business_key_handle: str | None
    fingerprint: str
    request: JSON
    result: JSON
    result_stored: bool
    status: IntentStatus
    attempt: int
    owner: LeaseRef | None
    owner_live: bool  # the owner's lease is live on the database clock at read time
    first_attempt_at_ms: int | None
    attempt_started_at_ms: int | None
    completed_at_ms: int | None
    gateway_transaction_id: str | None
    needs_operator: bool
    operator_reason: str | None
    not_sent_confirmed: bool
    read_at_ms: int  # database clock when read
    # Added by the store engineer (additive): the sweep's lookup back-off.
    next_lookup_at_ms: int | None = None  # the sweep looks this intent up again from then
    lookup_failures: int = 0  # lookups that could not settle it, for the back-off
    # A FAILED intent's definite failure (type, masked message and arguments); a re-run
    # raises it again, never sends again, unless ``retry_for`` names the execution a
    # retry authorised (and, once handed to another execution, never: ``failure_shared``).
    failure: JSON = None
    retry_for: str | None = None
    failure_shared: bool = False
    # Who sent the current attempt, and what the record says about sharing (the store
    # reads them; ``core/shared_records.py`` decides).
    sent_by: str | None = None
    reliance: int = 0
    undo_by: str | None = None
    compensated_at_ms: int | None = None


@dataclass(frozen=True)
class NewIntent:
    """Inserted as PENDING, attempt 1, first_attempt_at = attempt_started_at = now."""

    idempotency_key: str
    execution_id: str
    name: str
    business_key_handle: str | None
    fingerprint: str
    request: JSON
    owner: LeaseRef


@dataclass(frozen=True)
class IntentGuard:
    """The full predicate of one compare-and-set ``UPDATE``; matched by row count."""

    status: IntentStatus
    attempt: int
    owner: LeaseRef | None  # None matches a row with no owner
    owner_not_live: bool = False  # the owner's lease must not be live (database clock)
    max_key_age_ms: int | None = None  # now - first_attempt_at must be below this
    retry_for: str | _Unset | None = UNSET  # the retry authorisation must be this one
    any_owner: bool = False  # match whatever owner the row has (``owner`` is ignored)
    sent_by: str | None = None  # the current attempt must have been sent by this one
    failure_shared: bool | None = None  # the failure must (not) have been handed out


@dataclass(frozen=True)
class IntentUpdate:
    """Columns to set; UNSET leaves a column alone. Times are set from the database clock."""

    status: IntentStatus | None = None
    attempt: int | None = None
    owner: LeaseRef | _Unset | None = UNSET
    start_attempt: bool = False  # attempt_started_at = now
    complete: bool = False  # completed_at = now
    result: JSON | _Unset = UNSET
    result_stored: bool | None = None
    request: JSON | _Unset = UNSET
    gateway_transaction_id: str | _Unset | None = UNSET
    needs_operator: bool | None = None
    operator_reason: str | _Unset | None = UNSET
    not_sent_confirmed: bool | None = None
    # Added by the store engineer (additive): the sweep's lookup back-off.
    next_lookup_delay_ms: int | None = None  # next_lookup_at = now + this
    clear_next_lookup: bool = False  # next_lookup_at = NULL
    lookup_failures: int | None = None
    failure: JSON | _Unset = UNSET
    retry_for: str | _Unset | None = UNSET
    failure_shared: bool | None = None
    sent_by: str | _Unset = UNSET  # the execution that sends the attempt this starts
    rely: bool = False  # reliance + 1: this change hands the result to a new relier


@dataclass(frozen=True)
class IntentTransition:
    """One guarded change of an intent and the history row that records it, chained to
    the writer's last row: what ``Store.transition_in_one`` writes."""

    key: str
    guard: IntentGuard
    update: IntentUpdate
    row: HistoryRow


@dataclass(frozen=True)
class OneStatementClaim:
    """What ``Store.claim_in_one`` did. ``fenced``: the lease was not live and mine,
    nothing was written. ``cancel_reason``: a cancel of the execution was requested,
    nothing was written. ``inserted``: the intent was claimed, with its first history
    row; False (nothing written) when its key existed: the caller reads it.
    ``expires_at_ms``: the lease's new expiry, only from a statement that committed its
    extension; None tells the holder nothing was extended (it counts no extension)."""

    fenced: bool
    inserted: bool
    cancel_reason: str | None
    expires_at_ms: int | None
    now_ms: int | None


@dataclass(frozen=True)
class OneStatementTransition:
    """What ``Store.transition_in_one`` did. ``fenced``: the lease was not live and mine,
    nothing was written. ``won``: the intent changed, with its history row (and the
    record use). ``chained``: the holder's last row was still the intent's last; when it
    was not, nothing was written and the caller must use the transaction instead.
    ``expires_at_ms``: as ``OneStatementClaim``'s; a statement that failed whole (its
    history row's ``(key, seq)`` taken meanwhile) reports None, its extension gone too."""

    fenced: bool
    won: bool
    chained: bool
    expires_at_ms: int | None
    now_ms: int | None


@dataclass(frozen=True)
class HistoryRow:
    """One transition of an intent, chained by digest to the row before it (quarantine record)."""

    idempotency_key: str
    seq: int
    at_ms: int
    event: str
    from_status: str | None
    to_status: str
    attempt: int
    holder: str | None
    token: int | None
    detail: JSON
    prev_digest: str | None
    digest: str
    # The execution whose delivery made the transition (None: the sweep, an operator, or
    # a row from before executions were named); covered by the digest when set.
    execution_id: str | None = None


@dataclass(frozen=True)
class EffectRecord:
    key: str
    execution_id: str
    name: str
    result: JSON
    token: int
    created_at_ms: int
    # HMAC of the canonical request when the effect was given one (None otherwise): a
    # second run with another request is a conflict, not a replay. Added by the engine.
    fingerprint: str | None = None
    reliance: int = 0
    undo_by: str | None = None
    compensated_at_ms: int | None = None


class Reliance(str, enum.Enum):
    """What handing a record's result to an execution found (``rely_on``)."""

    RELIED = "RELIED"  # its reliance is on the record (noted now, or before)
    UNDONE = "UNDONE"  # an undo claimed the record first: its result is no longer handed out
    ABSENT = "ABSENT"  # no such record, or not settled as expected


@dataclass(frozen=True)
class RecordUser:
    """One execution that used a record, as the record and the execution row say."""

    execution_id: str
    relied: bool  # the record's result was handed to it
    completed_on: bool  # it completed while relying on the record (kept for it)
    state: str | None  # its ExecutionState's value now; None once retention removed it
    cancel_requested: bool = False


@dataclass(frozen=True)
class SharedRecord:
    """An intent or a fenced effect with everything the decisions about the executions
    that share it read (``core/shared_records.py``): one read of the store."""

    kind: str  # INTENT_RECORD or EFFECT_RECORD
    key: str
    name: str
    status: IntentStatus  # a fenced effect's record is COMPLETED: it exists
    creator: str
    sent_by: str | None  # an intent's current attempt's sender
    reliance: int
    undo_by: str | None
    compensated: bool
    users: tuple[RecordUser, ...]  # every execution that used it, its creator first


class StoreTransaction(Protocol):
    """One open database transaction. Closed on leaving the ``with`` block (commit or rollback)."""

    @property
    def now_ms(self) -> int:
        """The database clock, read once when the transaction began."""

    @property
    def connection(self) -> Any:
        """The driver-level connection (SQLAlchemy ``Connection``) for a fenced effect's fn."""

    def read_intent(self, idempotency_key: str) -> IntentRecord | None: ...

    def insert_intent(self, intent: NewIntent, first_history: HistoryRow | None = None) -> bool:
        """``INSERT … ON CONFLICT DO NOTHING``; True when this call inserted the row, and
        then ``first_history`` (when given) was written with it, never without it."""

    def update_intent(self, idempotency_key: str, guard: IntentGuard, update: IntentUpdate) -> bool:
        """One ``UPDATE … WHERE <guard>``; True when exactly one row matched."""

    def last_history(self, idempotency_key: str) -> HistoryRow | None: ...

    def append_history(self, row: HistoryRow) -> None: ...

    def append_history_after(self, row: HistoryRow) -> bool:
        """Append ``row`` only while the row it chains to is the intent's last, without
        reading it; False, nothing written, when another row came first."""

    def read_effect(self, key: str) -> EffectRecord | None: ...

    def insert_effect(self, record: EffectRecord) -> bool:
        """``INSERT … ON CONFLICT DO NOTHING``; True when inserted (``created_at_ms``: now)."""

    def record_use(self, kind: str, record_key: str, execution_id: str) -> None:
        """Note that ``execution_id``, not the record's creator, used the intent
        (``kind="intent"``) or fenced effect (``"effect"``) under ``record_key``: retention
        keeps the record while that execution is not terminal, and settling the record
        re-drives it. Once per execution and record."""

    def rely_on(
        self, kind: str, record_key: str, execution_id: str, *, counted: bool = False
    ) -> Reliance:
        """Hand the record's result to ``execution_id``: its reliance is written on the
        record (``reliance`` + 1, by a compare-and-set that fails once an undo claimed it:
        ``UNDONE``) and its use marked relied, unless it relied already. ``counted``: the
        caller's own compare-and-set (a settle) already counted it."""

    def read_shared(self, kind: str, record_key: str) -> SharedRecord | None:
        """The record and every execution that used it, with their states."""

    def shared_records_of(
        self, execution_id: str, *, excluding: Collection[str] = ()
    ) -> list[SharedRecord]:
        """Every intent the execution created, sent an attempt of, or used, but those whose
        keys are in ``excluding`` (a divergence check never needs the keys reached)."""

    def claim_undo(self, kind: str, record_key: str, execution_id: str, reliance: int) -> bool:
        """``undo_by = execution_id`` while no undo claimed the record and its reliance is
        still ``reliance`` (no execution relied on it since it was read)."""

    def lock_shared(self, kind: str, record_key: str) -> None:
        """Hold the record's row ``FOR UPDATE`` until the transaction ends (nothing when
        there is none; a backend whose writers run one at a time needs no lock): two
        transactions that each wrote an undo's mark and then judge the step from every mark
        judge one after the other, so the second sees the first's mark
        (design: compensated step). Taken after the lease and execution rows (lock order)."""

    def mark_compensated(self, kind: str, record_key: str, execution_id: str) -> None:
        """The undo ``execution_id`` claimed is done."""

    def completed_on_records(self, execution_id: str) -> None:
        """The execution completed: every record it relies on is kept for it."""


class FencedTransaction(StoreTransaction, Protocol):
    """A transaction that began by checking and extending ``lease`` on the database clock."""

    @property
    def lease(self) -> LeaseRef: ...

    @property
    def expires_at_ms(self) -> int:
        """The lease's expiry as extended inside this transaction."""

    def release_at_commit(self) -> None:
        """End this transaction by releasing the lease instead of extending it again: the
        release is checked like that extension (still mine, not expired on the database
        clock), so a holder that outlived its lease commits nothing; a delivery's verdict
        and its release then cost one round of the store, not two."""


class Store(Protocol):
    """The domain verbs of the lease, fence, intents, fenced effects and their history."""

    clock_offset_source: Callable[[], int] | None
    """Test-only: milliseconds added to the database clock in SQL (driven by ``VirtualClock``)."""

    def now_ms(self) -> int: ...

    def acquire_lease(self, scope: str, holder: str, ttl_ms: int) -> LeaseGrant | None:
        """Insert, or take over an expired/released lease with token + 1. Never re-entrant:
        a live lease (even held by ``holder`` itself) gives None."""

    def renew_lease(self, lease: LeaseRef, ttl_ms: int) -> int | None:
        """Extend a live lease; the new expiry, or None when it is lost (never revived)."""

    def renew_leases(self, leases: Sequence[LeaseRef], ttl_ms: int) -> dict[LeaseRef, RenewOutcome]:
        """One statement for a process's leases, skipping rows a fenced transaction has locked."""

    def release_lease(self, lease: LeaseRef) -> bool: ...

    def read_lease(self, scope: str) -> LeaseState | None: ...

    def fenced(
        self,
        lease: LeaseRef,
        ttl_ms: int,
        *,
        engine_only: bool = False,
        users_writes: bool = False,
    ) -> AbstractContextManager[FencedTransaction]:
        """Begin a transaction that refuses (``ExecutionFencedError``) unless ``lease`` is the
        live holder, extends it, and sets a lock timeout below ttl/3. ``engine_only``: no
        user code runs in it, so a backend may prove the lease at its commit without
        asking the database again (when it ended well inside the lease it extended).
        ``users_writes``: the user's code writes in it (a fenced effect), so a backend
        runs it where those writes are made (a Django project's connection)."""

    def claim_in_one(
        self,
        lease: LeaseRef,
        ttl_ms: int,
        intent: NewIntent,
        row: HistoryRow,
        *,
        cancel_of: str | None = None,
    ) -> OneStatementClaim | None:
        """A fenced transaction holding the claim (``create``), as one statement: with
        ``cancel_of``, that execution's cancel request read first (nothing claimed when
        one was requested). None when the backend has no such statement (the caller
        opens ``fenced()``); ``ExecutionFencedError`` when the lease is not live and mine."""

    def transition_in_one(
        self,
        lease: LeaseRef,
        ttl_ms: int,
        change: IntentTransition,
        *,
        relied_by: str | None = None,
    ) -> OneStatementTransition | None:
        """A fenced transaction holding one ``transition`` (and, with ``relied_by``, the
        record use marked relied), as one statement: ``change.row`` follows the holder's
        last history row, and the intent changes only while that row is the intent's last.
        None when the backend has no such statement (the caller opens ``fenced()``);
        ``ExecutionFencedError`` when the lease is not live and mine."""

    def transaction(self) -> AbstractContextManager[StoreTransaction]:
        """An unfenced transaction, for the sweep and operators: every write is a guarded CAS."""

    def read_intent(self, idempotency_key: str) -> IntentRecord | None: ...

    def read_history(self, idempotency_key: str) -> list[HistoryRow]: ...

    def read_effect(self, key: str) -> EffectRecord | None: ...

    def close(self) -> None: ...
