"""Checkout.com's declined payment actions, for the fake's checkout dialect.

Checkout.com accepts a capture, refund or void with a 202 and may then decline it (its
``payment_capture_declined``, ``payment_refund_declined`` and ``payment_void_declined``
events): ``GET /payments/{id}/actions`` lists the action with ``approved: false`` and a
decline ``response_code``, and the payment's balances do not move. The 202 was a 2xx,
so it is kept under the ``Cko-Idempotency-Key`` and a repeat gets it replayed.

``FakeGateway`` models that for charges only (``saves_declines``), and its module is
shared with other dialects, so the declined action is made here: through the gateway's
one request path, so the request is recorded (``DECLINED``), faults and holds apply
(a dropped answer, a held one) and the 202 is kept under the key like any answer. The
declined action moves no money: it is in no payment's ``amount_captured`` or
``amount_refunded`` and never in ``refunds`` (like a declined charge, the fake lists it
in ``declined_payments``).
"""

from __future__ import annotations

import threading
from typing import Any

from celery_agboss.testing.gateway import FakeGateway
from celery_agboss.testing.gateway_requests import DECLINED, Receipt, new_id
from celery_agboss.testing.gateway_types import (
    FakeGatewayError,
    FakeGatewayErrorKind,
    GatewayRequest,
)

OPERATIONS = ("capture", "refund", "void")


def _declinable(operation: str, payment: Receipt, amount: int | None) -> int:
    """The amount the action would take, or the refusal the gateway gives it: an action
    the payment does not allow is refused (422), not declined."""
    status = payment["status"]
    if operation == "refund":  # nothing captured, or all of it refunded: nothing left
        left = payment["amount_captured"] - payment["amount_refunded"]
        wanted = left if amount is None else amount
        allowed = 0 < wanted <= left
    else:
        left = payment["amount"] - payment["amount_captured"]
        wanted = left if amount is None or operation == "void" else amount
        allowed = status == "requires_capture" and 0 < wanted <= left
    if not allowed:
        raise FakeGatewayError(
            FakeGatewayErrorKind.INVALID_REQUEST,
            f"cannot {operation} {wanted} of {payment['id']} ({status})",
        )
    return int(wanted)


def captured_by(captures: list[Receipt], request: GatewayRequest) -> int | None:
    """What a processed capture request took: the amount it named, or, naming none
    ("all that is left"), the amount of the capture it made (its payment's, under its
    key, made from its arrival on); None when no such capture is kept."""
    if request.amount is not None:
        return request.amount
    made = [
        c
        for c in captures
        if c["payment"] == request.payment_id
        and c["idempotency_key"] == request.idempotency_key
        and c["created"] >= request.at
    ]
    return int(made[0]["amount"]) if made else None


class ActionDeclines:
    """The declines a test arms (``CheckoutDialect.decline_next``) and the declined
    actions made, by the id of their receipt (``GatewayRequest.object_id``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._armed: dict[str, int] = {}
        self._made: dict[str, Receipt] = {}

    def arm(self, operation: str, times: int) -> None:
        if operation not in OPERATIONS:
            raise ValueError(f"operation must be one of {OPERATIONS}, not {operation!r}")
        if times < 1:
            raise ValueError("times must be >= 1")
        with self._lock:
            self._armed[operation] = self._armed.get(operation, 0) + times

    def take(self, operation: str) -> bool:
        """Whether this request of ``operation`` is declined (an armed decline, used once)."""
        with self._lock:
            left = self._armed.get(operation, 0)
            if left:
                self._armed[operation] = left - 1
            return bool(left)

    def made(self, object_id: str | None) -> Receipt | None:
        """The declined action a request made, or None."""
        with self._lock:
            found = self._made.get(object_id or "")
            return dict(found) if found is not None else None

    def perform(
        self,
        gateway: FakeGateway,
        operation: str,
        payment_id: str,
        key: str | None,
        amount: int | None,
        reference: Any,
    ) -> Receipt:
        """The declined action, through the gateway's request path with the parameters
        the gateway's own ``capture``, ``refund`` or ``void`` gives it (so a repeat under
        the key replays it whichever path it takes)."""

        def declined(now: float) -> Receipt:
            payment = gateway.retrieve(payment_id)
            receipt: Receipt = {
                "id": new_id("act"),
                "object": operation,
                "payment": payment_id,
                "amount": _declinable(operation, payment, amount),
                "currency": payment["currency"],
                "status": DECLINED,
                "idempotency_key": key,
                "reference": reference,
                "created": now,
            }
            with self._lock:
                self._made[receipt["id"]] = dict(receipt)
            return receipt

        params = {"reference": reference} if operation == "refund" else {}
        asked = None if operation == "void" else amount
        # The gateway's one request path; FakeGateway has no declined capture, refund or void.
        return gateway._perform(operation, key, asked, payment_id, params, declined)


__all__ = ["OPERATIONS", "ActionDeclines", "captured_by"]
