"""How a delivery that must wait ends: a retry through the broker while the broker may
hold it, a long wait in the store otherwise (design: trap 1, trap 13).

A message that waits in Redis longer than the shortest visibility timeout is handed
out again while the first copy still waits; RabbitMQ closes a channel whose message
stays unacked past its consumer timeout. So a ``retry()`` whose countdown is longer
than half the visibility timeout publishes nothing: the execution waits ``WAITING``
with ``not_before`` in the store, and the sweep re-publishes it then. The package's
own retries (an unknown outcome, a store outage) never use the application's
``max_retries``; past their own budget, the stored ``WAITING`` and the sweep go on.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any, NoReturn

from celery.exceptions import (
    Ignore,
    MaxRetriesExceededError,
    Reject,
    Retry,
    SoftTimeLimitExceeded,
)

from celery_agboss.core import sabotage
from celery_agboss.core.durations import to_ms, to_seconds
from celery_agboss.core.executions import ExecutionMessage
from celery_agboss.core.log_events import EXECUTION_STORE_FAILED, EXECUTION_WAITING
from celery_agboss.core.protections import (
    HAND_BACK_PAUSE_IGNORES_TIME_LIMITS,
    NEWER_STATE_HANDED_BACK_AT_ONCE,
    REQUEUE_WITHOUT_PAUSE,
    WAKE_FOLDED_INTO_REFUSED_RETRY,
)
from celery_agboss.delivery.delivery_like import DeliveryLike
from celery_agboss.delivery.verdicts import Wait
from celery_agboss.errors import (
    LongWaitRequested,
    RetryNotPublished,
    StoreError,
    StoreNotMigratedError,
)
from celery_agboss.runtime import messages
from celery_agboss.runtime.messages import dumps, loads, message_from_request
from celery_agboss.runtime.settings import AGBossSettings
from celery_agboss.runtime.task_events import TASK_WAITING
from celery_agboss.store.unopened import list_executions_shown, state_known

# How many of a message's ``retries`` are celery_agboss's own (an unknown outcome's, a
# store outage's), not the application's: they never use the application's budget.
OWN_RETRIES_HEADER = messages.OWN_RETRIES_HEADER

PACKAGE_RETRY_BUDGET = 5
"""The package's own broker retries in a row; past them the stored ``WAITING`` and the
sweep (which spaces its re-drives, and starts the count again) continue the execution."""

REQUEUE_PAUSE_SECONDS = 1.0
"""How long a delivery that could not reach the store waits before it hands its message
back: one redelivery per second per process during an outage, not hundreds."""

NEWER_STATE_PAUSE_CAP_SECONDS = 30.0
"""The longest pause before a message of an execution a newer version wrote goes back
(``start_failed``): a pool slot waits that long, and a worker's warm shutdown with it."""

DELIVERY_COUNT_HEADER = "x-delivery-count"
"""How many times a RabbitMQ quorum queue handed the message back before this delivery
(absent on a first delivery, on a classic queue, on Redis): what ``delivery-limit``
counts, the queue dropping (or dead-lettering) the message past it."""

UNBOUNDED_RETRIES = 2**62
"""``max_retries`` given to Celery for a retry whose budget was already checked here."""


def own_retries(request: Any) -> int:
    """The package's own retries among this message's ``retries``, over its whole life
    (a re-publish keeps them: they are still in ``retries``)."""
    return messages.retries_header(getattr(request, "headers", None), OWN_RETRIES_HEADER)


def own_retries_since_redrive(request: Any) -> int:
    """The package's own retries since the message was last re-published: what its
    budget counts (the sweep's re-drive, spaced, starts it again)."""
    headers = getattr(request, "headers", None)
    before = messages.retries_header(headers, messages.OWN_RETRIES_REDRIVEN_HEADER)
    return max(0, own_retries(request) - before)


def application_retries(request: Any) -> int:
    """The retries of this execution the application asked for (``self.retry()``,
    ``autoretry_for``): Celery's count less the package's own."""
    return max(0, int(getattr(request, "retries", 0) or 0) - own_retries(request))


