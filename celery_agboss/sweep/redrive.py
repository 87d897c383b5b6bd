"""The sweep's re-drive (design: re-drive, recovery cap): an execution whose message or
worker was lost is published again, and so is a message a dead worker held unstarted
(the held step, ``SweepRun.held``).

Each row is listed from its columns never sealed at rest, claimed by a compare-and-set
committed before anything is published (one more recovery, or ``PARKED`` at the cap),
and only then read, and its message opened, for the publish, inside the step's per-row
try. A row no key opens keeps its claim, so it leaves the head of the listing, and fails
alone, by name (``sweep.error``), never stopping the rows behind it
(design: sealed at rest); a claim that counted no recovery is counted then, as no
delivery follows it to count it, so the row parks at the cap.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import replace

from celery_agboss.core import sabotage
from celery_agboss.core.execution_facts import ExecutionFacts
from celery_agboss.core.executions import ExecutionRecord, ExecutionState
from celery_agboss.core.log_events import EXECUTION_PARKED, SWEEP_REPUBLISHED, log_event
from celery_agboss.core.protections import REDRIVE_WITHOUT_CLAIM, UNOPENED_REDRIVE_UNCOUNTED
from celery_agboss.errors import SealedValueUnopenableError, StoreError
from celery_agboss.runtime.app_runtime import Runtime
from celery_agboss.runtime.messages import republish
from celery_agboss.runtime.task_events import TASK_PARKED, send_task_event
from celery_agboss.sweep.report import SweepReport

STEP = "redrive"
"""The step's name in ``sweep.error``."""


def redrive_due(
    runtime: Runtime,
    batch: int,
    report: SweepReport,
    *,
    as_of_ms: int,
    row_failed: Callable[[str, str], None],
) -> None:
    """One run of the step: at most ``batch`` rows whose time came; a row that fails is
    ``row_failed``'s and the next run's."""
    settings = runtime.settings
    grace_ms = settings.requested_grace_ms
    ttl_ms = settings.lease_ttl_ms
    for row in runtime.executions.find_redrivable(batch, grace_ms, as_of_ms=as_of_ms):
        # A cancel-requested row is never listed (``find_redrivable``): the cancel
        # step ends it; a re-drive could send something new.
        if (
            row.state is ExecutionState.WAITING
            and not row.redrive_planned
            and row.not_before_ms is not None
            and row.read_at_ms < row.not_before_ms + ttl_ms
        ):
            # A retry's own message is due about now: give it one lease TTL to start
            # before publishing another copy. (A planned wait has no message on the
            # way: the sweep's re-publish is its continuation, due at once.)
            continue
        try:
            redrive_one(runtime, report, row)
        except (Exception, StoreError):
            row_failed(STEP, row.id)


def redrive_one(runtime: Runtime, report: SweepReport, row: ExecutionFacts) -> None:
    """Claim ``row`` (as listed, or as the held step read it), then publish it again."""
    executions = runtime.executions
    settings = runtime.settings
    if sabotage.active(REDRIVE_WITHOUT_CLAIM):
        unclaimed = executions.read_execution(row.id)
        if unclaimed is not None:
            publish(runtime, report, unclaimed)
        return
    # Keep the next re-drive away while this message may still sit in a queue.
    if row.state is ExecutionState.REQUESTED:
        delay = settings.requested_grace_ms
    else:
        delay = max(2 * settings.sweep_period_ms, settings.lease_ttl_ms)
    claim = executions.claim_redrive_row(
        row.id, row.updated_at_ms, settings.max_recovery_attempts, next_redrive_delay_ms=delay
    )
    if claim.parked and claim.row is not None:
        report.parked += 1
        log_event(
            EXECUTION_PARKED,
            logging.WARNING,
            execution_id=row.id,
            task=row.task_name,
            recovery_count=claim.row.recovery_count,
            by="sweep",
        )
        send_task_event(
            runtime.app,
            TASK_PARKED,
            row.id,
            agboss_state=ExecutionState.PARKED.value,
            recovery_count=claim.row.recovery_count,
        )
    elif claim.republish:
        # Read (and opened) after the claim committed: a row no key opens keeps it.
        try:
            record = executions.read_execution(row.id)
        except SealedValueUnopenableError:
            after = claim.row
            uncounted = after is not None and after.recovery_count == row.recovery_count
            if after is not None and uncounted and not sabotage.active(UNOPENED_REDRIVE_UNCOUNTED):
                # No delivery will count it (a take-over, a planned wait's end): else it
                # is claimed every run and never parks. The error named stays this one.
                with contextlib.suppress(Exception, StoreError):
                    executions.count_unopened_redrive(after)
            raise
        if record is not None:
            publish(runtime, report, record, previous_state=row.state)


def publish(
    runtime: Runtime,
    report: SweepReport,
    record: ExecutionRecord,
    *,
    previous_state: ExecutionState | None = None,
) -> None:
    message = record
    if record.started_at_ms is not None:
        # An execution that already started is continued whatever its ``expires``:
        # dropping the message now could strand a payment that was sent.
        message = replace(record, expires_ms=None)
    republish(runtime.app, message, not_before_ms=None)
    report.republished += 1
    report.republished_ids.append(record.id)
    log_event(
        SWEEP_REPUBLISHED,
        execution_id=record.id,
        task=record.task_name,
        state=(previous_state or record.state).value,
        recovery_count=record.recovery_count,
    )


__all__ = ["redrive_due", "redrive_one"]
