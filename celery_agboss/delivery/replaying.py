"""A delivery of a terminal execution: the stored outcome, never the body
(design: terminal replays).

A ``COMPLETED`` execution's duplicate returns the stored result and a ``FAILED`` one's
raises the stored failure, without running the body; ``CANCELLED`` and ``EXPIRED`` end
in ``Ignore``. The chain, callbacks, errbacks and chord part went out with the delivery
that completed it (``links_dispatched``), so a replay sends and counts none of them
again, and a result this store could not hand back never turns into a FAILURE written
over the completing delivery's SUCCESS.
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
    REPLAY_SENDS_LINKS,
    UNSTORED_RESULT_REPLAYED_AS_FAILURE,
)
from celery_agboss.delivery.delivery_like import DeliveryLike
from celery_agboss.delivery.outcomes import decode_error, decode_result
from celery_agboss.errors import StoredFailureError
from celery_agboss.runtime.task_events import TASK_REPLAYED


def replay_terminal(d: DeliveryLike, record: ExecutionRecord) -> Any:
    """A terminal execution: its stored outcome, without running the body."""
    d.log_decision(EXECUTION_REPLAYED, state=record.state.value)
    request = d.request
    resend = sabotage.active(REPLAY_SENDS_LINKS)
    if record.links_dispatched and not resend and not sabotage.active(REPLAY_COUNTS_CHORD):
        # The completing delivery counted its chord part: a replay must not count again.
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


__all__ = [
    "replay_terminal",
]
