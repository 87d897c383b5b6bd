"""A :class:`FakeGateway` served over HTTP on 127.0.0.1, for code in other processes.

The process that owns the server keeps the one ``FakeGateway`` whose ``payments`` and
``requests`` it asserts on; workers (subprocesses) reach it with any HTTP client. Only
127.0.0.1 is ever bound, on a free port: the fake cannot be mistaken for, or exposed
as, a real gateway.

The JSON endpoints of this base (a dialect for an official SDK adds its own through
:meth:`FakeGatewayServer.route`):

- ``POST /charge`` ``{"amount", "idempotency_key", "reference", "card", "metadata"}``
  → 200 and the receipt; or ``{"error": kind, "message"}`` with the status of
  :attr:`FakeGatewayServer.error_status` (402 declined, 409 conflict or in progress,
  503 nothing processed, ...); a dropped answer (``ANSWER_THEN_DROP``, a hold that
  timed out) closes the connection without a response. A ``card`` in
  ``declined_cards`` is declined by the gateway (``charge(card_declines=True)``: each
  send is in its ``requests``, DECLINED, and in :attr:`FakeGatewayServer.declines`)
  every time, the decline saved under no key: a deterministic decline, unlike an
  injected ``DECLINE`` fault. A key that already holds an answer replays it.
- ``GET /lookup?key=…`` → 200 and the receipt, or ``null`` (design: G2); 501 when lookup is off.
- ``GET /health`` → 200 ``{"ok": true}``.

A dialect (``dialect="stripe"``, the default, ``"checkout"``, ``"adyen"``, ``"paypal"``,
or a :class:`~celery_agboss.testing.dialects.Dialect` object with its own options) adds
the routes an official SDK calls, on top of these, over the same ``FakeGateway``: its
``payments`` and ``requests`` count what every SDK sent: a route that moves money
(``route(..., sends=...)``) records each request once, also one it answered without the
gateway, and one whose body could not be read (``INVALID``: no endpoint saw it). Routes
may hold ``{name}`` segments, read from :attr:`GatewayCall.params`.

A client may send its pid in the ``X-Worker-Pid`` header: every charge is recorded with
it (:attr:`charges_seen`), so a test can signal exactly the process that is charging, and
:meth:`hold_next_answer` keeps the next charge's answer in the server (the payment is
made) and says who sent it.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar, Protocol, runtime_checkable

from celery_agboss.testing.gateway import FakeGateway
from celery_agboss.testing.gateway_handler import PID_HEADER as PID_HEADER
from celery_agboss.testing.gateway_handler import (
    GatewayCall,
    GatewayHandler,
    Reply,
    unreadable_reply,
)
from celery_agboss.testing.gateway_requests import Served, counting, serving
from celery_agboss.testing.gateway_types import (
    ChargeSeen,
    Decline,
    FakeGatewayError,
    FakeGatewayErrorKind,
    FakeGatewayTimeout,
    GatewayCapabilities,
    GatewayRequestOutcome,
    HeldAnswer,
    MoneyRequest,
)
from celery_agboss.testing.loopback import QuietServer

HOST = "127.0.0.1"
_SEGMENT = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
DECLINED_CARD = "tok_chargeDeclined"


Endpoint = Callable[[GatewayCall], Reply]
Sends = Callable[[GatewayCall], MoneyRequest | None]
"""What a money-moving route's request is (None: this one moves no money, e.g. PayPal's
order created without a payment source)."""


@dataclass(frozen=True)
class Route:
    """What serves a path (:meth:`FakeGatewayServer.route_at`)."""

    endpoint: Endpoint
    sends: Sends | None  # set: the route moves money, each request counted (``_count``)


class FakeGatewayServer:
    """``with FakeGatewayServer(gateway) as server: server.url``; see the module docstring."""

    error_status: dict[FakeGatewayErrorKind, int] = {
        FakeGatewayErrorKind.DECLINED: 402,
        FakeGatewayErrorKind.CONFLICT: 409,
        FakeGatewayErrorKind.IN_PROGRESS: 409,
        FakeGatewayErrorKind.INVALID_REQUEST: 400,
        FakeGatewayErrorKind.NOT_FOUND: 404,
        FakeGatewayErrorKind.LOOKUP_UNSUPPORTED: 501,
    }
    """Status per error kind; any other kind (``NOT_PROCESSED`` above all) is 503. Each
    server copies it when made: change ``server.error_status`` for one server (its test),
    this class attribute for every server made after."""

    def __init__(
        self,
        gateway: FakeGateway | None = None,
        *,
        declined_cards: Iterable[str] = (DECLINED_CARD,),
        hold_timeout: float = 60.0,
        dialect: str | Dialect | None = "stripe",
        port: int = 0,
    ) -> None:
        if not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"port must be a TCP port on 127.0.0.1 (0: a free one), not {port!r}")
        self.port = port
        self.gateway = gateway if gateway is not None else FakeGateway()
        self.declined_cards = frozenset(declined_cards)
        self.hold_timeout = hold_timeout
        self.error_status = dict(type(self).error_status)  # this server's own
        self._lock = threading.Lock()
        self._charges: list[ChargeSeen] = []
        self._declines: list[Decline] = []
        self._held: list[HeldAnswer] = []
        self._routes: dict[tuple[str, str], Route] = {}
        self._patterns: list[tuple[str, re.Pattern[str], Route]] = []
        self._server: ThreadingHTTPServer | None = None
        self._url: str | None = None  # set by start(), kept through stop()
        self._thread: threading.Thread | None = None
        self.route("POST", "/charge", self.charge_endpoint, sends=_base_charge)
        self.route("GET", "/lookup", self.lookup_endpoint)
        self.route("GET", "/health", lambda call: Reply(200, {"ok": True}))
        self.dialect = resolve_dialect(dialect)
        if self.dialect is not None:
            self.dialect.install(self)

    # --- life cycle -------------------------------------------------------------------

    def start(self) -> FakeGatewayServer:
        """Listen on 127.0.0.1, on ``port`` (a free one by default); idempotent."""
        if self._server is None:
            server = QuietServer((HOST, self.port), self._handler_class())
            server.daemon_threads = True
            self._server = server
            host, port = server.server_address[:2]
            self._url = f"http://{host!s}:{port}"
            self._thread = threading.Thread(
                # A short poll: stop() waits for one, and tests start and stop many.
                target=server.serve_forever,
                kwargs={"poll_interval": 0.05},
                name="fake-gateway-http",
                daemon=True,
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        """Release every held answer, stop serving and free the port; idempotent."""
        with self._lock:
            held = list(self._held)
        for answer in held:
            answer.release()
        self.gateway.close()
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def close(self) -> None:
        self.stop()

    def __enter__(self) -> FakeGatewayServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``, from ``start()`` on. It stays readable while the
        server stops: an answer released by ``stop()`` still names it in its body."""
        if self._url is None:
            raise RuntimeError("the fake gateway server is not started")
        return self._url

    # --- extending it ------------------------------------------------------------------

    def route(
        self, method: str, path: str, endpoint: Endpoint, *, sends: Sends | None = None
    ) -> None:
        """Serve ``endpoint`` for ``method path``; ``{name}`` segments match one segment.

        ``sends``: the route moves money, and each of its requests is recorded in the
        gateway's ``requests`` exactly once (:meth:`_count`). A fixed path replaces any
        earlier route for it; patterns are tried in the order they were added, after
        every fixed path.
        """
        method = method.upper()
        entry = Route(endpoint, sends)
        if "{" not in path:
            self._routes[(method, path)] = entry
            return
        parts = []
        for segment in path.split("/"):
            named = _SEGMENT.fullmatch(segment)
            parts.append(f"(?P<{named.group(1)}>[^/]+)" if named else re.escape(segment))
        self._patterns.append((method, re.compile("/".join(parts)), entry))

    def route_at(self, method: str, path: str) -> Route:
        """What serves the fixed path ``method path``, so a test can wrap it with
        :meth:`route` (``sends=`` kept) and put it back; ``KeyError`` when none does."""
        return self._routes[(method.upper(), path)]

    def _count(self, call: GatewayCall, endpoint: Endpoint, sends: Sends) -> Reply:
        """The one place every money-moving request is counted, whatever dialect it speaks
        and however it came in (a route, or ``charge_endpoint`` called by a handler): one
        the gateway's request path recorded stays as it is (unanswered when the answer was
        dropped); one answered without it (a body that could not be read, a refusal, a
        canned or replayed answer) is recorded here, with what was done."""
        if counting():
            return endpoint(call)  # inside a request already being counted, by its caller
        at = self.gateway.now()
        with serving() as served:
            reply = unreadable_reply(call) if call.unreadable is not None else endpoint(call)
        self._settle(call, sends, served, reply, at)
        return reply

    def _settle(
        self, call: GatewayCall, sends: Sends, served: Served, reply: Reply, at: float
    ) -> None:
        """After the route answered: a drop of what the gateway recorded, or the record
        of a request the gateway never saw (``CANNED``, a refusal, a replay of its own, a
        body that could not be read: ``INVALID``)."""
        if served.recorded:
            if reply.drop:
                self.gateway.answer_lost(served.recorded)
            return
        sent = sends(call)
        if sent is None:
            return
        outcome = served.outcome
        if outcome is None:  # refused before the gateway, or answered from the route's state
            outcome = (
                GatewayRequestOutcome.TIMED_OUT
                if reply.drop
                else GatewayRequestOutcome.INVALID
                if reply.status >= 400
                else GatewayRequestOutcome.REPLAYED
            )
        self.gateway.record_answered_here(sent, outcome, at=at, answered=not reply.drop)

    def handle(self, call: GatewayCall) -> Reply:
        """The one dispatch every request goes through. A body that could not be read
        reaches no endpoint: refused, and counted on a money-moving route."""
        found = self._route_of(call)
        if found is None:
            if call.unreadable is not None:
                return unreadable_reply(call)
            return Reply(404, {"error": "NOT_FOUND", "message": f"no {call.method} {call.path}"})
        route, call = found
        if route.sends is not None:
            return self._count(call, route.endpoint, route.sends)
        return unreadable_reply(call) if call.unreadable is not None else route.endpoint(call)

    def _route_of(self, call: GatewayCall) -> tuple[Route, GatewayCall] | None:
        """The route serving ``call``, and the call with its ``{name}`` segments read."""
        fixed = self._routes.get((call.method, call.path))
        if fixed is not None:
            return fixed, call
        for method, pattern, route in self._patterns:
            matched = pattern.fullmatch(call.path) if method == call.method else None
            if matched is not None:
                return route, dataclasses.replace(call, params=matched.groupdict())
        return None

    def error_reply(self, exc: FakeGatewayError) -> Reply:
        if isinstance(exc, FakeGatewayTimeout):
            return Reply(0, drop=True)
        status = self.error_status.get(exc.kind, 503)
        return Reply(status, {"error": exc.kind.value, "message": str(exc)})

    # --- what the owner reads and does ----------------------------------------------------

    @property
    def charges_seen(self) -> list[ChargeSeen]:
        """The charges whose body was read, as they arrived; a send the server could not
        read is only in the gateway's ``requests`` (``INVALID``), with no reference."""
        with self._lock:
            return list(self._charges)

    @property
    def declines(self) -> list[Decline]:
        with self._lock:
            return list(self._declines)

    def pid_of_charge(self, idempotency_key: str) -> int | None:
        """The process that sent the first charge under ``idempotency_key``, if it said."""
        for seen in self.charges_seen:
            if seen.idempotency_key == idempotency_key and seen.pid is not None:
                return seen.pid
        return None

    def hold_next_answer(
        self, timeout: float | None = None, *, reference: str | None = None
    ) -> HeldAnswer:
        """Keep the answer to the next charge the gateway processes in the server.

        The payment is made; the caller waits until :meth:`HeldAnswer.release` (or
        ``timeout``, then its connection is closed with no answer). ``pid`` and
        ``idempotency_key`` say who it is once ``reached``. With ``reference``, only a
        charge for that reference is held: a late charge of an earlier test, still in
        flight, would otherwise take the hold and name the wrong process.
        """
        answer = HeldAnswer(
            timeout=self.hold_timeout if timeout is None else timeout, only_reference=reference
        )
        with self._lock:
            self._held.append(answer)
        return answer

    def cancel_hold(self, answer: HeldAnswer) -> None:
        """Disarm a hold no charge reached yet (one that was reached is released instead)."""
        with self._lock:
            if answer in self._held:
                self._held.remove(answer)

    def _take_held(self, reference: str | None) -> HeldAnswer | None:
        with self._lock:
            for held in self._held:
                if held.only_reference is None or held.only_reference == reference:
                    self._held.remove(held)
                    return held
            return None

    # --- for dialects: what every charge goes through ---------------------------------------

    def charge_arrived(self, call: GatewayCall, key: str | None, reference: str | None) -> None:
        """Record a charge as it reached the server (before the gateway processes it)."""
        with self._lock:
            self._charges.append(ChargeSeen(call.pid, key, reference, time.time()))

    def is_declined_card(
        self, call: GatewayCall, card: str, key: str | None, reference: str | None
    ) -> bool:
        """True (and recorded in :attr:`declines`) when ``card`` is one that always declines."""
        if card not in self.declined_cards:
            return False
        with self._lock:
            self._declines.append(Decline(key, reference, card, time.time()))
        return True

    def deliver_answer(
        self, call: GatewayCall, key: str | None, reference: str | None, reply: Reply
    ) -> Reply:
        """The processed charge's reply, or a drop when a hold on it timed out.

        Dialects pass every successful charge's reply through here, so
        :meth:`hold_next_answer` works whatever API the client speaks.
        """
        held = self._take_held(reference)
        if held is not None:
            held.pid, held.idempotency_key, held.reference = call.sender_pid(), key, reference
            held._reached.set()
            if not held._released.wait(held.timeout):
                return Reply(0, drop=True)
        return reply

    # --- the endpoints ----------------------------------------------------------------------

    def charge_endpoint(self, call: GatewayCall) -> Reply:
        """``POST /charge``, counted here too: a server's handler that answers charges
        itself through this method (not the route) counts each one as the route does."""
        return self._count(call, self._charge, _base_charge)

    def _charge(self, call: GatewayCall) -> Reply:
        body = call.body
        key = body.get("idempotency_key")
        reference = body.get("reference")
        card = str(body.get("card") or "")
        self.charge_arrived(call, key, reference)
        declining = card in self.declined_cards
        try:
            amount = int(body["amount"])
        except (KeyError, TypeError, ValueError):
            return Reply(400, {"error": "INVALID_REQUEST", "message": "amount is required"})
        metadata = body.get("metadata")
        extra = dict(metadata) if isinstance(metadata, dict) else {}
        try:
            receipt = self.gateway.charge(
                amount, key, reference=reference, card_declines=declining, **extra
            )
        except FakeGatewayError as exc:
            if declining and exc.kind is FakeGatewayErrorKind.DECLINED:
                self.is_declined_card(call, card, key, reference)  # recorded in declines
                return Reply(402, {"error": "DECLINED", "message": f"card {card} declined"})
            return self.error_reply(exc)
        return self.deliver_answer(call, key, reference, Reply(200, receipt))

    def lookup_endpoint(self, call: GatewayCall) -> Reply:
        try:
            return Reply(200, self.gateway.lookup(call.query.get("key", "")))
        except FakeGatewayError as exc:
            return self.error_reply(exc)

    # --- HTTP ------------------------------------------------------------------------------

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        """The request handler of this server: every request answered by :meth:`handle`
        (a subclass's handler may take some paths itself, overriding ``dispatch``)."""
        return type("Handler", (GatewayHandler,), {"owner": self})