def seconds_until(when: Any) -> float:
    """A countdown in seconds, or an ETA (datetime or ISO text), as seconds from now."""
    if when is None:
        return 0.0
    if isinstance(when, str):
        try:
            when = datetime.fromisoformat(when)
        except ValueError:
            return 0.0
    if isinstance(when, datetime):
        eta: datetime = when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)
        left: float = (eta - datetime.now(timezone.utc)).total_seconds()
        return max(0.0, left)
    try:
        seconds = float(when)
    except (TypeError, ValueError):
        return 0.0
    return max(0.0, seconds)


MAX_RETRY_DELAY_SECONDS = 100 * 365 * 24 * 3600.0
"""The longest delay a body's ``self.retry()`` may ask for: ~100 years, far past any
payment and far inside the store's millisecond columns (a larger one could not be stored,
and the execution was left ``RUNNING``)."""


def retry_delay(task: str, countdown: Any, eta: Any, default: Any) -> float:
    """The seconds ``self.retry(countdown=..., eta=...)`` asked for (``default`` when it
    gave neither), checked where the body asked: a countdown that is not a finite number
    of seconds (or a ``timedelta``), or one the store cannot hold, raises there, naming
    the task, and fails the execution as any error of the body does."""
    if countdown is None and eta is not None:
        asked, delay = f"eta={eta!r}", seconds_until(eta)
    else:
        asked = f"countdown={countdown!r}" if countdown is not None else "default_retry_delay"
        value = (default or 0) if countdown is None else countdown
        try:
            delay = max(0.0, to_seconds(value, what="the retry's countdown"))
        except (TypeError, ValueError) as exc:
            raise type(exc)(
                f"{task}: self.retry({asked}): {exc}; give seconds as a number, e.g. "
                "countdown=60, or a timedelta"
            ) from None
    if delay > MAX_RETRY_DELAY_SECONDS:
        raise ValueError(
            f"{task}: self.retry({asked}) asks to wait {delay:.3g} s, more than the store "
            "holds (100 years at most): give a shorter countdown"
        )
    return delay


def message_after_wait(
    task_name: str, request: Any, wait: LongWaitRequested | RetryNotPublished
) -> ExecutionMessage:
    """The message the sweep publishes after the wait: what Celery's retry would have
    sent (new arguments if given, retries + 1), without an ETA (the store holds it)."""
    message = message_from_request(task_name, request)
    options = loads(message.options)
    options["retries"] = int(getattr(request, "retries", 0) or 0) + 1
    return replace(
        message,
        args=message.args if wait.args_after is None else dumps(list(wait.args_after)),
        kwargs=message.kwargs if wait.kwargs_after is None else dumps(dict(wait.kwargs_after)),
        options=dumps(options),
        eta_ms=None,
    )


def sweep_after_ms(settings: AGBossSettings, delay: float) -> int:
    """``not_before`` of a retry: its countdown, plus a lease's time for the message to
    start (until then the sweep leaves it alone; only a lost message is re-driven)."""
    return to_ms(delay + settings.lease_ttl_seconds, what="countdown")


# --- the body asked for a retry ---------------------------------------------------------


def retry_requested(d: DeliveryLike, exc: Retry) -> NoReturn:
    """``self.retry()``: its message (same id) is already out; WAITING until it runs.

    ``not_before`` leaves the retry message a lease's time to start before the sweep
    counts it lost; a wake re-publishes that message (it was consumed) at its ETA.
    """
    delay = seconds_until(exc.when)
    d.verdict(Wait(sweep_after_ms(d.settings, delay), "retry", retry_asked=True))
    d.log_decision(EXECUTION_WAITING, reason="retry", delay=delay)
    d.release()
    raise exc


def retry_not_published(d: DeliveryLike, exc: RetryNotPublished) -> NoReturn:
    """``self.retry()`` could not publish its message: the execution waits in the store
    with the message the retry meant to send, and the sweep publishes it when the
    countdown is over (no message is on its way); this one is acknowledged, nothing
    says FAILURE."""
    message = message_after_wait(d.task.name, d.request, exc)
    d.verdict(
        Wait(
            to_ms(exc.delay_seconds, what="countdown"),
            "retry not published",
            message,
            retry_asked=True,
        )
    )
    d.log_decision(
        EXECUTION_WAITING,
        logging.WARNING,
        reason="retry not published",
        error=type(exc.cause).__name__,
    )
    d.release()
    d.send_event(TASK_WAITING, reason="retry not published")
    raise Ignore() from None


