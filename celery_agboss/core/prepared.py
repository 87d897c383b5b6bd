"""What one ``outbound()`` call is before the store is touched, and what the state
machine needs from the delivery running it.

Shared by the claim (``state_machine``), the send and settle (``settle``) and the holder's
reconcile (``reconcile``), which import it rather than each other.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from celery_agboss.core import sabotage
from celery_agboss.core.engine_settings import EngineSettings
from celery_agboss.core.inflight import BoundedRun
from celery_agboss.core.keys import (
    business_key,
    business_key_handle,
    fingerprint,
    fit_key,
    step_key,
    validate_business_key,
)
from celery_agboss.core.outbound import OutboundCall
from celery_agboss.core.protections import REQUEST_STORED_UNMASKED
from celery_agboss.core.store import JSON, FencedTransaction, LeaseRef
from celery_agboss.core.transitions import CallRef, policy_of


class Holder(Protocol):
    """What the state machine needs from the delivery that runs it (``ExecutionContext``)."""

    @property
    def settings(self) -> EngineSettings: ...

    @property
    def execution_id(self) -> str: ...

    @property
    def lease_ref(self) -> LeaseRef: ...

    def fenced(self) -> AbstractContextManager[FencedTransaction]:
        """A fenced transaction under this holder's lease (refused once the lease is lost)."""

    def assert_can_send(self) -> None:
        """Raise ``ExecutionFencedError`` unless the lease is held on the holder's clocks."""

    def failure_raised(self, idempotency_key: str, attempt: int) -> None:
        """A definite failure of this attempt is being raised to the body: a retry the
        body asks for before it goes on to another call authorises sending it again."""

    def check_cancel(self, tx: FencedTransaction) -> None:
        """Raise ``CancelRequestedError`` when a cancel of the execution was recorded, read
        in ``tx`` — the transaction that would authorise a send or a write — so a cancel
        recorded before it commits is never followed by that send (DESIGN §2.2)."""

    def send_started(self, run: BoundedRun) -> None:
        """Remember a running send: the lease is never released under it."""

    def send_overran(self, run: BoundedRun) -> None:
        """The send passed ``attempt_timeout``: stop trusting and renewing the lease."""

    def send_interrupted(self, run: BoundedRun) -> None:
        """The wait for a running send was interrupted (a signal, a soft time limit): write
        and send nothing more, keep the lease renewed until the send ends or passes its
        bound, then let it expire; never release it."""


@dataclass(frozen=True)
class PreparedCall:
    """Everything fixed for one ``outbound()`` before the store is touched."""

    call: OutboundCall
    idempotency_key: str
    request: Any  # as given: what send and the holder's reconcile get
    stored_request: JSON  # masked: what the store keeps and the sweep's reconcile gets
    fingerprint: str
    ref: CallRef


def prepare_call(
    settings: EngineSettings,
    execution_id: str,
    call: OutboundCall,
    request: Any,
    business_key_text: str | None,
    occurrence: int,
) -> PreparedCall:
    """Key, fingerprint and masked request; refuses bad input before anything is written.

    The masking policy fails closed here (``MaskingPolicyError``): nothing is claimed,
    nothing is sent.
    """
    handle: str | None = None
    if business_key_text is not None:
        validate_business_key(business_key_text)
        raw = business_key(settings.tenant, business_key_text, call.name)
        handle = business_key_handle(settings.pseudonym_key, business_key_text)
    else:
        raw = step_key(settings.tenant, execution_id, call.name, occurrence)
    key = fit_key(raw, call.max_key_length)
    stored = policy_of(call).mask_request(request)
    if sabotage.active(REQUEST_STORED_UNMASKED):
        stored = request
    return PreparedCall(
        call=call,
        idempotency_key=key,
        request=request,
        stored_request=stored,
        fingerprint=fingerprint(settings.pseudonym_key, request),
        ref=CallRef(call.name, execution_id, key, handle),
    )


@dataclass(frozen=True)
class Resend:
    """Reconcile proved the attempt absent and authorised ``attempt`` under the same key."""

    attempt: int


__all__ = ["Holder", "PreparedCall", "Resend", "prepare_call"]
