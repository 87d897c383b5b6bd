"""Executions: one logical task run, from its publish to its terminal state.

The protocol the Celery layer, the sweep and the operator commands speak, implemented
on SQLAlchemy by ``celery_agboss.store.execution_store``. Messages, results and errors
arrive as text encoded by the Celery layer; the store keeps them as they are.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

from celery_agboss.core.pauses import PauseRecord
from celery_agboss.core.store_protocol import FencedTransaction, LeaseGrant, LeaseRef


class ExecutionState(str, enum.Enum):
    REQUESTED = "REQUESTED"  # recorded at publish, not started yet
    RUNNING = "RUNNING"  # a delivery holds (or held, until it expires) the lease
    WAITING = "WAITING"  # a retry or a long wait; re-driven once not_before passed
    PAUSED = "PAUSED"  # waits for answer_pause()
    WAITING_OPERATOR = "WAITING_OPERATOR"  # waits for an operator's decision
    COMPENSATING = "COMPENSATING"  # undo running
    PARKED = "PARKED"  # recovery cap reached; an operator re-drives it
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    EXPIRED = "EXPIRED"
    # The message reached a worker whose task is not a PaymentTask (a plain task that
    # matched ``agboss_payment_tasks``, an old worker of a rolling deploy): it ran there
    # once, unprotected, and is never re-published.
    UNMANAGED = "UNMANAGED"


TERMINAL_STATES = frozenset(
    {
        ExecutionState.COMPLETED,
        ExecutionState.FAILED,
        ExecutionState.CANCELLED,
        ExecutionState.EXPIRED,
        ExecutionState.UNMANAGED,
    }
)
"""A delivery of an execution in one of these never runs the body."""

ANSWER_STATES = frozenset(
    {ExecutionState.PAUSED, ExecutionState.WAITING_OPERATOR, ExecutionState.PARKED}
)
"""Visibly waiting for a person (or ``answer_pause``): neither a delivery nor the sweep
runs the body until the answer moves the execution on."""

OPERATOR_WAIT_STATES = frozenset({ExecutionState.WAITING_OPERATOR, ExecutionState.PARKED})
"""Of ``ANSWER_STATES``, the ones only an operator's command ends (a ``PAUSED`` one waits
for its answer, ``agboss pauses``): what ``agboss pending`` lists with the command that
ends each, what the chaos verdict counts as "waiting for an operator", and the states of
the metrics' alert "a payment waits for a person" (docs/metrics.md)."""

REDRIVABLE_STATES = frozenset(
    {
        ExecutionState.REQUESTED,
        ExecutionState.RUNNING,
        ExecutionState.WAITING,
        ExecutionState.COMPENSATING,
    }
)
"""States the sweep re-drives when no lease is live and their time has come."""

CANCELLED_AFTER_PAYMENT = "cancelled after a completed payment"
"""The reason of an execution whose cancel request came after one of its outbound calls
completed: money moved, so it is never silently ``CANCELLED``. One that declared undos
runs them first (``COMPENSATING``); one that did not, or whose undos left a completed call
undone, waits for an operator (``celery -A proj agboss cancel ID --payments-handled``)."""

CANCEL_WAITS = "cancel waits"
"""The reason of a cancelled execution whose payment another execution still uses (a
double click whose other order may still complete on it): it waits, re-driven, until
that one ended, then is kept for it, undone, or left to a person."""

UNDO_WAITS = "undo waits"
"""The reason of a ``COMPENSATING`` execution whose undo of a shared step waits for
another execution that still uses the step (re-driven until that one ended)."""

DIVERGENCE = "divergence"
"""The reason of an execution whose re-run no longer reached an intent an earlier delivery
created that completed or may have: the body took another path, so it waits for an
operator, who refunds what must go and accepts the result
(``celery -A proj agboss accept ID``), or cancels it."""


