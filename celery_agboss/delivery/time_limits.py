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
worker's revoked set and drop the execution's later messages. A message whose id (or
stamp) the worker holds revoked is dropped only when the store has its execution
cancelled, expired or unknown: any other follows its recorded cancel (its undos).
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any

from celery.exceptions import TimeLimitExceeded
from celery.worker.request import Request
from celery.worker.state import revoked as revoked_tasks
from celery.worker.state import revoked_stamps, task_ready

from celery_agboss.core import sabotage
from celery_agboss.core.log_events import EXECUTION_TIME_LIMIT, log_event
from celery_agboss.core.protections import (
    EXPIRY_REVOKES_THE_ID,
    FAILED_LINK_SEND_ACKED,
    TIME_LIMIT_FAILS_THE_TASK,
)
from celery_agboss.delivery.link_ends import HANDED_BACK, LINK_PARTS, completed_with_links_unsent
from celery_agboss.runtime.app_runtime import Runtime
from celery_agboss.runtime.expiry import drop_expired_message, drop_revoked_message

logger = logging.getLogger("celery_agboss")


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

    _agboss_revoked: bool | None = None  # the store's answer for a revoked id, asked once

    def revoked(self) -> bool:
        """A payment message the worker holds revoked (by id, or by a stamp) is dropped only
        when the store says its execution is cancelled, expired or unknown; any other is
        delivered, to follow its recorded cancel (``runtime.expiry``)."""
        if self._already_revoked:
            return super().revoked()  # type: ignore[no-any-return]
        if not (self.id in revoked_tasks or self._revoked_by_stamp()):
            return super().revoked()  # type: ignore[no-any-return]  # expiry: maybe_expire
        if self.expires and self.maybe_expire():
            return super().revoked()  # type: ignore[no-any-return]
        if self._agboss_revoked is None:
            self._agboss_revoked = drop_revoked_message(Runtime.of(self.task.app), self.id)
        return self._agboss_revoked and super().revoked()

    def _revoked_by_stamp(self) -> bool:
        """Whether a stamp of this message is among the worker's revoked stamps."""
        for stamp in self.stamped_headers or ():
            revoked_values = revoked_stamps.get(stamp)
            value = (self.stamps or {}).get(stamp)
            if revoked_values is None or value is None:
                continue
            wanted = (
                revoked_values
                if isinstance(revoked_values, (list, tuple, set))
                else [revoked_values]
            )
            values = value if isinstance(value, (list, tuple)) else [value]
            if any(one in wanted for one in values):
                return True
        return False

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
        if self._links_to_send_again(exc):
            logger.warning(
                "%s[%s] completed but its links could not be sent (%s, after Celery's own "
                "handling): the message goes back to the broker, and its redelivery sends "
                "them under their fixed ids",
                self.name,
                self.id,
                type(exc).__name__,
            )
            task_ready(self)
            if not self.acknowledged:
                self.reject(requeue=True)
            return
        super().on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)

    def _links_to_send_again(self, exc: Any) -> bool:
        """A failure raised while Celery sent a completed execution's links, where the
        delivery's own ``on_failure`` cannot hand it back (Celery had already let go of
        the task's request: a soft time limit, or a publish the broker refused, landing in
        its link send): the same rule (``link_ends``), decided here, where the message is."""
        if not isinstance(exc, HANDED_BACK) or not self.task.acks_late:
            return False
        if sabotage.active(FAILED_LINK_SEND_ACKED):
            return False
        embed = self._payload[2] or {}
        if not any(embed.get(part) for part in LINK_PARTS):
            return False
        return completed_with_links_unsent(self.task, self.id)


__all__ = ["PaymentRequest"]
