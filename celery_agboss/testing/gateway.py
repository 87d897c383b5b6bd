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
- a charge made with ``saves_declines=True`` (a dialect whose gateway keeps a decline
  under its key, as Stripe and Checkout.com do) is declined by being processed: the
  declined payment (``status: "declined"``, nothing captured) is made, saved under
  the key and answered to every repeat like any first response; it is listed in
  ``declined_payments``, never in ``payments`` (no money moved);
- a lookup finds what a key produced whatever the key's age (retention bounds
  replays, not lookups), and raises ``LOOKUP_UNSUPPORTED`` when lookup is off (design: G2).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery_agboss.testing.clock import VirtualClock
from celery_agboss.testing.gateway_faults import ArmedFault, FaultsAndHolds
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

Receipt = dict[str, Any]
_DECLINED = "declined"  # a declined payment's status (``saves_declines``): nothing moved


@dataclass(frozen=True)
class _KeyEntry:
    fingerprint: str
    response: Receipt
    created: float
    object_id: str
    error: FakeGatewayErrorKind | None = None  # a saved failure (replays_failures)


@dataclass
class _Arrival:
    """A request as it arrived: the fault and hold it took, and whether it waits."""

    request: GatewayRequest
    armed: ArmedFault | None
    hold: GatewayHold | None
    dropped: bool
    pre_delay: float
    waits: bool


def _invalid(message: str) -> FakeGatewayError:
    return FakeGatewayError(FakeGatewayErrorKind.INVALID_REQUEST, message)


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


Process = Callable[[float], Receipt]