class WaitKind(enum.Enum):
    """What an execution's reason says it waits for, read in one place so that the
    operator's listing and its verbs never disagree about which command ends a wait."""

    CANCELLED_AFTER_PAYMENT = "cancelled-after-payment"  # a person: cancel --payments-handled
    DIVERGENCE = "divergence"  # a person: accept, or cancel --payments-handled
    SHARED = "shared"  # another execution (a cancel or an undo waits): ends by itself
    OTHER = "other"  # none of these: intents to resolve, or nothing left (redrive)

    @property
    def a_person_decides(self) -> bool:
        """Settling an intent never ends it: only an operator's decision does (``agboss
        cancel --payments-handled``, ``agboss accept``)."""
        return self in (WaitKind.CANCELLED_AFTER_PAYMENT, WaitKind.DIVERGENCE)


def wait_kind(reason: str | None) -> WaitKind:
    """The kind of wait ``reason`` (an execution's ``reason``) names, by its prefix."""
    text = reason or ""
    if text.startswith(CANCELLED_AFTER_PAYMENT):
        return WaitKind.CANCELLED_AFTER_PAYMENT
    if text.startswith(DIVERGENCE):
        return WaitKind.DIVERGENCE
    if text.startswith((CANCEL_WAITS, UNDO_WAITS)):
        return WaitKind.SHARED
    return WaitKind.OTHER


def shared_wait_reason(waits: str, other: str, why: str) -> str:
    """The reason of an execution that waits for ``other`` on a shared record (``waits``:
    ``CANCEL_WAITS`` or ``UNDO_WAITS``), written so that ``waited_for`` reads it back."""
    return f"{waits}: execution {other} {why}"


def waited_for(reason: str | None) -> str | None:
    """The execution a shared wait's reason names (``shared_wait_reason``), else None."""
    if wait_kind(reason) is not WaitKind.SHARED:
        return None
    rest = (reason or "").split(": execution ", 1)
    return rest[1].split(" ", 1)[0] if len(rest) == 2 else None


CANCELLABLE_STATES = frozenset(
    {
        ExecutionState.REQUESTED,
        ExecutionState.RUNNING,
        ExecutionState.WAITING,
        ExecutionState.PAUSED,
        ExecutionState.WAITING_OPERATOR,
        ExecutionState.PARKED,
    }
)
"""States a cancel request ends (once no lease is live and nothing is pending).
``COMPENSATING`` is not one: an undo that started runs to its end."""


@dataclass(frozen=True)
class Audit:
    """An operator's decision: written as an audit row in the transaction that makes the
    change, so a change never commits without its row (nor a row without its change)."""

    actor: str
    action: str
    reason: str


def execution_summary(record: ExecutionRecord) -> str:
    """What an audit row keeps of an execution before and after a decision (JSON).

    The audit stays in clear while the reason is sealed (an undo's failure quotes its
    error there), so only the reason's name is kept, the text before its first ``:``,
    as the intent summaries keep an operator reason's (design: sealed at rest)."""
    reason = None if record.reason is None else record.reason.split(":", 1)[0]
    return json.dumps(
        {
            "state": record.state.value,
            "cancel_requested": record.cancel_requested,
            "recovery_count": record.recovery_count,
            "reason": reason,
        }
    )


def execution_scope(execution_id: str) -> str:
    """The lease scope of an execution: its task id (one lease row per execution)."""
    return execution_id


@dataclass(frozen=True)
class ExecutionMessage:
    """An execution's message as the broker holds it: what a re-publish sends again.

    ``args``, ``kwargs`` and ``options`` are JSON text made by the Celery layer
    (``options``: queue, routing, priority, links, chain, root and parent ids,
    time limits, retries, custom headers). Times are ms since the epoch.
    """

    execution_id: str
    task_name: str
    args: str
    kwargs: str
    options: str
    eta_ms: int | None = None
    expires_ms: int | None = None


