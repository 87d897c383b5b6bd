"""Checkout.com's Pending payments, for the fake's checkout dialect.

A payment that needs 3-D Secure (or an asynchronous method: a redirect, a transfer) is
answered HTTP 202 with Checkout.com's ``PaymentAcceptedResponse`` (its API reference):
``id``, ``status: "Pending"``, ``reference``, ``3ds`` and ``_links`` (``self``,
``redirect``); no ``amount``, ``currency`` or ``approved``. A 202 is a 2xx, so it is kept
under the ``Cko-Idempotency-Key`` and a repeat gets it replayed.

The fake makes the payment as any other (the gateway's ``charge``: counted in
``payments``) and keeps here which ones are still Pending: a test arms one
(``CheckoutDialect.pend_next``) and completes it (``CheckoutDialect.complete_pending``).
Until then the payment is read and listed ``Pending``, ``approved: false`` (the fake's
choice: not approved yet, the harder case for a client, which must not take it for a
decline) and nothing in its balances; after, as the gateway has it (``Captured``, or
``Authorized``).
"""

from __future__ import annotations

import threading
from typing import Any

PENDING = "Pending"


def accepted_body(payment_id: str, reference: Any, links: dict[str, Any]) -> dict[str, Any]:
    """The 202 of a Pending payment (the same body when the key replays it)."""
    redirect = {"href": f"{links['self']['href']}/3ds-redirect"}
    return {
        "id": payment_id,
        "status": PENDING,
        "reference": reference,
        "3ds": {"downgraded": False, "enrolled": "Y"},
        "_links": {**links, "redirect": redirect},
    }


class PendingPayments:
    """The Pending answers a test arms, and the payments still Pending (by Checkout id)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._armed = 0
        self._pending: set[str] = set()

    def arm(self, times: int) -> None:
        if times < 1:
            raise ValueError("times must be >= 1")
        with self._lock:
            self._armed += times

    def answers(self, payment_id: str, made_now: bool) -> bool:
        """Whether the payment is answered 202 Pending: it still is, or it was made now
        while an answer is armed (which it uses)."""
        with self._lock:
            if payment_id not in self._pending and made_now and self._armed:
                self._armed -= 1
                self._pending.add(payment_id)
            return payment_id in self._pending

    def complete(self, payment_id: str) -> None:
        """The customer finished 3-D Secure: the payment reads as the gateway has it."""
        with self._lock:
            if payment_id not in self._pending:
                raise ValueError(f"{payment_id} is not a Pending payment")
            self._pending.discard(payment_id)

    def overlay(self, details: dict[str, Any]) -> dict[str, Any]:
        """``details`` (of GET /payments/{id}, or listed) as Checkout.com shows a payment
        still Pending: nothing authorised, captured or refunded yet."""
        with self._lock:
            pending = details.get("id") in self._pending
        if not pending:
            return details
        balances = {name: 0 for name in details.get("balances") or {}}
        return {**details, "status": PENDING, "approved": False, "balances": balances}


__all__ = ["PENDING", "PendingPayments", "accepted_body"]