def _base_charge(call: GatewayCall) -> MoneyRequest:
    """``POST /charge``'s request, its amount when it is a whole number."""
    amount = call.body.get("amount")
    whole = amount if isinstance(amount, int) and not isinstance(amount, bool) else None
    return MoneyRequest("charge", call.body.get("idempotency_key"), whole)


@runtime_checkable
class Dialect(Protocol):
    """One gateway's API, installed as routes on a server (``celery_agboss.testing.dialects``)."""

    name: str
    documented_capabilities: ClassVar[GatewayCapabilities]  # what the gateway's docs say

    def install(self, server: FakeGatewayServer) -> None: ...


# name -> "module:class", imported only when asked for, so one dialect's imports never
# reach a test that speaks another (and this module imports none of them).
DIALECTS: dict[str, str] = {
    "stripe": "celery_agboss.testing.dialects.stripe:StripeDialect",
    "checkout": "celery_agboss.testing.dialects.checkout:CheckoutDialect",
    "adyen": "celery_agboss.testing.dialects.adyen:AdyenDialect",
    "paypal": "celery_agboss.testing.dialects.paypal:PayPalDialect",
}


def dialect_class(name: str) -> type[Dialect]:
    try:
        target = DIALECTS[name]
    except KeyError:
        raise ValueError(
            f"unknown gateway dialect {name!r}: choose one of {sorted(DIALECTS)}, or pass a "
            "Dialect object (with name and install(server))"
        ) from None
    module_name, _, attribute = target.partition(":")
    found: type[Dialect] = getattr(importlib.import_module(module_name), attribute)
    return found


def resolve_dialect(dialect: str | Dialect | None) -> Dialect | None:
    """A dialect object for ``FakeGatewayServer(dialect=...)``: a name, an object, or None."""
    if dialect is None:
        return None
    if isinstance(dialect, str):
        return dialect_class(dialect)()
    if not isinstance(dialect, Dialect):
        raise TypeError(
            f"dialect must be a name ({sorted(DIALECTS)}) or an object with name and "
            f"install(server), not {type(dialect).__name__}"
        )
    return dialect


def documented_capabilities(name: str) -> GatewayCapabilities:
    """What the named gateway documents (design: gateway requirements), as ``FakeGateway``
    capabilities."""
    return dialect_class(name).documented_capabilities


__all__ = [
    "DECLINED_CARD",
    "DIALECTS",
    "ChargeSeen",
    "Decline",
    "Dialect",
    "FakeGatewayServer",
    "GatewayCall",
    "HeldAnswer",
    "MoneyRequest",
    "Reply",
    "Route",
    "Sends",
    "dialect_class",
    "documented_capabilities",
    "resolve_dialect",
]
