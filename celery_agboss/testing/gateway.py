"""An in-memory payment gateway whose capabilities and failures a test chooses
(design: gateway requirements).

``FakeGateway`` moves no money, but it keeps the two records a payment test asserts
on: ``payments`` (every payment made: a double charge shows here) and ``requests``
(every request received, with its key and attempt number: a duplicate send shows
here even when the key deduplicated it). Worker threads call it, so every method
takes its lock; waits (holds, slow answers) happen outside it.

Rules a test can rely on (docs/testing.md repeats them):
- a repeat inside ``key_retention`` is answered from the key: the saved first
  response when ``first_response_on_repeat``, else the payment's current state
  with this request's own ``request_id`` (same payment ``id``, another body);
- a repeat with other parameters is refused with ``CONFLICT`` when
  ``conflict_on_mismatch``, else answered as a plain repeat (the change is ignored);
- failures (``NOT_PROCESSED``, ``DECLINED``, ``INVALID_REQUEST``) are not saved
  under the key: a retry under the same key is processed afresh; except that with
  ``replays_failures`` a ``NOT_PROCESSED`` is saved and raised again to every repeat
  inside retention (a gateway that replays its 5xx answers);
- a key that holds a saved answer keeps it: an injected ``FAIL_BEFORE_PROCESSING`` on
  a repeat fails that repeat without replacing the answer, and an injected ``DECLINE``
  on a repeat is answered from the key (a paid key never looks declined);
- a charge made with ``saves_declines=True`` (a dialect whose gateway keeps a decline
  under its key, as Stripe and Checkout.com do) is declined by being processed: the
  declined payment (``status: "declined"``, nothing captured) is made, saved under
  the key and answered to every repeat like any first response; it is listed in
  ``declined_payments``, never in ``payments`` (no money moved);
- a lookup finds what a key produced whatever the key's age (retention bounds
  replays, not lookups), and raises ``LOOKUP_UNSUPPORTED`` when lookup is off (design: G2);
- an authorisation is captured once by default (the capture closes it, as Stripe's);
  a capture with ``final=False`` (PayPal's ``final_capture: false``) leaves the rest
  capturable, so several captures add up to at most the authorised amount, and one past
  what is left is refused (``INVALID_REQUEST``); each capture is kept (``captures``);
- a void cancels an authorisation; ``cancels_declined=True`` (Stripe's rule) also cancels a
  declined payment, which stays out of ``payments`` (no money moved).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from typing import Any, NoReturn

from celery_agboss.testing.clock import VirtualClock
from celery_agboss.testing.gateway_requests import DECLINED, Receipt, RequestPath, new_id
from celery_agboss.testing.gateway_requests import Process as Process  # its old import path
from celery_agboss.testing.gateway_types import (
    FakeGatewayError,
    FakeGatewayErrorKind,
    FakeGatewayFault,
    FakeGatewayTimeout,
    GatewayCapabilities,
    GatewayHold,
    GatewayLookup,
    GatewayRequest,
    GatewayRequestOutcome,
    is_definite_failure,
)


def _invalid(message: str) -> FakeGatewayError:
    return FakeGatewayError(FakeGatewayErrorKind.INVALID_REQUEST, message)


def _declined(receipt: Receipt) -> bool:
    """A declined payment, cancelled or not: it moved no money."""
    return bool(receipt["status"] == DECLINED or receipt.get("declined"))


class FakeGateway(RequestPath):
    """A payment gateway in memory; see the module docstring for its rules."""

    def __init__(
        self,
        clock: VirtualClock | None = None,
        capabilities: GatewayCapabilities = GatewayCapabilities.FULL,
        *,
        hold_timeout: float = 30.0,
    ) -> None:
        super().__init__()
        self.clock = clock
        self.capabilities = capabilities
        self.hold_timeout = hold_timeout
        self._lookups: list[GatewayLookup] = []
        self._captures: list[Receipt] = []  # each capture of an authorisation, oldest first

    # --- capabilities: plain attributes, switchable mid-test ----------------------

    @property
    def capabilities(self) -> GatewayCapabilities:
        return GatewayCapabilities(
            idempotency_keys=self.idempotency_keys,
            lookup_by_key=self.lookup_by_key,
            key_retention=self.key_retention,
            first_response_on_repeat=self.first_response_on_repeat,
            conflict_on_mismatch=self.conflict_on_mismatch,
            reference_lookup=self.reference_lookup,
            replays_failures=self.replays_failures,
        )

    @capabilities.setter
    def capabilities(self, value: GatewayCapabilities) -> None:
        self.idempotency_keys = value.idempotency_keys
        self.lookup_by_key = value.lookup_by_key
        self.key_retention = float(value.key_retention)
        self.first_response_on_repeat = value.first_response_on_repeat
        self.conflict_on_mismatch = value.conflict_on_mismatch
        self.reference_lookup = value.reference_lookup
        self.replays_failures = value.replays_failures

    # --- money-moving operations: each keyed, each recorded in ``requests`` -------

    def charge(
        self,
        amount: int,
        idempotency_key: str | None,
        *,
        currency: str = "usd",
        reference: str | None = None,
        capture: bool = True,
        card_declines: bool = False,
        saves_declines: bool = False,
        refuse_new: FakeGatewayError | None = None,
        **extra: Any,
    ) -> Receipt:
        """Charge (or, with ``capture=False``, authorise) ``amount`` in minor units.

        ``card_declines``: the card declines this charge. ``saves_declines``: a decline
        (the card's, or an injected ``DECLINE``) is processed into a declined payment
        saved under the key (see the module docstring); without it, a decline raises
        ``DECLINED`` and nothing is saved. ``refuse_new``: a repeat that must move no
        money (a dialect's repeat of what its key already paid): answered from the key
        like any repeat, else refused with this error, nothing processed.
        """

        def make(now: float, declined: bool) -> Receipt:
            if isinstance(amount, bool) or not isinstance(amount, int) or amount <= 0:
                raise _invalid(f"invalid amount {amount!r}")
            status = "succeeded" if capture else "requires_capture"
            return {
                "id": new_id("ch"),
                "object": "charge",
                "amount": amount,
                "currency": currency,
                "status": DECLINED if declined else status,
                "amount_captured": amount if capture and not declined else 0,
                "amount_refunded": 0,
                "idempotency_key": idempotency_key,
                "reference": reference,
                "created": now,
                "metadata": copy.deepcopy(extra),
            }

        def process(now: float) -> Receipt:
            if refuse_new is not None:
                raise refuse_new
            if card_declines and not saves_declines:
                raise FakeGatewayError(FakeGatewayErrorKind.DECLINED, "the card was declined")
            return make(now, card_declines)

        params = {
            "amount": amount,
            "currency": currency,
            "reference": reference,
            "capture": capture,
        }
        declined = functools.partial(make, declined=True) if saves_declines else None
        return self._perform(
            "charge", idempotency_key, amount, None, {**params, **extra}, process, declined
        )

    def refuse(
        self,
        operation: str,
        idempotency_key: str | None,
        error: FakeGatewayError,
        *,
        amount: int | None = None,
        payment_id: str | None = None,
    ) -> NoReturn:
        """A request the gateway refuses on its own state, before its key is consulted
        (PayPal's capture of an order already paid, or being paid): recorded in
        ``requests`` (outcome from ``error.kind``: ``IN_PROGRESS``, ``CONFLICT``,
        ``DECLINED``, else ``INVALID``), nothing processed, no key saved; raises
        ``error`` (or the failure of a fault armed for the next request)."""

        def process(now: float) -> Receipt:
            raise error

        self._perform(operation, idempotency_key, amount, payment_id, {}, process, uses_key=False)
        raise error  # not reached: ``process`` raised

    def capture(
        self,
        payment_id: str,
        idempotency_key: str | None,
        *,
        amount: int | None = None,
        final: bool = True,
    ) -> Receipt:
        """Capture an authorised payment, whole or in part (design: PS18), never more than
        what is left of it (``amount`` None: all of that). ``final`` closes the
        authorisation (one capture, as Stripe's); ``final=False`` (PayPal's partial
        captures) leaves the rest capturable until nothing is left. Returns the payment;
        the capture itself is in ``captures``."""

        def process(now: float) -> Receipt:
            payment = self._authorised(payment_id)
            left = payment["amount"] - payment["amount_captured"]
            wanted = left if amount is None else amount
            if not 0 < wanted <= left:
                raise _invalid(f"cannot capture {wanted}: {left} of {payment['amount']} is left")
            payment["amount_captured"] += wanted
            if final or payment["amount_captured"] == payment["amount"]:
                payment["status"] = "succeeded"
            self._captures.append(
                {
                    "id": new_id("cap"),
                    "object": "capture",
                    "payment": payment_id,
                    "amount": wanted,
                    "currency": payment["currency"],
                    "final": final,
                    "amount_refunded": 0,
                    "idempotency_key": idempotency_key,
                    "created": now,
                }
            )
            return payment

        params: dict[str, Any] = {} if final else {"final": False}
        return self._perform("capture", idempotency_key, amount, payment_id, params, process)

    def void(
        self, payment_id: str, idempotency_key: str | None, *, cancels_declined: bool = False
    ) -> Receipt:
        """Cancel an authorisation; a captured payment cannot be voided (design: PS20).
        ``cancels_declined``: a declined payment is cancelled too (Stripe cancels a
        PaymentIntent left in ``requires_payment_method``); it stays a declined one."""

        def process(now: float) -> Receipt:
            payment = self._payment(payment_id)
            if cancels_declined and payment["status"] == DECLINED:
                payment.update(status="canceled", declined=True)
                return payment
            payment = self._authorised(payment_id)
            payment["status"] = "canceled"
            return payment

        return self._perform("void", idempotency_key, None, payment_id, {}, process)

    def refund(
        self,
        payment_id: str,
        idempotency_key: str | None,
        *,
        amount: int | None = None,
        reference: str | None = None,
        capture_id: str | None = None,
    ) -> Receipt:
        """Refund a captured payment (what is left of it by default), never more; with
        ``capture_id``, one of its captures (what is left of that capture by default)."""

        def process(now: float) -> Receipt:
            payment = self._payment(payment_id)
            part = None if capture_id is None else self._capture_of(payment_id, capture_id)
            if part is None:
                left = payment["amount_captured"] - payment["amount_refunded"]
            else:
                left = part["amount"] - part["amount_refunded"]
            wanted = left if amount is None else amount
            if not 0 < wanted <= left:
                raise _invalid(f"cannot refund {wanted} of {payment_id} ({payment['status']})")
            payment["amount_refunded"] += wanted
            if part is not None:
                part["amount_refunded"] += wanted
            closed = payment["status"] == "succeeded"  # an open authorisation stays open
            if closed and payment["amount_refunded"] == payment["amount_captured"]:
                payment["status"] = "refunded"
            refund = {
                "id": new_id("re"),
                "object": "refund",
                "payment": payment_id,
                "amount": wanted,
                "currency": payment["currency"],
                "status": "succeeded",
                "idempotency_key": idempotency_key,
                "reference": reference,
                "created": now,
                **({} if capture_id is None else {"capture": capture_id}),
            }
            self._objects[refund["id"]] = refund
            return refund

        params = {"reference": reference, **({} if capture_id is None else {"capture": capture_id})}
        return self._perform("refund", idempotency_key, amount, payment_id, params, process)

    # --- lookups (design: G2) ------------------------------------------------------------

    def lookup(self, idempotency_key: str) -> Receipt | None:
        """What the key produced (its first payment or refund, as it is now), or None."""
        with self._lock:
            if not self.lookup_by_key:
                raise FakeGatewayError(
                    FakeGatewayErrorKind.LOOKUP_UNSUPPORTED,
                    "this gateway cannot look a payment up by its idempotency key",
                )
            ids = self._by_key.get(idempotency_key, [])
            self._lookups.append(GatewayLookup("key", idempotency_key, self.now(), len(ids)))
            return copy.deepcopy(self._objects[ids[0]]) if ids else None

    def lookup_by_reference(self, reference: str) -> list[Receipt]:
        """Every payment and refund made with this reference, oldest first (not unique)."""
        with self._lock:
            if not self.reference_lookup:
                raise FakeGatewayError(
                    FakeGatewayErrorKind.LOOKUP_UNSUPPORTED,
                    "this gateway cannot look a payment up by reference",
                )
            found = [
                copy.deepcopy(o) for o in self._objects.values() if o["reference"] == reference
            ]
            self._lookups.append(GatewayLookup("reference", reference, self.now(), len(found)))
            return found

    def retrieve(self, payment_id: str) -> Receipt:
        """A payment by the id its answer carried: every gateway has this, unlike ``lookup``."""
        with self._lock:
            return copy.deepcopy(self._payment(payment_id))

    # --- what a test asserts on ------------------------------------------------------

    @property
    def payments(self) -> list[Receipt]:
        """Every payment made, oldest first: two here for one order is a double charge."""
        return self._listed("charge")

    @property
    def declined_payments(self) -> list[Receipt]:
        """Every declined payment a charge with ``saves_declines`` made, oldest first (a
        cancelled one too: ``status`` "canceled", ``declined`` True)."""
        with self._lock:
            return [copy.deepcopy(o) for o in self._objects.values() if _declined(o)]

    @property
    def refunds(self) -> list[Receipt]:
        return self._listed("refund")

    @property
    def captures(self) -> list[Receipt]:
        """Every capture of an authorisation, oldest first: ``payment`` names it, ``amount``
        is what this capture took, ``final`` whether it closed the authorisation."""
        with self._lock:
            return copy.deepcopy(self._captures)

    @property
    def requests(self) -> list[GatewayRequest]:
        """Every money-moving request received, in order (snapshots)."""
        with self._lock:
            return [dataclasses.replace(r) for r in self._requests]

    @property
    def lookups(self) -> list[GatewayLookup]:
        with self._lock:
            return list(self._lookups)

    def requests_for(self, idempotency_key: str) -> list[GatewayRequest]:
        return [r for r in self.requests if r.idempotency_key == idempotency_key]

    def made_now(
        self, idempotency_key: str | None, seen_before: int, outcome: GatewayRequestOutcome
    ) -> bool:
        """Whether the request a dialect answers got ``outcome`` now, not a key's replay of an
        earlier one: the first request after the ``seen_before`` already recorded under its
        key (exact unless two under one key arrive at the same instant)."""
        if idempotency_key is None:
            return True
        mine = self.requests_for(idempotency_key)[seen_before:]
        return bool(mine) and mine[0].outcome is outcome

    def payments_for(self, idempotency_key: str) -> list[Receipt]:
        """Payments made under this key: more than one only without keys (design: G1) or past
        retention."""
        return [p for p in self.payments if p["idempotency_key"] == idempotency_key]

    # --- housekeeping ----------------------------------------------------------------

    def forget_keys(self) -> None:
        """Drop every saved key, as a gateway does once its retention passed (design: PS17)."""
        with self._lock:
            self._keys.clear()

    def close(self) -> None:
        """Release holds and cut real sleeps short, so no thread stays blocked in here."""
        self._closing.set()
        self.release()

    def _payment(self, payment_id: str) -> Receipt:
        payment = self._objects.get(payment_id)
        if payment is None or payment["object"] != "charge":
            raise FakeGatewayError(FakeGatewayErrorKind.NOT_FOUND, f"no payment {payment_id!r}")
        return payment

    def _authorised(self, payment_id: str) -> Receipt:
        payment = self._payment(payment_id)
        if payment["status"] != "requires_capture":
            raise _invalid(f"payment {payment_id} is {payment['status']}, not authorised")
        return payment

    def _capture_of(self, payment_id: str, capture_id: str) -> Receipt:
        for capture in self._captures:
            if capture["id"] == capture_id and capture["payment"] == payment_id:
                return capture
        raise FakeGatewayError(FakeGatewayErrorKind.NOT_FOUND, f"no capture {capture_id!r}")

    def _listed(self, kind: str) -> list[Receipt]:
        with self._lock:
            return [
                copy.deepcopy(o)
                for o in self._objects.values()
                if o["object"] == kind and not _declined(o)
            ]


__all__ = [
    "FakeGateway",
    "FakeGatewayError",
    "FakeGatewayErrorKind",
    "FakeGatewayFault",
    "FakeGatewayTimeout",
    "GatewayCapabilities",
    "GatewayHold",
    "GatewayLookup",
    "GatewayRequest",
    "GatewayRequestOutcome",
    "Receipt",
    "is_definite_failure",
]