def long_wait(d: DeliveryLike, wait: LongWaitRequested) -> NoReturn:
    """A ``retry()`` the broker must not hold: ``WAITING`` until ``not_before``, with
    the message the sweep publishes then; nothing waits in the broker."""
    message = message_after_wait(d.task.name, d.request, wait)
    delay_ms = to_ms(wait.delay_seconds, what="countdown")
    d.verdict(Wait(delay_ms, "retry", message, retry_asked=True))
    d.log_decision(EXECUTION_WAITING, reason="retry", delay=wait.delay_seconds)
    d.release()
    d.send_event(TASK_WAITING, reason="retry", delay=wait.delay_seconds)
    raise Ignore() from None


# --- the package's own retries ----------------------------------------------------------


def wait_then_retry(d: DeliveryLike, delay: float, *, release: bool, reason: str) -> NoReturn:
    """A retry message after ``delay`` when the broker may hold it and Celery will send
    it; otherwise the stored ``WAITING`` is the continuation (the sweep re-drives it).
    The wake of a deferred duplicate is folded into the retry only when that retry is
    really published: past ``max_retries`` the release re-publishes it instead."""
    if delay <= d.settings.max_broker_countdown_seconds and _retry_allowed(d):
        if release:
            d.release(will_republish=True)
        try:
            raise _retry(d, delay)
        except (MaxRetriesExceededError, RetryNotPublished):
            pass  # WAITING is stored: the sweep re-drives it
    elif release:
        d.release()
    d.send_event(TASK_WAITING, reason=reason, delay=delay)
    raise Ignore() from None


def store_error_fields(exc: BaseException) -> dict[str, Any]:
    """How a store failure is logged: its type, and the key id a sealed value named (an
    operator must give the workers that key)."""
    fields: dict[str, Any] = {"error": type(exc).__name__}
    key_id = getattr(exc, "key_id", None)
    if key_id is not None:
        fields["key_id"] = key_id
    return fields


def log_store_failure(d: DeliveryLike, step: str, exc: BaseException) -> None:
    d.log_decision(EXECUTION_STORE_FAILED, logging.ERROR, step=step, **store_error_fields(exc))


def retry_or_requeue(d: DeliveryLike, delay: float, cause: BaseException) -> NoReturn:
    """The store could not be reached: a retry after ``delay``, or the message handed back
    to the broker when even the retry cannot go out."""
    if delay <= d.settings.max_broker_countdown_seconds and _retry_allowed(d):
        try:
            raise _retry(d, delay)
        except (MaxRetriesExceededError, RetryNotPublished):
            pass
    # The retry could not go out (the store is down, so it cannot be recorded).
    _hand_back(delay, cause)


def _hand_back(delay: float, cause: BaseException) -> NoReturn:
    """The message back to the broker, unacknowledged. The broker hands it out again at
    once, so pause first, or an outage becomes a loop of deliveries (and error lines)
    as fast as the broker goes."""
    _pause_then_hand_back(min(delay, REQUEUE_PAUSE_SECONDS), cause)


def _pause_then_hand_back(pause: float, cause: BaseException) -> NoReturn:
    """Wait ``pause``, then the message back to the broker, unacknowledged. A soft time
    limit landing in the pause (a revoke's, or a limit shorter than ``_time_limit_cap``
    foresaw) still hands it back: escaping, it was the task's error, and Celery
    acknowledged the message."""
    try:
        if not sabotage.active(REQUEUE_WITHOUT_PAUSE):
            _sleep(pause)
    except SoftTimeLimitExceeded:
        if sabotage.active(HAND_BACK_PAUSE_IGNORES_TIME_LIMITS):
            raise
    raise Reject(cause, requeue=True)


def _sleep(seconds: float) -> None:
    """``time.sleep``; a test reads the pauses here instead of waiting them."""
    time.sleep(seconds)


def broker_handbacks(request: Any) -> int:
    """How many times the broker handed this message back before (``DELIVERY_COUNT_HEADER``),
    0 where it does not count them."""
    headers = getattr(request, "headers", None)
    found = headers.get(DELIVERY_COUNT_HEADER) if isinstance(headers, dict) else None
    if found is None:
        found = getattr(request, DELIVERY_COUNT_HEADER, None)
    return messages.retries_header({DELIVERY_COUNT_HEADER: found}, DELIVERY_COUNT_HEADER)


