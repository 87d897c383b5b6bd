"""Applying a verified webhook event once, however often and wherever it is delivered
(design: PS15).

Gateways deliver at least once: the same event comes again after a timeout, and two
copies can reach two workers at the same moment. Each delivery is its own execution
(its own task id), so the execution's own record does not join them; the event's id
does. ``record_event`` runs the application's write as a fenced effect under the
business key ``event:<gateway>:<event id>``: the first copy to commit applies it, every
other copy (later, or racing on another worker) gets the stored result back.

``answer_pause_with_event`` answers a pause (a 3-D Secure step, an approval) with an
event; the second answer, from a duplicate webhook or the customer's return page, is
not an error: it is told it came second.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from celery_agboss.core import sabotage
from celery_agboss.core.protections import EVENT_NOT_KEYED
from celery_agboss.errors import NotPausedError
from celery_agboss.webhooks.events import CHECKOUT, STRIPE, WebhookEvent

if TYPE_CHECKING:
    from celery_agboss.task import PaymentTask

T = TypeVar("T")

_NOT_AN_OUTCOME = frozenset(
    {
        (STRIPE, "payment_intent.created"),
        (STRIPE, "payment_intent.requires_action"),
        (STRIPE, "payment_intent.processing"),
        (CHECKOUT, "payment_pending"),
    }
)
"""Events that say a payment has not been decided yet. Sent within milliseconds of the
authorisation, one kept as a pause's early answer would be the only answer the pause
takes, and the outcome that follows would be refused."""

EVENT_EFFECT_NAME = "webhook-event"
"""The fenced effect's name when ``record_event`` is given none. The key is made of the
name and the business key, so two different effects of one event need two names."""


@dataclass(frozen=True)
class RecordedEvent(Generic[T]):
    """What ``record_event`` returns: the effect's result, and who applied it.

    ``duplicate`` is True when another execution (an earlier or a concurrent delivery
    of the same event) applied it and this one got its stored result back.
    """

    result: T
    applied_by: str
    duplicate: bool


def record_event(
    task: PaymentTask,
    event: WebhookEvent,
    apply: Callable[[Any], T],
    *,
    name: str = EVENT_EFFECT_NAME,
) -> RecordedEvent[T]:
    """Run ``apply(conn)`` once for ``event``, from inside a ``PaymentTask`` body.

    ``apply`` gets the fenced transaction's connection: its writes commit with the
    event's record or not at all, and a delivery whose lease was taken over writes
    nothing. Its result must be JSON (it is stored and returned to every later copy).
    The event's identity is the effect's request, so a different event under the same
    id is refused (``IdempotencyKeyConflictError``) instead of being read as a copy.
    """
    execution_id = str(task.request.id)

    def effect(conn: Any) -> dict[str, Any]:
        return {"applied_by": execution_id, "result": apply(conn)}

    if sabotage.active(EVENT_NOT_KEYED):
        stored = task.fenced_effect(name, effect)
    else:
        stored = task.fenced_effect(
            name, effect, business_key=event.business_key, request=event.identity()
        )
    applied_by = str(stored["applied_by"])
    return RecordedEvent(
        result=stored["result"], applied_by=applied_by, duplicate=applied_by != execution_id
    )


def event_answer(event: WebhookEvent) -> dict[str, Any]:
    """The answer a pause gets from an event by default: which event, about what; a hint
    the body checks with the gateway, never the payment's state itself (design: PS16)."""
    return {"source": "webhook", **event.identity()}


def answer_pause_with_event(
    app: Any, pause_id: str, event: WebhookEvent, answer: Any = None
) -> bool:
    """Answer the pause ``pause_id`` (``"<execution id>:<name>"``) with ``event``; True
    when this call answered it, False when it was not waiting.

    ``answer_pause`` answers a pause once; a second answer raises ``NotPausedError``
    and moves nothing. For a webhook that is the normal case, not a failure: the same
    event delivered again, or the customer's return page that answered first (design: PS21).
    An event that comes before the body reached its pause is kept for it (True) while
    the execution is not over; a pause declared ``accept_early=True`` takes it
    (design: early answers). An event that says the payment is not decided yet
    (Stripe's ``payment_intent.created``, ``.requires_action``, ``.processing``,
    Checkout.com's ``payment_pending``) answers nothing (False): the outcome's event,
    coming after it, must be the one the pause gets.
    """
    from celery_agboss.operator import answer_pause

    if (event.gateway, event.type) in _NOT_AN_OUTCOME:
        return False
    try:
        answer_pause(app, pause_id, event_answer(event) if answer is None else answer)
    except NotPausedError:
        return False
    return True


__all__ = [
    "EVENT_EFFECT_NAME",
    "RecordedEvent",
    "answer_pause_with_event",
    "event_answer",
    "record_event",
]