@dataclass(frozen=True)
class ExecutionRecord:
    id: str
    task_name: str
    state: ExecutionState
    args: str
    kwargs: str
    options: str
    eta_ms: int | None
    expires_ms: int | None
    requested_at_ms: int
    started_at_ms: int | None
    not_before_ms: int | None
    wake_requested: bool
    recovery_count: int
    deliveries: int
    cancel_requested: bool
    cancel_reason: str | None
    reason: str | None
    result: str | None  # encoded by the Celery layer
    error: str | None  # encoded by the Celery layer
    terminal_at_ms: int | None
    links_dispatched: bool  # the terminal delivery's chain/callbacks went out
    updated_at_ms: int
    read_at_ms: int  # the database clock when read
    # The next re-publish continues a planned wait (a long retry's end, an answered
    # pause, an operator's decision): it does not count toward the recovery cap.
    redrive_planned: bool = False
    # An operator said the payment it left behind (FAILED, CANCELLED) is dealt with.
    payments_handled_at_ms: int | None = None

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def message(self) -> ExecutionMessage:
        return ExecutionMessage(
            execution_id=self.id,
            task_name=self.task_name,
            args=self.args,
            kwargs=self.kwargs,
            options=self.options,
            eta_ms=self.eta_ms,
            expires_ms=self.expires_ms,
        )


class StartKind(str, enum.Enum):
    STARTED = "STARTED"  # this delivery holds the lease; the execution is RUNNING
    DEFERRED = "DEFERRED"  # a live lease elsewhere: wake_requested set, body not run
    TERMINAL = "TERMINAL"  # already terminal (maybe just now: expired or cancelled)
    WAITING_ANSWER = "WAITING_ANSWER"  # PAUSED, WAITING_OPERATOR or PARKED: body not run
    PARKED = "PARKED"  # this take-over went past the recovery cap: PARKED now


@dataclass(frozen=True)
class AnsweredPause:
    """What an answer did: ``record`` is the execution after it; ``early``: the pause
    was not stored yet, so the answer is kept for it and nothing is to re-publish (the
    body takes it when it reaches the pause)."""

    record: ExecutionRecord
    early: bool = False


@dataclass(frozen=True)
class DeliveryStart:
    kind: StartKind
    execution: ExecutionRecord
    grant: LeaseGrant | None = None  # set when STARTED
    took_over: bool = False  # STARTED by taking over a delivery that did not end
    # The execution was first recorded by this delivery, not at publish: the publisher
    # did not know the task as a PaymentTask (a message lost before now left no trace).
    recorded_at_start: bool = False


@dataclass(frozen=True)
class OneStatementVerdict:
    """What a delivery's verdict and its release did as one statement. ``fenced``: the
    lease was not live and mine, nothing written. ``record``: the row after the verdict,
    the lease released; None when a fact the verdict was decided on changed meanwhile
    (nothing written: the fenced transaction decides again)."""

    fenced: bool
    record: ExecutionRecord | None


@dataclass(frozen=True)
class ReleaseOutcome:
    released: bool  # the lease was still this holder's
    republish: bool  # woken and not terminal: publish the message again (wake cleared)
    execution: ExecutionRecord | None


@dataclass(frozen=True)
class RedriveDecision:
    """The sweep's claim on one execution: publish it again, or it was parked."""

    republish: bool
    parked: bool
    execution: ExecutionRecord | None  # None when another sweeper got there first


@dataclass(frozen=True)
class AuditEntry:
    id: int
    at_ms: int
    actor: str
    action: str
    target: str
    reason: str
    before: str | None
    after: str | None


