"""What a ``PaymentTask``'s delivery records about its links once Celery is done with
them (design: terminal replays): ``links_dispatched`` only when they really went out.

Celery sends the callbacks and the chain's next step, then stores the result and counts
the chord part (``mark_as_done``), then calls ``on_success``; after a failure it writes
FAILURE (and sends the errbacks) and calls ``on_failure``. ``links_dispatched`` tells a
later replay of the execution not to send them again, so it must never be set for links
that did not go out: a send that raised after the execution completed (the broker
refused the chain's next step) reaches ``on_failure`` with the failure held back
(``_FailureOnlyWhenFailed``), and nothing went out. That message is handed back to the
broker instead of acknowledged: its redelivery replays the execution and sends the
links, under the ids fixed at publish (``signals.link_ids``).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from amqp.exceptions import MessageNacked
from celery.exceptions import Reject, SoftTimeLimitExceeded
from kombu.exceptions import OperationalError

from celery_agboss.core import sabotage
from celery_agboss.core.executions import ExecutionRecord, ExecutionState
from celery_agboss.core.protections import (
    FAILED_LINK_SEND_ACKED,
    FAILED_LINK_SEND_RECORDED_SENT,
)
from celery_agboss.delivery.waits import REQUEUE_PAUSE_SECONDS
from celery_agboss.errors import ConfigurationError, StoreError
from celery_agboss.runtime.app_runtime import Runtime

logger = logging.getLogger("celery_agboss")

MARK_ATTEMPTS = 3
"""How often recording ``links_dispatched`` is tried before it is only logged: a replay
of an execution whose mark was lost sends its links again (the same executions, under
their fixed ids) and counts its chord part only if the result backend lacks its result."""
_MARK_BACKOFF_SECONDS = 0.1

HANDED_BACK: tuple[type[BaseException], ...] = (
    OperationalError,
    ConnectionError,
    TimeoutError,
    MessageNacked,
    SoftTimeLimitExceeded,
)
"""What a send of the links raises when the broker could not take it (refused it, with
publisher confirms: ``MessageNacked``): it may take it later; and a soft time limit that
landed after the verdict (a replay runs no body, so it sends them in time). Anything
else (a link that cannot be encoded) would fail the same way again."""
LINK_PARTS = ("callbacks", "chain", "errbacks", "chord")


def has_links(request: Any) -> bool:
    """Whether this delivery's end sent (or counted) anything a replay must not repeat:
    callbacks, a chain, errbacks, or a chord part."""
    return any(getattr(request, name, None) for name in LINK_PARTS)


def completed_with_links_unsent(task: Any, task_id: str) -> bool:
    """Whether the execution is ``COMPLETED`` with its links not recorded as sent (False
    when the store cannot tell: the message is then acknowledged, as Celery would)."""
    try:
        record = Runtime.of(task.app).executions.read_execution(task_id)
    except (Exception, StoreError):
        return False
    return (
        record is not None
        and record.state is ExecutionState.COMPLETED
        and not record.links_dispatched
    )


def links_sent(task: Any, task_id: str) -> None:
    """Record that the links of ``task_id`` went out, trying a few times: a mark lost
    makes a later replay send them again (and, without the result in the backend,
    count its chord part again)."""
    if not has_links(task.request):
        return  # nothing went out that a replay could send again: no transaction
    for attempt in range(1, MARK_ATTEMPTS + 1):
        try:
            Runtime.of(task.app).executions.mark_links_dispatched(task_id)
            return
        except (StoreError, ConfigurationError):
            if attempt == MARK_ATTEMPTS:
                logger.warning(
                    "could not record that %s sent its links (%d tries); a replay of it "
                    "sends them again under their fixed ids",
                    task_id,
                    attempt,
                    exc_info=True,
                )
                return
            time.sleep(_MARK_BACKOFF_SECONDS * attempt)


def after_a_failure(task: Any, exc: BaseException, task_id: str, einfo: Any) -> None:
    """``on_failure``: the links are recorded sent only when the failure was written (the
    execution is FAILED or unknown to the store: the errbacks went out). A failure held
    back for a COMPLETED execution whose links were not recorded is a send of the links
    that raised: the message goes back to the broker so that a replay sends them."""
    if not has_links(task.request):
        return
    if sabotage.active(FAILED_LINK_SEND_RECORDED_SENT):
        links_sent(task, task_id)
        return
    try:
        record = Runtime.of(task.app).executions.read_execution(task_id)
    except (Exception, StoreError):
        logger.warning(
            "%s failed after its body; its execution could not be read, so its links are "
            "not recorded as sent (a replay sends them under their fixed ids)",
            task_id,
            exc_info=True,
        )
        return
    if record is None or record.state is ExecutionState.FAILED:
        links_sent(task, task_id)
    elif record.state is ExecutionState.COMPLETED and not record.links_dispatched:
        _hand_back(task, record, exc, einfo)


def _hand_back(task: Any, record: ExecutionRecord, exc: BaseException, einfo: Any) -> None:
    """The message of a completed execution whose links did not go out is rejected with
    ``requeue=True`` instead of acknowledged: Celery's worker request reads the failure it
    reports, so a ``Reject`` put there hands the message back (a ``Reject`` raised here
    would escape Celery's trace). Paused first, as for a store outage: the broker hands
    it back at once."""
    request = task.request
    transient = isinstance(exc, HANDED_BACK)
    if (
        not transient
        or not task.acks_late
        or getattr(request, "is_eager", False)
        or einfo is None
        or sabotage.active(FAILED_LINK_SEND_ACKED)
    ):
        logger.error(
            "%s[%s] completed but its links (callbacks, the chain's next step) could not "
            "be sent (%s); they are not recorded as sent: a re-publish of its message "
            "(AGBoss.republish) replays it and sends them under their fixed ids",
            task.name,
            record.id,
            type(exc).__name__,
        )
        return
    logger.warning(
        "%s[%s] completed but its links could not be sent (%s): the message goes back to "
        "the broker, and its redelivery sends them under their fixed ids",
        task.name,
        record.id,
        type(exc).__name__,
    )
    delay = Runtime.of(task.app).settings.retry_delay_seconds
    time.sleep(min(delay, REQUEUE_PAUSE_SECONDS))
    einfo.exception = Reject(exc, requeue=True)


__all__ = [
    "HANDED_BACK",
    "LINK_PARTS",
    "after_a_failure",
    "completed_with_links_unsent",
    "links_sent",
]