class FakeGateway(FaultsAndHolds):
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
        self._objects: dict[str, Receipt] = {}  # payments ("charge") and refunds, by id
        self._keys: dict[str, _KeyEntry] = {}
        self._by_key: dict[str, list[str]] = {}
        self._attempts: dict[str, int] = {}
        self._in_flight: set[str] = set()
        self._requests: list[GatewayRequest] = []
        self._lookups: list[GatewayLookup] = []

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

    def now(self) -> float:
        """The gateway's time: the virtual clock's when it has one."""
        return self.clock.now() if self.clock is not None else time.time()

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
        **extra: Any,
    ) -> Receipt:
        """Charge (or, with ``capture=False``, authorise) ``amount`` in minor units.

        ``card_declines``: the card declines this charge. ``saves_declines``: a decline
        (the card's, or an injected ``DECLINE``) is processed into a declined payment
        saved under the key (see the module docstring); without it, a decline raises
        ``DECLINED`` and nothing is saved.
        """

        def make(now: float, declined: bool) -> Receipt:
            if isinstance(amount, bool) or not isinstance(amount, int) or amount <= 0:
                raise _invalid(f"invalid amount {amount!r}")
            status = "succeeded" if capture else "requires_capture"
            return {
                "id": _new_id("ch"),
                "object": "charge",
                "amount": amount,
                "currency": currency,
                "status": _DECLINED if declined else status,
                "amount_captured": amount if capture and not declined else 0,
                "amount_refunded": 0,
                "idempotency_key": idempotency_key,
                "reference": reference,
                "created": now,
                "metadata": copy.deepcopy(extra),
            }

        def process(now: float) -> Receipt:
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

    def capture(
        self, payment_id: str, idempotency_key: str | None, *, amount: int | None = None
    ) -> Receipt:
        """Capture an authorised payment, whole or in part; over-capture is refused
        (design: PS18)."""

        def process(now: float) -> Receipt:
            payment = self._authorised(payment_id)
            wanted = payment["amount"] if amount is None else amount
            if not 0 < wanted <= payment["amount"]:
                raise _invalid(f"cannot capture {wanted} of {payment['amount']}")
            payment.update(amount_captured=wanted, status="succeeded")
            return payment

        return self._perform("capture", idempotency_key, amount, payment_id, {}, process)

    def void(self, payment_id: str, idempotency_key: str | None) -> Receipt:
        """Cancel an authorisation; a captured payment cannot be voided (design: PS20)."""

        def process(now: float) -> Receipt:
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
    ) -> Receipt:
        """Refund a captured payment (what is left of it by default), never more."""

        def process(now: float) -> Receipt:
            payment = self._payment(payment_id)
            left = payment["amount_captured"] - payment["amount_refunded"]
            wanted = left if amount is None else amount
            if payment["status"] != "succeeded" or not 0 < wanted <= left:
                raise _invalid(f"cannot refund {wanted} of {payment_id} ({payment['status']})")
            payment["amount_refunded"] += wanted
            if payment["amount_refunded"] == payment["amount_captured"]:
                payment["status"] = "refunded"
            refund = {
                "id": _new_id("re"),
                "object": "refund",
                "payment": payment_id,
                "amount": wanted,
                "currency": payment["currency"],
                "status": "succeeded",
                "idempotency_key": idempotency_key,
                "reference": reference,
                "created": now,
            }
            self._objects[refund["id"]] = refund
            return refund

        params = {"reference": reference}
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
        """Every declined payment a charge with ``saves_declines`` made, oldest first."""
        with self._lock:
            return [copy.deepcopy(o) for o in self._objects.values() if o["status"] == _DECLINED]

    @property
    def refunds(self) -> list[Receipt]:
        return self._listed("refund")

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

    # --- the one request path ---------------------------------------------------------

    def _perform(
        self,
        operation: str,
        key: str | None,
        amount: int | None,
        payment_id: str | None,
        params: dict[str, Any],
        process: Process,
        declined: Process | None = None,
    ) -> Receipt:
        fingerprint = json.dumps(
            [operation, amount, payment_id, params], sort_keys=True, default=repr
        )
        keyed = key if self.idempotency_keys and key is not None else None
        with self._lock:
            arrival = self._arrive(operation, key, amount, payment_id, keyed)
        self._wait_to_process(arrival, keyed)
        with self._lock:
            response = self._process(arrival, keyed, fingerprint, process, declined)
        hold, armed = arrival.hold, arrival.armed
        if hold is not None and not hold.before_processing and not hold._block():
            raise FakeGatewayTimeout(
                FakeGatewayErrorKind.ANSWER_DROPPED, "processed; the held answer never left"
            )
        if armed is not None and arrival.dropped:
            self._delay(armed.delay)
            raise FakeGatewayTimeout(
                FakeGatewayErrorKind.ANSWER_DROPPED, "processed, but the answer was lost"
            )
        with self._lock:
            arrival.request.answered = True
        return response

    def _arrive(
        self,
        operation: str,
        key: str | None,
        amount: int | None,
        payment_id: str | None,
        keyed: str | None,
    ) -> _Arrival:
        """Under the lock: record the request, refuse a key in flight, take its fault and
        hold; a request that waits before processing marks its key in flight."""
        attempt = 1
        if key is not None:
            attempt = self._attempts[key] = self._attempts.get(key, 0) + 1
        request = GatewayRequest(
            _new_id("req"), operation, key, amount, payment_id, self.now(), attempt
        )
        self._requests.append(request)
        if keyed is not None and keyed in self._in_flight:
            request.outcome = GatewayRequestOutcome.IN_PROGRESS
            raise FakeGatewayError(
                FakeGatewayErrorKind.IN_PROGRESS, f"key {key!r} is still being processed"
            )
        armed = self._take_fault(operation)
        hold = self._take_hold(operation)
        request.fault = armed.fault if armed else None
        dropped = armed is not None and armed.fault is FakeGatewayFault.ANSWER_THEN_DROP
        pre_delay = armed.delay if armed is not None and not dropped else 0.0
        waits = pre_delay > 0 or (hold is not None and hold.before_processing)
        if keyed is not None and waits:
            self._in_flight.add(keyed)
        return _Arrival(request, armed, hold, dropped, pre_delay, waits)

    def _wait_to_process(self, arrival: _Arrival, keyed: str | None) -> None:
        """Outside the lock: a hold before processing, then the fault's delay."""
        hold = arrival.hold
        try:
            if hold is not None and hold.before_processing and not hold._block():
                self._finish(arrival.request, GatewayRequestOutcome.TIMED_OUT)
                raise FakeGatewayTimeout(
                    FakeGatewayErrorKind.TIMED_OUT, "the request was held and never processed"
                )
            self._delay(arrival.pre_delay)
        finally:
            if keyed is not None and arrival.waits:
                with self._lock:
                    self._in_flight.discard(keyed)

    def _process(
        self,
        arrival: _Arrival,
        keyed: str | None,
        fingerprint: str,
        process: Process,
        declined: Process | None,
    ) -> Receipt:
        """Under the lock: a saved failure replayed, the armed failure, or the answer
        (a decline, when ``declined`` makes the declined payment, is an answer too)."""
        request, armed = arrival.request, arrival.armed
        saved = self._saved_failure(request, keyed, fingerprint)
        if saved is not None:
            raise saved
        if armed is not None and armed.fault is FakeGatewayFault.FAIL_BEFORE_PROCESSING:
            self._finish(request, GatewayRequestOutcome.NOT_PROCESSED)
            if keyed is not None and self.replays_failures:
                self._keys[keyed] = _KeyEntry(
                    fingerprint, {}, self.now(), "", FakeGatewayErrorKind.NOT_PROCESSED
                )
            raise FakeGatewayError(
                FakeGatewayErrorKind.NOT_PROCESSED, "the gateway failed before processing"
            )
        if armed is not None and armed.fault is FakeGatewayFault.DECLINE:
            if declined is not None:
                return self._answer(request, keyed, fingerprint, declined)
            self._finish(request, GatewayRequestOutcome.DECLINED)
            raise FakeGatewayError(FakeGatewayErrorKind.DECLINED, "the payment was declined")
        return self._answer(request, keyed, fingerprint, process)

    def _answer(
        self, request: GatewayRequest, key: str | None, fingerprint: str, process: Process
    ) -> Receipt:
        """Under the lock: replay from the key, refuse a mismatch, or process."""
        now = self.now()
        entry = self._keys.get(key) if key is not None else None
        if entry is not None and now - entry.created >= self.key_retention:
            del self._keys[key or ""]
            entry = None
        if entry is not None:
            if entry.fingerprint != fingerprint and self.conflict_on_mismatch:
                self._finish(request, GatewayRequestOutcome.CONFLICT)
                raise FakeGatewayError(
                    FakeGatewayErrorKind.CONFLICT, f"key {key!r} was used with other parameters"
                )
            request.outcome = GatewayRequestOutcome.REPLAYED
            request.object_id = entry.object_id
            if self.first_response_on_repeat:
                return copy.deepcopy(entry.response)
            current = copy.deepcopy(self._objects[entry.object_id])
            return {**current, "request_id": request.request_id}
        try:
            body = process(now)
        except FakeGatewayError as exc:
            declined = exc.kind is FakeGatewayErrorKind.DECLINED
            self._finish(
                request,
                GatewayRequestOutcome.DECLINED if declined else GatewayRequestOutcome.INVALID,
            )
            raise
        self._objects[body["id"]] = body
        response = {**copy.deepcopy(body), "request_id": request.request_id}
        request.outcome = (
            GatewayRequestOutcome.DECLINED
            if body["status"] == _DECLINED
            else GatewayRequestOutcome.PROCESSED
        )
        request.object_id = body["id"]
        if request.idempotency_key is not None:
            self._by_key.setdefault(request.idempotency_key, []).append(body["id"])
        if key is not None:
            self._keys[key] = _KeyEntry(fingerprint, copy.deepcopy(response), now, body["id"])
        return response

    def _saved_failure(
        self, request: GatewayRequest, key: str | None, fingerprint: str
    ) -> FakeGatewayError | None:
        """Under the lock: the failure saved under ``key`` (replays_failures), to raise again."""
        entry = self._keys.get(key) if key is not None else None
        if entry is None or entry.error is None:
            return None
        if self.now() - entry.created >= self.key_retention:
            del self._keys[key or ""]
            return None
        if entry.fingerprint != fingerprint and self.conflict_on_mismatch:
            return None  # _answer refuses it as a conflict
        request.outcome = GatewayRequestOutcome.REPLAYED
        return FakeGatewayError(entry.error, "the saved failure under this key, replayed")

    def _finish(self, request: GatewayRequest, outcome: GatewayRequestOutcome) -> None:
        with self._lock:
            request.outcome = outcome

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

    def _listed(self, kind: str) -> list[Receipt]:
        with self._lock:
            return [
                copy.deepcopy(o)
                for o in self._objects.values()
                if o["object"] == kind and o["status"] != _DECLINED
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
