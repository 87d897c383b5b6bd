"""How the worker's main process handles a PaymentTask's hard time limit and a message
past its ``expires``.

Celery kills the pool child that overran ``time_limit`` and then, from the main
process, writes FAILURE to the result backend, calls ``on_failure``, fires the
``task_failure`` signal and sends ``task-failed`` — whatever the task's ack settings.
For a payment that is the wrong story: the child may have charged a moment before it
was killed, and nothing it recorded is lost, so the execution continues on the next
delivery (after its lease expires), replaying what was recorded. The message is given
back to the broker instead; every take-over counts toward the recovery cap, so a body
that always overruns its limit ends ``PARKED``, visibly, never ``FAILED`` on a guess.

A message past its ``expires`` is dropped only when the store says its execution never
started (``runtime.expiry``); Celery's check alone would also put the id in the
worker's revoked set and drop the execution's later messages.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any

from celery.exceptions import TimeLimitExceeded
from celery.worker.request import Request
from celery.worker.state import task_ready

from celery_agboss.core import sabotage
from celery_agboss.core.log_events import EXECUTION_TIME_LIMIT, log_event
from celery_agboss.core.protections import EXPIRY_REVOKES_THE_ID, TIME_LIMIT_FAILS_THE_TASK
from celery_agboss.runtime.app_runtime import Runtime
from celery_agboss.runtime.expiry import drop_expired_message


class PaymentRequest(Request):  # type: ignore[misc]  # celery has no type information
    """Celery's worker request, with a hard time limit handed back instead of failed, and
    an expired message judged by the store."""

    _agboss_expired: bool | None = None  # the store's answer, asked once per message

    def maybe_expire(self) -> bool | None:
        """Past ``expires``: dropped (True) only if the execution never started; the
        worker's revoked set is left alone (Celery's own check adds the id to it)."""
        if not self.expires or sabotage.active(EXPIRY_REVOKES_THE_ID):
            return super().maybe_expire()  # type: ignore[no-any-return]
        now = datetime.now(timezone.utc if self.expires.tzinfo else None)
        if now <= self.expires:
            return None
        if self._agboss_expired is None:
            self._agboss_expired = drop_expired_message(
                Runtime.of(self.task.app), self.id, self.name
            )
        return self._agboss_expired

    def on_timeout(self, soft: bool, timeout: float) -> None:
        if soft or not self.task.acks_late or sabotage.active(TIME_LIMIT_FAILS_THE_TASK):
            super().on_timeout(soft, timeout)
            return
        task_ready(self)
        log_event(
            EXECUTION_TIME_LIMIT,
            logging.ERROR,
            "the pool process was killed; the message is given back, and the next delivery "
            "continues the execution once its lease expires (nothing is marked FAILURE)",
            execution_id=self.id,
            task=self.name,
            limit=timeout,
        )
        self.reject(requeue=True)

    def on_failure(
        self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False
    ) -> None:
        """The pool then reports the killed job as failed with ``TimeLimitExceeded``: the
        message was already given back; nothing else is written."""
        exc = getattr(exc_info, "exception", None)
        exc = getattr(exc, "exc", exc)  # billiard's ExceptionWithTraceback
        if (
            isinstance(exc, TimeLimitExceeded)
            and self.task.acks_late
            and not sabotage.active(TIME_LIMIT_FAILS_THE_TASK)
        ):
            task_ready(self)
            if not self.acknowledged:
                self.reject(requeue=True)
            return
        super().on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)


__all__ = ["EXECUTION_TIME_LIMIT", "PaymentRequest"]
