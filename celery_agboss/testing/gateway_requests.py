"""The one path each ``FakeGateway`` money-moving request takes: recorded, refused while
its key is in flight, held or faulted, then replayed from its key or processed.

Kept apart so ``gateway`` reads as the gateway's surface; ``FakeGateway`` inherits it.
"""

from __future__ import annotations

import copy
import json
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from celery_agboss.testing.gateway_faults import ArmedFault, FaultsAndHolds
from celery_agboss.testing.gateway_types import (
    FakeGatewayError,
    FakeGatewayErrorKind,
    FakeGatewayFault,
    FakeGatewayTimeout,
    GatewayHold,
    GatewayRequest,
    GatewayRequestOutcome,
    MoneyRequest,
)

Receipt = dict[str, Any]
DECLINED = "declined"  # a declined payment's status (``saves_declines``): nothing moved


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


_REFUSED = {
    FakeGatewayErrorKind.DECLINED: GatewayRequestOutcome.DECLINED,
    FakeGatewayErrorKind.IN_PROGRESS: GatewayRequestOutcome.IN_PROGRESS,
    FakeGatewayErrorKind.CONFLICT: GatewayRequestOutcome.CONFLICT,
}
"""The outcome a request refused by its processing shows; any other refusal is INVALID."""


@dataclass
class Served:
    """One request a server route is answering: the gateway requests it recorded, and
    what the route did itself (``answered_here``) when it took it no further."""

    recorded: list[GatewayRequest] = field(default_factory=list)
    outcome: GatewayRequestOutcome | None = None


_SERVED: ContextVar[Served | None] = ContextVar("fake_gateway_served", default=None)


@contextmanager
def serving() -> Iterator[Served]:
    """While a money-moving route answers one request (in this thread): what it recorded."""
    served = Served()
    token = _SERVED.set(served)
    try:
        yield served
    finally:
        _SERVED.reset(token)


def counting() -> bool:
    """True while a money-moving route answers a request in this thread: an endpoint it
    calls that counts on its own (``charge_endpoint``) leaves the count to it."""
    return _SERVED.get() is not None


def answered_here(outcome: GatewayRequestOutcome) -> None:
    """The route answering this request does so itself, nothing processed (a canned reply:
    ``CANNED``); the first word said stands. Nothing happens outside a route."""
    served = _SERVED.get()
    if served is not None and served.outcome is None:
        served.outcome = outcome


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


Process = Callable[[float], Receipt]