def newer_state_pause(request: Any, task: Any = None) -> float:
    """The pause before a message of an execution a newer version wrote goes back:
    ``REQUEUE_PAUSE_SECONDS``, doubled with each hand-back the broker counted, up to
    ``NEWER_STATE_PAUSE_CAP_SECONDS`` and ``_time_limit_cap``. A quorum queue drops a
    message past its ``delivery-limit`` (20 from RabbitMQ 4.0): at one a second, a
    rolling upgrade longer than 20 s reached it; so, about 8 minutes. One dropped all
    the same is a lost message the newer version's sweep re-publishes
    (design: re-driven when due)."""
    if sabotage.active(NEWER_STATE_HANDED_BACK_AT_ONCE):
        return REQUEUE_PAUSE_SECONDS
    doublings = min(broker_handbacks(request), 16)
    pause = min(REQUEUE_PAUSE_SECONDS * 2.0**doublings, NEWER_STATE_PAUSE_CAP_SECONDS)
    cap = _time_limit_cap(request, task)
    return pause if cap is None else min(pause, cap)


def _time_limit_cap(request: Any, task: Any = None) -> float | None:
    """Half the shortest time limit the delivery runs under (Celery's rule: the message's,
    else the task's), None without one: a pause never runs into the soft limit (the
    hand-back would be the task's error) nor the hard one (its pool child killed), and
    leaves the delivery time for what ran before it."""
    if sabotage.active(HAND_BACK_PAUSE_IGNORES_TIME_LIMITS):
        return None
    hard, soft = messages.time_limits(getattr(request, "timelimit", None))
    hard = hard or getattr(task, "time_limit", None)
    soft = soft or getattr(task, "soft_time_limit", None)
    limits = [float(limit) for limit in (hard, soft) if limit]
    return min(limits) / 2 if limits else None


def start_failed(d: DeliveryLike, exc: BaseException) -> NoReturn:
    """The start's store call failed. A store that cannot be used (down, not migrated
    yet): a retry, or the message handed back. A row whose state a newer version of the
    package wrote (a rolling upgrade; reading it raised ``ValueError``): this version
    decides nothing about it, so the message goes back to the broker as it came, for a
    worker on that version, after ``newer_state_pause``: no body, no write, no retry
    published (a publish records its message on the row). Any other ``ValueError`` is
    raised as it was."""
    try:
        if not isinstance(exc, ValueError):
            raise exc  # the store's own failure, handled below
        found = list_executions_shown(d.runtime.store, limit=1, execution_id=d.execution_id)
    except (StoreError, StoreNotMigratedError) as failed:
        log_store_failure(d, "start", failed)
        retry_or_requeue(d, d.settings.retry_delay_seconds, failed)
    if not found or state_known(found[0].state):
        raise exc
    pause = newer_state_pause(d.request, d.task)
    d.log_decision(
        EXECUTION_STORE_FAILED,
        logging.ERROR,
        step="start",
        error="StateOfANewerVersion",
        state=found[0].state.value,
        pause=pause,
        hint="a newer version of celery_agboss wrote this state, which this worker does "
        "not know: the message goes back to the broker untouched, for a worker on that "
        "version; upgrade this worker",
    )
    _pause_then_hand_back(pause, exc)


def _retry_allowed(d: DeliveryLike) -> bool:
    """Whether the package's own retries may still go through the broker; past their
    budget the stored ``WAITING`` and the sweep continue the execution."""
    if sabotage.active(WAKE_FOLDED_INTO_REFUSED_RETRY):
        return True
    return own_retries_since_redrive(d.request) < PACKAGE_RETRY_BUDGET


def _retry(d: DeliveryLike, delay: float) -> Any:
    """The package's own retry of this delivery: outside the application's
    ``max_retries``, without the message's ``expires`` (design: expires bounds the start)."""
    if sabotage.active(WAKE_FOLDED_INTO_REFUSED_RETRY):
        return d.task.retry(countdown=delay, expires=None, max_retries=0)
    return d.task.package_retry(delay)
