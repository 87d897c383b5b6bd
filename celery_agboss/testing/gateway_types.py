"""The fake gateway's vocabulary: its capabilities, faults, errors and request records.

Kept apart from ``FakeGateway`` so an adapter's tests (and ``FakeGatewayServer``'s
dialects) can name them without the fake's machinery; ``gateway`` re-exports them.
"""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass, field
from typing import Any, ClassVar


@dataclass(frozen=True)
class GatewayCapabilities:
    """What the fake offers, requirement by requirement (design: gateway requirements)."""

    idempotency_keys: bool = True  # a key deduplicates repeats (design: G1)
    lookup_by_key: bool = True  # lookup(idempotency_key) (design: G2)
    key_retention: float = 86400.0  # seconds a key is kept (on the gateway's clock) (design: G3)
    first_response_on_repeat: bool = True  # a repeat gets the first response (design: G4)
    conflict_on_mismatch: bool = True  # same key, other parameters → refused (design: G5)
    reference_lookup: bool = True  # ``lookup_by_reference``, by the client's reference (design: G2)
    # A failure that processed nothing (NOT_PROCESSED) is saved under its key and
    # answered again to every repeat inside retention, as Stripe does with its 500s.
    replays_failures: bool = False

    FULL: ClassVar[GatewayCapabilities]
    NO_LOOKUP: ClassVar[GatewayCapabilities]
    NO_KEYS: ClassVar[GatewayCapabilities]

    def __post_init__(self) -> None:
        if self.key_retention < 0:
            raise ValueError(f"key_retention must be >= 0 seconds, not {self.key_retention}")


GatewayCapabilities.FULL = GatewayCapabilities()
GatewayCapabilities.NO_LOOKUP = GatewayCapabilities(lookup_by_key=False, reference_lookup=False)
GatewayCapabilities.NO_KEYS = GatewayCapabilities(
    idempotency_keys=False,
    lookup_by_key=False,
    key_retention=0.0,
    first_response_on_repeat=False,
    conflict_on_mismatch=False,
    reference_lookup=False,
)


class FakeGatewayFault(str, enum.Enum):
    """A failure ``inject_fault`` arms for the next requests."""

    ANSWER_THEN_DROP = "ANSWER_THEN_DROP"  # processed, then the caller sees a timeout
    FAIL_BEFORE_PROCESSING = "FAIL_BEFORE_PROCESSING"  # nothing processed; a definite failure
    SLOW = "SLOW"  # answers after ``delay`` (virtual clock advanced, or a real sleep)
    DECLINE = "DECLINE"  # declined; nothing processed; a definite failure


class FakeGatewayErrorKind(str, enum.Enum):
    CONFLICT = "CONFLICT"  # the key was used with other parameters (design: G5)
    IN_PROGRESS = "IN_PROGRESS"  # the key's first request is still being processed
    NOT_PROCESSED = "NOT_PROCESSED"  # definite: the gateway processed nothing
    DECLINED = "DECLINED"  # definite: declined, no money moved
    ANSWER_DROPPED = "ANSWER_DROPPED"  # processed, but the answer never reached the caller
    TIMED_OUT = "TIMED_OUT"  # a held request gave up before it was processed
    LOOKUP_UNSUPPORTED = "LOOKUP_UNSUPPORTED"  # lookup is off (design: G2)
    NOT_FOUND = "NOT_FOUND"  # no such payment
    INVALID_REQUEST = "INVALID_REQUEST"  # e.g. over-capture, refund of a voided payment


class FakeGatewayError(Exception):
    """The fake gateway refused or failed a request; ``kind`` says how."""

    def __init__(self, kind: FakeGatewayErrorKind, message: str | None = None) -> None:
        super().__init__(message or f"fake gateway: {kind.value}")
        self.kind = kind

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.kind, self.args[0]))


class FakeGatewayTimeout(FakeGatewayError, TimeoutError):
    """The caller never got an answer: it cannot tell whether the gateway processed it."""

    def __init__(
        self,
        kind: FakeGatewayErrorKind = FakeGatewayErrorKind.ANSWER_DROPPED,
        message: str | None = None,
    ) -> None:
        super().__init__(kind, message)


_DEFINITE = frozenset({FakeGatewayErrorKind.NOT_PROCESSED, FakeGatewayErrorKind.DECLINED})


