"""What a resend's refusal proves when reconcile's ``NotSent`` proved nothing.

A gateway with no read of the first attempt (Adyen), or one whose read may lag (Stripe's
search), or none for an action (PayPal's capture and refund), is reconciled by replaying
the key: reconcile answers ``NotSent`` and the same key goes out again. If that resend is
refused before the gateway reads the key (a bad or rotated API key, an IP not allowed, a
wrong endpoint or live URL prefix, a validation), the refusal says nothing of the first
attempt, whose answer was lost and which may have moved money. Recorded as a definite
failure ("nothing was processed"), it lets the app pay again under a new key. So on a
resend only what the gateway answered under the key stays definite (design: settle).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery_agboss.adapters.common import AnotherRequestsAnswerError
from celery_agboss.core.outbound import CallContext

SendFn = Callable[[CallContext], Any]


class ResendRefusedError(Exception):
    """A resend after an unproven ``NotSent`` was refused with an answer the gateway can
    give before it reads the idempotency key: the outcome of the first attempt stays
    unknown (never definite), and the intent stays pending."""


@dataclass(frozen=True)
class UnprovenResends:
    """Wraps the send of a call whose reconcile answers ``NotSent`` without proof.

    ``is_definite_failure`` is the adapter's one verdict; ``answered_under_key`` are its
    definite errors that only an answer under the key can raise (a decline: the key's
    first answer replayed, or a fresh decision that shows no other payment under it).
    :class:`AnotherRequestsAnswerError` is always one. On a send after one that may have
    been processed (``CallContext.after_possible_send``) any other definite error is
    raised again as :class:`ResendRefusedError`, from it. A first attempt, and one after
    a definite failure (nothing was processed), are left alone.
    """

    gateway: str
    is_definite_failure: Callable[[BaseException], bool]
    answered_under_key: tuple[type[BaseException], ...] = ()

    def __call__(self, send: SendFn) -> SendFn:
        kept: tuple[type[BaseException], ...] = (
            AnotherRequestsAnswerError,
            *self.answered_under_key,
        )

        def send_again(call: CallContext) -> Any:
            try:
                return send(call)
            except Exception as exc:
                if not call.after_possible_send or isinstance(exc, kept):
                    raise
                if not self.is_definite_failure(exc):
                    raise
                raise self.refused(call, exc) from exc

        return send_again

    def refused(self, call: CallContext, exc: BaseException) -> ResendRefusedError:
        """The error an operator reads: what was refused, why it is not final, what to do."""
        said = str(exc)[:300]
        if not said.startswith(type(exc).__name__):
            said = f"{type(exc).__name__}: {said}"
        return ResendRefusedError(
            f"{self.gateway} refused attempt {call.attempt} of {call.name} ({said}) with an "
            "answer it can give before reading the idempotency key. The first attempt's "
            "answer was lost and it may have been processed, so the outcome stays unknown, "
            "not 'nothing processed'. Fix the cause (API key, allowed IPs, endpoint or live "
            "URL prefix, the request) and the next delivery resends under the same key; or "
            f"find the payment under this key in {self.gateway}'s dashboard and settle the "
            "intent (celery -A proj agboss resolve KEY)"
        )


__all__ = ["ResendRefusedError", "UnprovenResends"]
