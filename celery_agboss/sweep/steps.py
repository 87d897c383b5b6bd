"""The steps of one sweep run (design: sweep), each bounded by the batch size (and the
reconcile step by a time budget, one interval).

``celery_agboss.sweep`` runs them in order: expire, reconcile stranded intents, end
cancel requests, re-drive (``celery_agboss.sweep.redrive``), completed executions whose
links never went out (``celery_agboss.sweep.links``), the outbox's leftovers, retention.
Every claim is a compare-and-set committed before any gateway call or publish; one
failing row is logged (``sweep.error``) and left for the next run, never stopping this
one. A step lists only rows it writes something for (an intent it could not look up
backs off), so a row it cannot act on yet never keeps its place at the head of every
batch.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from typing import TYPE_CHECKING, Any

from celery_agboss.core import sabotage
from celery_agboss.core.cancelled_intents import settle_not_sent_for_cancel
from celery_agboss.core.executions import ExecutionState
from celery_agboss.core.log_events import (
    EXECUTION_CANCELLED,
    EXECUTION_EXPIRED,
    EXECUTION_WAITING_OPERATOR,
    SWEEP_ERROR,
    log_event,
)
from celery_agboss.core.protections import RETENTION_ON_A_NEWER_STORE, STRANDED_NOT_RECONCILED
from celery_agboss.core.store_protocol import IntentGuard, IntentStatus, LeaseRef
from celery_agboss.core.stranded import (
    StrandedLookup,
    StrandedOutcome,
    back_off_stranded,
    look_up_stranded,
)
from celery_agboss.errors import ExecutionFencedError, StoreError
from celery_agboss.operator.common import newer_state_of
from celery_agboss.outbox.publishing import sweep_outbox
from celery_agboss.runtime.app_runtime import Runtime
from celery_agboss.runtime.known_settings import effective_interval
from celery_agboss.runtime.task_events import (
    TASK_UNRECONCILED,
    send_revoked_event,
    send_task_event,
)
from celery_agboss.store.cancels import CANCEL_FLAGS_FROM
from celery_agboss.store.held_messages import forget_held_if_unchanged, read_held
from celery_agboss.store.migrate import newer_than_this_code
from celery_agboss.store.schema import SWEEPER_SCOPE_PREFIX
from celery_agboss.store.unsealed_intents import read_unsealed_intent
from celery_agboss.sweep.links import republish_unsent_links
from celery_agboss.sweep.redrive import redrive_due, redrive_one
from celery_agboss.sweep.report import SweepReport

if TYPE_CHECKING:
    from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore


class SweepRun:
    """One sweep run: the app, its store, the settings, and the sweeper's own lease.
    ``reconcile_budget_seconds``: how long the reconcile step may go on starting lookups
    (default: the sweep interval)."""

    def __init__(
        self,
        runtime: Runtime,
        batch_size: int,
        report: SweepReport,
        *,
        reconcile_budget_seconds: float | None = None,
    ) -> None:
        self.runtime = runtime
        self.app = runtime.app
        self.settings = runtime.settings
        self.store: SQLAlchemyStore = runtime.store
        self.executions = runtime.executions
        self.batch = batch_size
        self.report = report
        # A lookup is bounded by attempt_timeout; the lease must outlive one lookup.
        self.lease_ttl_ms = self.settings.lease_ttl_ms + self.settings.attempt_timeout_ms
        self.lease: LeaseRef | None = None
        self._as_of_ms: int | None = None
        self._left_to_newer: set[str] = set()
        self.reconcile_budget_seconds = (
            effective_interval(self.settings.sweep_interval_seconds)
            if reconcile_budget_seconds is None
            else reconcile_budget_seconds
        )

    def as_of_ms(self) -> int:
        """The database time at which this run judges leases dead and lookups or re-drives
        due, read once: a lease that expires between the stranded-intent step and the
        re-drive step would otherwise be re-published before the sweep looked its intent
        up (harmless, the delivery reconciles first, but the two steps would disagree)."""
        if self._as_of_ms is None:
            self._as_of_ms = self.store.now_ms()
        return self._as_of_ms

    # --- 1. expiry -----------------------------------------------------------------

    def expire(self) -> None:
        """Each listed execution in its own transaction: one that fails is named and left
        for the next run, never rolling the others back."""
        for execution_id in self.executions.find_expiring(self.batch):
            try:
                expired = self.executions.expire_if_due(execution_id)
            except (Exception, StoreError):
                self._row_failed("expire", execution_id)
                continue
            if expired is None:
                continue
            self.report.expired += 1
            log_event(EXECUTION_EXPIRED, execution_id=execution_id, task=expired.task_name)
            send_revoked_event(self.app, execution_id, ExecutionState.EXPIRED)

    # --- 2. stranded intents ---------------------------------------------------------

    def reconcile(self) -> None:
        """Look the stranded intents up, oldest first, until the batch or the time budget
        ends. The budget keeps lookups that hang (a gateway outage) from holding back the
        steps after this one: a lookup is bounded by ``attempt_timeout``, so the step
        lasts at most the budget plus one lookup, and makes at least one. The intents not
        reached are the next run's; each one looked up and not settled was backed off
        (``core.stranded``), so the next run's listing starts past it."""
        if sabotage.active(STRANDED_NOT_RECONCILED):
            return
        keys = self.executions.find_stranded_keys(self.batch, as_of_ms=self.as_of_ms())
        if not keys:
            return
        grant = self.store.acquire_lease(
            f"{SWEEPER_SCOPE_PREFIX}{uuid.uuid4()}", str(uuid.uuid4()), self.lease_ttl_ms
        )
        if grant is None:  # pragma: no cover - a fresh uuid scope is never held
            return
        self.lease = grant.lease
        deadline = time.monotonic() + self.reconcile_budget_seconds
        for done, (key, execution_id) in enumerate(keys):
            if done and time.monotonic() >= deadline:
                self.report.lookups_deferred += len(keys) - done
                return
            if not self._reconcile_one(self.lease, key, execution_id):
                return

    def _reconcile_one(self, lease: LeaseRef, key: str, execution_id: str) -> bool:
        """One stranded intent; False once the sweeper's own lease is lost (a lookup
        overran it): the step stops, the next run goes on."""
        try:
            found = look_up_stranded(
                self.store,
                self.runtime.engine_settings,
                key,
                sweeper_lease=lease,
                sweeper_ttl_ms=self.lease_ttl_ms,
            )
        except ExecutionFencedError:
            self.report.errors += 1
            log_event(SWEEP_ERROR, logging.WARNING, step="reconcile", reason="lease-lost")
            return False
        except (Exception, StoreError):
            self._row_failed("reconcile", execution_id)
            self._back_off(lease, key, execution_id)
            return True
        self._after_reconcile(found, key, execution_id)
        return True

    def _back_off(self, lease: LeaseRef, key: str, execution_id: str) -> None:
        """An intent whose reconcile raised waits like one whose lookup failed, else it
        would head the oldest-first listing of every run and hide the newer ones. Read
        by its unsealed columns: one sealed under a key this process lacks (its reconcile
        raised reading it) backs off too (design: sealed at rest). When even this fails
        (the store is down), the next run tries both again."""
        try:
            back_off_stranded(
                self.store,
                self.runtime.engine_settings,
                key,
                read=read_unsealed_intent,
                sweeper_lease=lease,
                sweeper_ttl_ms=self.lease_ttl_ms,
                reason="sweep-error",
            )
        except (Exception, StoreError):
            log_event(
                SWEEP_ERROR,
                logging.WARNING,
                exc_info=True,
                step="reconcile-back-off",
                execution_id=execution_id,
            )

    def _after_reconcile(self, found: StrandedLookup, key: str, execution_id: str) -> None:
        report = self.report
        outcome = found.outcome
        if outcome is StrandedOutcome.COMPLETED:
            report.reconciled += 1
            self._unblock(key)
        elif outcome is StrandedOutcome.NOT_SENT_CONFIRMED:
            # Counted as confirmed only when the call's lookup proves absence.
            if found.proven:
                report.not_sent_confirmed += 1
            else:
                report.not_sent_unproven += 1
            self._unblock(key)
        elif outcome is StrandedOutcome.UNRECONCILED:
            report.unreconciled += 1
            try:
                moved = self.executions.move(
                    execution_id,
                    [ExecutionState.REQUESTED, ExecutionState.RUNNING, ExecutionState.WAITING],
                    ExecutionState.WAITING_OPERATOR,
                    "unreconciled: the sweep's lookup could not tell; an operator decides "
                    "(celery agboss pending)",
                )
            except ValueError as error:
                self._left_to_a_newer_version("reconcile", execution_id, error)
                return
            if moved is not None:
                send_task_event(
                    self.app,
                    TASK_UNRECONCILED,
                    execution_id,
                    agboss_state=moved.state.value,
                    by="sweep",
                )
        elif outcome is StrandedOutcome.LOOKUP_FAILED:
            report.lookup_failed += 1
        elif outcome is StrandedOutcome.UNKNOWN_CALL:
            # Backed off like a failed lookup (core.stranded); an error of the deployment:
            # counted where the run's errors are, and said with the call's name there.
            report.unknown_calls += 1
            report.errors += 1
            log_event(
                SWEEP_ERROR,
                logging.WARNING,
                step="reconcile",
                reason="unknown-call",
                execution_id=execution_id,
                hint="see outbound-call.unreconciled reason=unknown-call: import the module "
                "declaring the call in the sweeping worker",
            )

    def _unblock(self, key: str) -> None:
        """Every execution that waited for an operator only because of this intent (its
        creator, or one that used it) goes back to ``WAITING``; the re-drive below
        publishes it."""
        for execution_id in self.executions.executions_waiting_on(key):
            try:
                self.executions.unblock(execution_id, "the sweep settled the intent it waited for")
            except ValueError as error:
                self._left_to_a_newer_version("reconcile", execution_id, error)

    def _left_to_a_newer_version(self, step: str, execution_id: str, error: ValueError) -> None:
        """A write to ``execution_id`` raised ``error`` reading its row. When a newer
        version of the package wrote its state (``operator.common.newer_state_of``),
        this version decides nothing about it: left to that version's sweep, said once
        per run (a WARNING, not an error). Any other ``ValueError`` is raised as it was."""
        with self.store.read_transaction() as tx:
            state = newer_state_of(tx, execution_id)
        if state is None:
            raise error
        if execution_id in self._left_to_newer:
            return
        self._left_to_newer.add(execution_id)
        log_event(
            SWEEP_ERROR,
            logging.WARNING,
            "left to a newer version: this sweep does not know the state it wrote",
            step=step,
            reason="state-of-a-newer-version",
            execution_id=execution_id,
            state=state,
            hint="a newer version of celery_agboss wrote this state; its sweep goes on "
            "with the execution; finish the upgrade",
        )

    # --- 3. cancels -----------------------------------------------------------------

    def cancel(self) -> None:
        """End the cancel requests ``find_cancel_requested`` lists: only rows this step
        writes something for, so a row it cannot end yet never holds the others back."""
        for execution_id in self.executions.find_cancel_requested(self.batch):
            try:
                self._cancel_one(execution_id)
            except (Exception, StoreError):
                self._row_failed("cancel", execution_id)
                with contextlib.suppress(Exception, StoreError):  # the next run tries both
                    self.executions.put_cancel_request_last(execution_id)

    def _cancel_one(self, execution_id: str) -> None:
        for key in self.executions.pending_intent_keys(execution_id):
            intent = self.store.read_intent(key)
            if (
                intent is not None
                and intent.not_sent_confirmed
                and not intent.needs_operator
                and not intent.owner_live
            ):
                self._settle_not_sent_for_cancel(key)
        pending = [
            intent
            for intent in map(
                self.store.read_intent, self.executions.pending_intent_keys(execution_id)
            )
            if intent is not None
        ]
        record = self.executions.end_cancel_requested(execution_id, "cancel requested")
        if record is None:
            return
        if record.state is ExecutionState.CANCELLED:
            self.report.cancelled += 1
            log_event(EXECUTION_CANCELLED, execution_id=execution_id, task=record.task_name)
            send_revoked_event(self.app, execution_id, ExecutionState.CANCELLED)
        elif record.state is ExecutionState.WAITING_OPERATOR:
            log_event(
                EXECUTION_WAITING_OPERATOR,
                logging.WARNING,
                execution_id=execution_id,
                task=record.task_name,
                reason=record.reason,
            )
            send_task_event(
                self.app,
                TASK_UNRECONCILED,
                execution_id,
                agboss_state=record.state.value,
                reason=record.reason,
            )
        elif any(_needs_operator(i) for i in pending):
            self.executions.move(
                execution_id,
                list(CANCEL_FLAGS_FROM),
                ExecutionState.WAITING_OPERATOR,
                "cancel requested, but an intent needs an operator first (celery agboss pending)",
            )

    def _settle_not_sent_for_cancel(self, key: str) -> None:
        """The one rule of ``settle_not_sent_for_cancel``, for an intent no live lease
        owns (the sweep acts under none)."""
        with self.store.transaction() as tx:
            intent = tx.read_intent(key)
            if (
                intent is None
                or intent.status is not IntentStatus.PENDING
                or not intent.not_sent_confirmed
                or intent.needs_operator
            ):
                return
            settle_not_sent_for_cancel(
                tx,
                self.runtime.engine_settings,
                intent,
                IntentGuard(
                    IntentStatus.PENDING, intent.attempt, intent.owner, owner_not_live=True
                ),
                by="sweep",
                actor=None,
            )

    # --- 4a. messages a dead worker held unstarted ---------------------------------

    def held(self) -> None:
        """Re-publish at once what a worker that stopped writing its row (killed, or
        frozen for a lease TTL) held unstarted, instead of after the requested grace
        (``celery_agboss.worker.held_messages`` says why that is safe); ids a live worker lists
        too are left to it."""
        ttl_ms = self.settings.lease_ttl_ms
        rows = read_held(self.store)
        live = {found for row in rows if row.age_ms < ttl_ms for found in row.execution_ids}
        for row in rows:
            if row.age_ms < ttl_ms:
                continue
            for execution_id in row.execution_ids:
                if execution_id in live:
                    continue
                try:  # the read too: a row no key opens fails alone, by name
                    self._held_one(execution_id)
                except (Exception, StoreError):
                    self._row_failed("held", execution_id)
            forget_held_if_unchanged(self.store, row)

    def _held_one(self, execution_id: str) -> None:
        try:
            record = self.executions.read_execution(execution_id)
        except ValueError as error:
            return self._left_to_a_newer_version("held", execution_id, error)
        if record is None or record.state is not ExecutionState.REQUESTED:
            return
        if not record.cancel_requested:
            redrive_one(self.runtime, self.report, record)

    # --- 4. re-drive (celery_agboss.sweep.redrive) --------------------------------------

    def redrive(self) -> None:
        redrive_due(
            self.runtime,
            self.batch,
            self.report,
            as_of_ms=self.as_of_ms(),
            row_failed=self._row_failed,
        )

    def _row_failed(self, step: str, execution_id: str) -> None:
        """One row's step raised (called in its ``except``): counted and logged with the
        traceback, left for the next run; the run goes on."""
        self.report.errors += 1
        log_event(SWEEP_ERROR, logging.ERROR, exc_info=True, step=step, execution_id=execution_id)

    # --- 4b. links that never went out (celery_agboss.sweep.links) ---------------------

    def links(self) -> None:
        republish_unsent_links(
            self.runtime,
            self.batch,
            self.report,
            as_of_ms=self.as_of_ms(),
            row_failed=self._row_failed,
        )

    # --- 4c. the outbox (celery_agboss.outbox) ------------------------------------------

    def outbox(self) -> None:
        """Publish the follow-ups a worker committed but died before publishing."""
        done = sweep_outbox(self.runtime, self.batch)
        self.report.outbox_published += done.published
        self.report.outbox_deleted += done.deleted
        self.report.errors += done.errors

    # --- 5. retention ---------------------------------------------------------------

    def retention(self) -> None:
        """Delete what nothing needs any more, unless the store is newer than this code
        (``store.migrate.newer_than_this_code``: its revision or its retention-rules
        generation): its deletes would lack the newer version's keep rules (a row a
        message still in the broker needs), so an old beat left running never deletes."""
        newer = (
            None
            if sabotage.active(RETENTION_ON_A_NEWER_STORE)
            else newer_than_this_code(self.store.engine)
        )
        if newer is not None:
            log_event(
                SWEEP_ERROR,
                logging.WARNING,
                "retention skipped: this code is older than its store; deploy the newer"
                " version everywhere",
                step="retention",
                **newer,
            )
            return
        s = self.settings
        now = self.store.now_ms()
        executions = self.executions
        intents = executions.delete_settled_intents_before(
            now - s.outbound_retention_ms, self.batch
        )
        effects = executions.delete_effects_before(now - s.fenced_effect_retention_ms, self.batch)
        self.report.intents_deleted += intents.rows
        self.report.effects_deleted += effects.rows
        self.report.executions_deleted += executions.delete_terminal_executions_before(
            now - s.terminal_execution_retention_ms, self.batch
        )
        executions.delete_dead_sweeper_leases(3_600_000, self.batch)

    # --- the end ----------------------------------------------------------------------

    def release(self) -> None:
        lease, self.lease = self.lease, None
        if lease is None:
            return
        try:
            if self.store.release_lease(lease):
                self.executions.delete_released_lease(lease)
        except (Exception, StoreError):
            log_event(SWEEP_ERROR, logging.WARNING, exc_info=True, step="release")


def _needs_operator(intent: Any) -> bool:
    if intent.status is IntentStatus.PENDING:
        return bool(intent.needs_operator)
    return intent.status is IntentStatus.COMPLETED and not intent.result_stored


__all__ = [
    "SweepReport",
    "SweepRun",
]  # SweepReport: re-exported, its home is celery_agboss.sweep.report