def is_definite_failure(exc: BaseException) -> bool:
    """True only when the fake said nothing was processed (``NOT_PROCESSED``, ``DECLINED``).

    Pass it as ``OutboundCall(is_definite_failure=...)`` in tests: every other error,
    a timeout above all, is of unknown outcome (design: A15).
    """
    return isinstance(exc, FakeGatewayError) and exc.kind in _DEFINITE


class GatewayRequestOutcome(str, enum.Enum):
    ON_THE_WIRE = "ON_THE_WIRE"  # received, not answered yet
    PROCESSED = "PROCESSED"  # money moved (or was authorised) by this request
    REPLAYED = "REPLAYED"  # answered from its key; nothing processed
    CONFLICT = "CONFLICT"
    IN_PROGRESS = "IN_PROGRESS"
    NOT_PROCESSED = "NOT_PROCESSED"
    DECLINED = "DECLINED"
    INVALID = "INVALID"  # refused (a malformed body, no API key, an action not allowed)
    TIMED_OUT = "TIMED_OUT"
    CANNED = "CANNED"  # answered by a reply the test armed (``answer_next``); nothing processed


@dataclass
class GatewayRequest:
    """One request as the gateway received it (a snapshot when read from ``requests``)."""

    request_id: str
    operation: str  # "charge", "capture", "refund", "void"
    idempotency_key: str | None
    amount: int | None
    payment_id: str | None  # the payment a capture, refund or void targets
    at: float  # gateway clock
    attempt: int  # 1 for the first request under this key, 2 for the next, ...
    outcome: GatewayRequestOutcome = GatewayRequestOutcome.ON_THE_WIRE
    object_id: str | None = None  # the payment or refund the answer is about
    answered: bool = False  # False while on the wire and when the answer was dropped
    fault: FakeGatewayFault | None = None


@dataclass(frozen=True)
class MoneyRequest:
    """What a money-moving request of a server route is, read from the request itself: how
    it is recorded when the route answers it without the gateway's request path (a canned
    reply, a refusal before the key is read)."""

    operation: str  # "charge", "capture", "refund", "void"
    idempotency_key: str | None
    amount: int | None = None  # ISO 4217 minor units; None when not told (or unreadable)
    payment_id: str | None = None  # the fake's id of the payment it targets


@dataclass(frozen=True)
class GatewayLookup:
    by: str  # "key" or "reference"
    value: str
    at: float
    found: int


@dataclass(frozen=True)
class ChargeSeen:
    """A charge as it reached a ``FakeGatewayServer``, before the gateway processed it."""

    pid: int | None
    idempotency_key: str | None
    reference: str | None
    at: float


@dataclass(frozen=True)
class Decline:
    """A charge declined by its card (``declined_cards``): nothing was processed."""

    idempotency_key: str | None
    reference: str | None
    card: str
    at: float


@dataclass(eq=False)
class HeldAnswer:
    """One charge's answer kept in the server (:meth:`FakeGatewayServer.hold_next_answer`)."""

    timeout: float
    pid: int | None = None
    idempotency_key: str | None = None
    reference: str | None = None
    only_reference: str | None = None
    _reached: threading.Event = field(default_factory=threading.Event)
    _released: threading.Event = field(default_factory=threading.Event)

    @property
    def reached(self) -> bool:
        """True once a charge was processed and its answer is held."""
        return self._reached.is_set()

    def wait_reached(self, timeout: float) -> bool:
        return self._reached.wait(timeout)

    def release(self) -> None:
        """Let the held answer go (to a caller that may be dead or frozen by now)."""
        self._released.set()


class GatewayHold:
    """Keeps requests "on the wire": blocked inside the gateway until ``release()``.

    After processing (the default) the payment exists but the caller has no answer
    yet; before processing, nothing happened yet and the key is in flight. A hold
    never released gives up after ``timeout`` seconds: the caller sees a timeout.
    """

    def __init__(self, *, times: int, before: bool, operation: str | None, timeout: float) -> None:
        self.before_processing = before
        self.operation = operation
        self.timeout = timeout
        self.remaining = times
        self.hits = 0
        self._reached = threading.Event()
        self._released = threading.Event()

    @property
    def reached(self) -> bool:
        return self._reached.is_set()

    def wait_reached(self, timeout: float = 10.0) -> None:
        """Block until a request is held; a test fails (AssertionError) rather than hang."""
        if not self._reached.wait(timeout):
            raise AssertionError(f"no request reached the gateway hold within {timeout} s")

    def release(self) -> None:
        self._released.set()

    def _block(self) -> bool:
        self._reached.set()
        return self._released.wait(self.timeout)

    def __enter__(self) -> GatewayHold:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