class RequestPath(FaultsAndHolds):
    """``FakeGateway``'s request path and what it keeps: the payments and refunds made,
    the keys saved, and every request received. Read and written under the one lock."""

    idempotency_keys: bool
    key_retention: float
    first_response_on_repeat: bool
    conflict_on_mismatch: bool
    replays_failures: bool

    def __init__(self) -> None:
        super().__init__()
        self._objects: dict[str, Receipt] = {}  # payments ("charge") and refunds, by id
        self._keys: dict[str, _KeyEntry] = {}
        self._by_key: dict[str, list[str]] = {}
        self._attempts: dict[str, int] = {}
        self._in_flight: set[str] = set()
        self._requests: list[GatewayRequest] = []

    def now(self) -> float:
        """The gateway's time: the virtual clock's when it has one."""
        return self.clock.now() if self.clock is not None else time.time()

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
        *,
        uses_key: bool = True,
    ) -> Receipt:
        """``uses_key=False``: the request is recorded under ``key`` (its attempt counted)
        but the key store is not consulted: answered by ``process`` (a refusal the
        gateway makes on its own state, before its idempotency layer)."""
        fingerprint = json.dumps(
            [operation, amount, payment_id, params], sort_keys=True, default=repr
        )
        keyed = key if uses_key and self.idempotency_keys and key is not None else None
        with self._lock:
            request = self._receive(operation, key, amount, payment_id)
        try:
            response = self._run(request, keyed, fingerprint, process, declined)
        except FakeGatewayTimeout:
            raise  # no answer reached the caller
        except FakeGatewayError:
            self._answered(request)  # a refusal or failure is an answer the caller got
            raise
        self._answered(request)
        return response

    def _run(
        self,
        request: GatewayRequest,
        keyed: str | None,
        fingerprint: str,
        process: Process,
        declined: Process | None,
    ) -> Receipt:
        """The recorded request taken through the key in flight, its fault and hold, and
        processing; raises what the caller gets instead of an answer."""
        with self._lock:
            arrival = self._arrive(request, keyed)
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
        return response

    def _receive(
        self, operation: str, key: str | None, amount: int | None, payment_id: str | None
    ) -> GatewayRequest:
        """Under the lock: record a request as it arrives (its attempt under ``key``
        counted), and tell the server route answering it that it is recorded."""
        attempt = 1
        if key is not None:
            attempt = self._attempts[key] = self._attempts.get(key, 0) + 1
        request = GatewayRequest(
            new_id("req"), operation, key, amount, payment_id, self.now(), attempt
        )
        self._requests.append(request)
        served = _SERVED.get()
        if served is not None:
            served.recorded.append(request)
        return request

    def _answered(self, request: GatewayRequest) -> None:
        with self._lock:
            request.answered = True

    def record_answered_here(
        self, sent: MoneyRequest, outcome: GatewayRequestOutcome, *, at: float, answered: bool
    ) -> None:
        """A request a server route answered without this request path (``served``
        recorded nothing): recorded once, its attempt counted, nothing processed."""
        with self._lock:
            request = self._receive(
                sent.operation, sent.idempotency_key, sent.amount, sent.payment_id
            )
            request.at, request.outcome, request.answered = at, outcome, answered

    def answer_lost(self, requests: list[GatewayRequest]) -> None:
        """The route dropped the answer to these recorded requests (a held answer that
        timed out): the caller got none."""
        with self._lock:
            for request in requests:
                request.answered = False

    def _arrive(self, request: GatewayRequest, keyed: str | None) -> _Arrival:
        """Under the lock: refuse a key in flight, take the request's fault and hold; a
        request that waits before processing marks its key in flight."""
        if keyed is not None and keyed in self._in_flight:
            request.outcome = GatewayRequestOutcome.IN_PROGRESS
            raise FakeGatewayError(
                FakeGatewayErrorKind.IN_PROGRESS, f"key {keyed!r} is still being processed"
            )
        armed = self._take_fault(request.operation)
        hold = self._take_hold(request.operation)
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
        answered = self._holds_answer(keyed)  # a repeat: its key answers it, not a fault
        if armed is not None and armed.fault is FakeGatewayFault.FAIL_BEFORE_PROCESSING:
            self._finish(request, GatewayRequestOutcome.NOT_PROCESSED)
            if keyed is not None and self.replays_failures and not answered:
                self._keys[keyed] = _KeyEntry(
                    fingerprint, {}, self.now(), "", FakeGatewayErrorKind.NOT_PROCESSED
                )
            raise FakeGatewayError(
                FakeGatewayErrorKind.NOT_PROCESSED, "the gateway failed before processing"
            )
        if armed is not None and armed.fault is FakeGatewayFault.DECLINE and not answered:
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
            self._finish(request, _REFUSED.get(exc.kind, GatewayRequestOutcome.INVALID))
            raise
        self._objects[body["id"]] = body
        response = {**copy.deepcopy(body), "request_id": request.request_id}
        request.outcome = (
            GatewayRequestOutcome.DECLINED
            if body["status"] == DECLINED
            else GatewayRequestOutcome.PROCESSED
        )
        request.object_id = body["id"]
        if request.idempotency_key is not None:
            self._by_key.setdefault(request.idempotency_key, []).append(body["id"])
        if key is not None:
            self._keys[key] = _KeyEntry(fingerprint, copy.deepcopy(response), now, body["id"])
        return response

    def _holds_answer(self, key: str | None) -> bool:
        """Under the lock: ``key`` holds a saved answer inside retention (a success, or a
        declined payment): a repeat is answered from it, whatever fault is armed, and a
        fault on that repeat never replaces it."""
        entry = self._keys.get(key) if key is not None else None
        fresh = entry is not None and self.now() - entry.created < self.key_retention
        return fresh and entry is not None and entry.error is None

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


__all__ = [
    "DECLINED",
    "Process",
    "Receipt",
    "RequestPath",
    "Served",
    "answered_here",
    "counting",
    "new_id",
    "serving",
]
