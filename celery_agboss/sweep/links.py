"""The sweep's step for completed executions whose links never went out.
(design: unsent links, terminal replays)

A delivery that completed an execution but could not send its links (callbacks, the
chain's next step, errbacks, the chord part) hands its message back to the broker, and
the redelivery's replay sends them. When that message is lost too (a quorum queue's
``delivery-limit``, a Redis that restarts without persistence, a worker killed between
the verdict's COMMIT and the send), nothing else would: the order is paid and never
ships. Past ``agboss_requested_grace`` after the completion, this step re-publishes the
execution's message once per grace; its replay sends the links under the ids fixed at
publish and records them sent. As the re-drive does, it claims each row by a
compare-and-set committed before the publish, counts each re-publish as a recovery, and
stops at ``agboss_max_recovery_attempts`` (then an operator re-publishes it); one that
completed at the cap still gets one. Its last claim says so, also for a row no key
opens, which fails each claim by name.

Links that went out and only their record was lost (``delivery.link_ends`` gave up
writing it) are not sent again: Celery stores ``SUCCESS`` only after sending them, so a
result backend that holds it marks the row instead. A row retention deletes within two
graces is left alone: its replay would find no row and charge again.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

from celery_agboss.core import sabotage
from celery_agboss.core.execution_states import over_recovery_cap
from celery_agboss.core.executions import ExecutionState
from celery_agboss.core.log_events import SWEEP_ERROR, SWEEP_LINKS_REPUBLISHED, log_event
from celery_agboss.core.protections import (
    UNSENT_LINKS_BACKEND_NOT_READ,
    UNSENT_LINKS_WITHOUT_CLAIM,
)
from celery_agboss.errors import SealedValueUnopenableError, StoreError
from celery_agboss.runtime.app_runtime import Runtime
from celery_agboss.runtime.messages import loads, republish
from celery_agboss.runtime.result_backend import outcome_stored
from celery_agboss.store.schema_executions import LINK_OPTIONS
from celery_agboss.store.unsent_links import (
    UnsentLinksRow,
    claim_links_republish,
    find_unsent_links,
    mark_links_sent,
    release_links_claim,
)
from celery_agboss.sweep.report import SweepReport

_LAST_HINT = (
    "the sweep re-publishes it no more (agboss_max_recovery_attempts); if its links "
    "still do not go out, re-publish it with AGBoss.republish"
)

_UNOPENED_LAST_HINT = (
    "its message opens with no configured key (the sweep.error that follows); "
    + _LAST_HINT
    + " from a process holding that key"
)

STEP = "links"
"""The step's name in ``sweep.error``."""


def has_links(options: str) -> bool:
    """Whether the stored message has something its delivery's end sends or counts."""
    parsed = loads(options) or {}
    return any(parsed.get(name) for name in LINK_OPTIONS)


def links_went_out(runtime: Runtime, row: UnsentLinksRow) -> bool:
    """The result backend holds the execution's ``SUCCESS``, which Celery stores only
    after sending its links. A backend that cannot tell (none, ``ignore_result``, a
    result expired, an error reading it) says no: the row is re-published."""
    if sabotage.active(UNSENT_LINKS_BACKEND_NOT_READ):
        return False
    app = runtime.app
    task = app.tasks.get(row.task_name)
    backend = app.backend if task is None else task.backend
    try:
        return outcome_stored(backend, row.id, ExecutionState.COMPLETED)
    except Exception:  # the backend is Celery's: any failure to read it
        return False


def republish_unsent_links(
    runtime: Runtime,
    batch: int,
    report: SweepReport,
    *,
    as_of_ms: int,
    row_failed: Callable[[str, str], None],
) -> None:
    """One run of the step: at most ``batch`` rows, each claimed (or marked sent) before
    anything is published; a row that fails is ``row_failed``'s and the next run's."""
    settings = runtime.settings
    grace_ms = settings.requested_grace_ms
    cap = settings.max_recovery_attempts
    for row in find_unsent_links(
        runtime.store,
        batch,
        grace_ms,
        cap,
        retention_ms=settings.terminal_execution_retention_ms,
        as_of_ms=as_of_ms,
    ):
        try:
            _republish_one(runtime, report, row, grace_ms, cap)
        except (Exception, StoreError):
            row_failed(STEP, row.id)


def _republish_one(
    runtime: Runtime, report: SweepReport, row: UnsentLinksRow, grace_ms: int, cap: int
) -> None:
    store = runtime.store
    if not has_links(row.options) or links_went_out(runtime, row):
        mark_links_sent(store, row)  # read once, never again
        return
    # The REQUESTED re-drive's rule: no other copy while this one may sit in a queue.
    claim = None
    if not sabotage.active(UNSENT_LINKS_WITHOUT_CLAIM):
        claim = claim_links_republish(store, row, cap, next_delay_ms=grace_ms)
        if claim is None:
            return  # another sweeper claimed it, or its replay recorded the links sent
    # Read (and opened) after the claim committed: a row no key opens keeps its claim.
    try:
        claimed = runtime.executions.read_execution(row.id)
    except SealedValueUnopenableError:
        if claim is not None and over_recovery_cap(claim, cap):
            # Its last claim: said here, as no sweep.links-republished will say it.
            log_event(
                SWEEP_ERROR,
                logging.WARNING,
                step=STEP,
                execution_id=row.id,
                reason="unopened",
                last=True,
                hint=_UNOPENED_LAST_HINT,
            )
        raise
    if claimed is None:
        return
    try:
        republish(runtime.app, claimed, not_before_ms=None)
    except (Exception, StoreError):
        with contextlib.suppress(Exception, StoreError):  # else it waits one grace
            release_links_claim(store, claimed)
        raise
    report.links_republished += 1
    last = over_recovery_cap(claimed, cap)
    hint: dict[str, Any] = {"hint": _LAST_HINT} if last else {}
    log_event(
        SWEEP_LINKS_REPUBLISHED,
        logging.WARNING if last else logging.INFO,
        execution_id=claimed.id,
        task=claimed.task_name,
        recovery_count=claimed.recovery_count,
        last=last,
        **hint,
    )


__all__ = ["republish_unsent_links"]
