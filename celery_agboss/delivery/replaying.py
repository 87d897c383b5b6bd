"""A delivery of a terminal execution: the stored outcome, never the body
(design: terminal replays).

A ``COMPLETED`` execution's duplicate returns the stored result and a ``FAILED`` one's
raises the stored failure, without running the body; ``CANCELLED`` and ``EXPIRED`` end
in ``Ignore``. The chain, callbacks, errbacks and chord part went out with the delivery
that completed it (``links_dispatched``), so a replay sends and counts none of them
again, and a result this store could not hand back never turns into a FAILURE written
over the completing delivery's SUCCESS. When that delivery's ``links_dispatched`` was
not recorded, a replay sends the links again (under the ids fixed at publish) but counts
the chord part only if the result backend does not hold its outcome yet.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.exceptions import Ignore

from celery_agboss.core import sabotage
from celery_agboss.core.executions import ExecutionRecord, ExecutionState
from celery_agboss.core.log_events import EXECUTION_REPLAYED
from celery_agboss.core.protections import (
    REPLAY_COUNTS_CHORD,
    REPLAY_RECOUNTS_STORED_CHORD_PART,
    REPLAY_SENDS_LINKS,
    UNSTORED_RESULT_REPLAYED_AS_FAILURE,
)
from celery_agboss.delivery.delivery_like import DeliveryLike
from celery_agboss.delivery.outcomes import decode_error, decode_result
from celery_agboss.errors import StoredFailureError
from celery_agboss.runtime.result_backend import outcome_stored
from celery_agboss.runtime.task_events import TASK_REPLAYED


def replay_terminal(d: DeliveryLike, record: ExecutionRecord) -> Any:
    """A terminal execution: its stored outcome, without running the body."""
    d.log_decision(EXECUTION_REPLAYED, state=record.state.value)
    request = d.request
    resend = sabotage.active(REPLAY_SENDS_LINKS)
    if record.links_dispatched and not resend and not sabotage.active(REPLAY_COUNTS_CHORD):
        # The completing delivery counted its chord part: a replay must not count again.
        request.chord = None
    elif not record.links_dispatched and request.chord and _part_counted(d, record):
        request.chord = None
    if record.state is ExecutionState.COMPLETED:
        if record.links_dispatched and not resend:
            request.callbacks = None
            request.chain = None
        # Flower shows one row per execution, its last event's outcome: a duplicate that
        # replays a recovered execution must not turn its RECONCILED into REPLAYED.
        recovered = record.recovery_count > 0
        d.send_event(TASK_REPLAYED, outcome="RECONCILED" if recovered else "REPLAYED")
        try:
            return decode_result(record.result, allow_pickle=d.uses_pickle())
        except StoredFailureError:
            if sabotage.active(UNSTORED_RESULT_REPLAYED_AS_FAILURE):
                raise
            # What the completing delivery gave the result backend stands: a duplicate
            # never writes FAILURE over SUCCESS, nor fires link_error.
            d.log_decision(
                EXECUTION_REPLAYED,
                logging.WARNING,
                state=record.state.value,
                reason="result not stored: the result backend keeps what it has",
            )
            raise Ignore() from None
    if record.state is ExecutionState.FAILED:
        if record.links_dispatched and not resend:
            request.errbacks = None
        raise decode_error(record.error)
    raise Ignore()  # CANCELLED, EXPIRED or UNMANAGED: never runs


def _part_counted(d: DeliveryLike, record: ExecutionRecord) -> bool:
    """Whether the chord part of a terminal execution whose links were not recorded as
    sent was counted already: the result backend holds its outcome. Celery stores it
    just before it counts the part (``mark_as_done``, ``mark_as_failure``), so a lost
    ``links_dispatched`` (a store error, a kill after the count) must not make a replay
    count it again: a key-value backend's counter would reach the header's size early
    and fail the chord, and its body would never run. Unreadable, or without a stored
    result (``ignore_result``), it counts as Celery would."""
    if sabotage.active(REPLAY_RECOUNTS_STORED_CHORD_PART) or sabotage.active(REPLAY_COUNTS_CHORD):
        return False
    try:
        return outcome_stored(d.task.backend, d.execution_id, record.state)
    except Exception:  # the backend is Celery's: any failure to read it
        d.log_decision(
            EXECUTION_REPLAYED,
            logging.WARNING,
            state=record.state.value,
            reason="result backend unreadable: the chord part is counted again",
        )
        return False


__all__ = [
    "replay_terminal",
]