class ExecutionStore(Protocol):
    """The verbs on executions. Every verb is one transaction on the database clock."""

    # --- the delivery's life -------------------------------------------------------

    def record_requested(self, message: ExecutionMessage) -> bool:
        """At publish: insert ``REQUESTED``; an existing non-terminal execution gets the
        newer message (a retry's). True when inserted."""

    def start_delivery(
        self, message: ExecutionMessage, holder: str, ttl_ms: int, max_recovery_attempts: int
    ) -> DeliveryStart:
        """In one transaction: acquire the lease (never re-entrant) AND mark ``RUNNING``.

        A live lease elsewhere sets ``wake_requested`` (and keeps this message for the
        wake) and gives ``DEFERRED``. Taking over a delivery that did not end counts
        toward the cap; past it the execution is ``PARKED`` instead."""

    def finish_in(
        self, tx: FencedTransaction, result: str, reached: Collection[str] | None = None
    ) -> ExecutionRecord:
        """In the caller's fenced transaction (its lease's scope is the execution): store
        the result, ``COMPLETED`` — or ``WAITING_OPERATOR`` when an intent is pending or
        ``reached`` misses an intent an earlier delivery created (a divergence)."""

    def fail_in(self, tx: FencedTransaction, error: str, reason: str) -> ExecutionRecord:
        """Fenced: ``FAILED`` with the stored failure — unless the execution owns a PENDING
        intent, then ``WAITING_OPERATOR`` (never FAILED while a payment may be in flight)."""

    def finish_and_release(
        self, lease: LeaseRef, ttl_ms: int, result: str, reached: Collection[str] | None
    ) -> ExecutionRecord | None:
        """``finish_in`` and the lease's release at its commit, decided as there and written
        in one statement; None when the store has none or the facts changed meanwhile (then
        use the fenced transaction). ``ExecutionFencedError`` if the lease is not live, mine."""

    def fail_and_release(
        self, lease: LeaseRef, ttl_ms: int, error: str, reason: str
    ) -> ExecutionRecord | None:
        """``fail_in`` and the release, as ``finish_and_release``."""

    def wait_in(
        self,
        tx: FencedTransaction,
        delay_ms: int,
        reason: str,
        message: ExecutionMessage | None = None,
    ) -> ExecutionRecord:
        """Fenced: ``WAITING`` with ``not_before = now + delay_ms``; with ``message``, the
        message a re-publish sends after the wait (a long ``retry()``: its retries + 1)."""

    def undo_wait_in(self, tx: FencedTransaction, delay_ms: int, reason: str) -> ExecutionRecord:
        """Fenced: still ``COMPENSATING``, due again at ``now + delay_ms``, the re-drive a
        planned one (an undo waits for another execution that shares its step)."""

    @property
    def shared_wait_ms(self) -> int:
        """How long an execution waiting for another one on a shared record waits."""

    def waiting_operator_in(self, tx: FencedTransaction, reason: str) -> ExecutionRecord:
        """Fenced: ``WAITING_OPERATOR`` (an operator decides; nothing runs until then)."""

    def cancel_in(
        self, tx: FencedTransaction, reason: str, *, payments_handled: bool = False
    ) -> ExecutionRecord:
        """Fenced: ``CANCELLED`` (a cancel request's delivery settled every intent) —
        unless the execution has a PENDING intent (created by it or owned by its lease):
        a payment may be in flight, so the execution is left as it was, to be reconciled
        first. A terminal execution is returned unchanged. ``payments_handled``: its undos
        took care of every completed call (else one of them makes it wait for a person)."""

    def compensating_in(
        self,
        tx: FencedTransaction,
        reason: str,
        error: str | None = None,
        *,
        continuing: bool = False,
    ) -> ExecutionRecord:
        """Fenced: ``COMPENSATING`` (its undos run now), with ``error`` (the failure it ends
        with) when given — unless it is terminal or, when it does not continue an undo
        that started (``continuing``: its own refund is reconciled by the undo that made
        it), has a PENDING intent (no undo starts while a payment may be in flight): then
        it is returned unchanged."""

    def pause_in(
        self, tx: FencedTransaction, name: str, payload: str | None, *, accept_early: bool = False
    ) -> tuple[bool, str | None]:
        """Fenced: ``(True, answer)`` once the pause ``<id>:<name>`` was answered (or,
        with ``accept_early``, answered before it was stored: that answer is taken now);
        otherwise record it PENDING, the execution ``PAUSED``, and ``(False, None)``."""

    def release_delivery(self, lease: LeaseRef, *, will_republish: bool = False) -> ReleaseOutcome:
        """Release the lease and, in the same transaction, read and clear ``wake_requested``:
        ``republish`` when it was set and the execution is not terminal or waiting for an
        answer. ``will_republish``: the caller publishes anyway (its own retry), so the
        wake is cleared and folded into that message."""

    def release_in(
        self, tx: FencedTransaction, record: ExecutionRecord, *, will_republish: bool = False
    ) -> ReleaseOutcome:
        """In the fenced transaction that wrote ``record`` (the verdict) and releases the
        lease at its commit: read and clear ``wake_requested`` as ``release_delivery``
        does, without another transaction."""

    def mark_links_dispatched(self, execution_id: str) -> None:
        """The terminal delivery's chain and callbacks went out; replays send none."""

    # --- reads -------------------------------------------------------------------------

    def read_execution(self, execution_id: str) -> ExecutionRecord | None: ...

    def list_executions(
        self,
        states: Sequence[ExecutionState] | None = None,
        limit: int = 100,
        after_id: str | None = None,
    ) -> list[ExecutionRecord]:
        """By id, for operators; ``after_id`` pages."""

    # --- the sweep (its listings and expiry: ``store.redrive_and_expiry``) --------------

    def claim_redrive(
        self,
        execution_id: str,
        expected_updated_at_ms: int,
        max_recovery_attempts: int,
        *,
        next_redrive_delay_ms: int = 0,
    ) -> RedriveDecision:
        """Compare-and-set on ``updated_at_ms`` (so one sweeper wins), re-checking that no
        lease is live: count a re-publish toward the cap (for a RUNNING execution the
        take-over it leads to is what counts), or ``PARKED`` past it. The next
        re-drive waits ``next_redrive_delay_ms`` (``not_before``), so a message that sits
        in a backlog is not counted as one failed recovery after another."""

    # --- operators ---------------------------------------------------------------------

    def request_cancel(self, execution_id: str, reason: str) -> ExecutionRecord | None:
        """A not-running execution with no PENDING intent becomes ``CANCELLED``; a running
        one (or one owning a PENDING intent) gets ``cancel_requested``. None when unknown."""

    def move(
        self,
        execution_id: str,
        from_states: Sequence[ExecutionState],
        to_state: ExecutionState,
        reason: str,
        *,
        not_before_delay_ms: int | None = None,
        reset_recovery_count: bool = False,
    ) -> ExecutionRecord | None:
        """Compare-and-set an execution with no live lease from one of ``from_states`` to
        ``to_state`` (an operator's resolve: WAITING_OPERATOR → WAITING); None if not in them."""

    def answer_pause(self, pause_id: str, answer: str) -> AnsweredPause:
        """Answer a PENDING pause of a PAUSED execution once (``NotPausedError``, nothing
        moved, otherwise); the execution becomes WAITING, due now (the caller re-publishes
        it; while a delivery still holds the lease it is marked to be woken instead). A
        pause not stored yet, of a live execution, is answered early (kept for it)."""

    def list_pauses(self, limit: int = 100) -> list[tuple[str, str, str]]:
        """``(pause_id, execution_id, status)`` of pending pauses whose execution still
        waits for them, and of early answers no pause took yet, oldest first."""

    def read_pauses(
        self, *, pause_id: str | None = None, execution_id: str | None = None
    ) -> list[PauseRecord]:
        """The pause ``pause_id`` or every pause of ``execution_id``, with what it asks."""

    def append_audit(
        self,
        actor: str,
        action: str,
        target: str,
        reason: str,
        before: str | None = None,
        after: str | None = None,
    ) -> None: ...

    def list_audit(self, target: str | None = None, limit: int = 100) -> list[AuditEntry]: ...

    def set_meta(self, key: str, value: str) -> None: ...

    def get_meta(self, key: str) -> tuple[str, int] | None:
        """The value and when it was written (database clock), or None."""
