"""A FakeGateway in the test process, reachable from worker subprocesses over HTTP.

The test keeps the one ``FakeGateway`` whose ``requests`` and ``payments`` it
asserts on; workers talk to it through a tiny JSON endpoint on 127.0.0.1:

- ``POST /charge`` ``{"amount", "idempotency_key", "reference"}`` → the receipt, or
  ``{"error": kind}`` with 402/409/503 (a dropped answer closes the connection);
- ``GET /lookup?key=…`` → the receipt or ``null`` (design: G2);
- ``POST /note`` ``{"event", "task_id", "pid", …}`` → 204: a worker says where it is
  (a body started, ended); the test reads ``notes``;
- ``POST /gate`` ``{"name", "pid"}`` → blocks until the test opens the gate (or a
  bound passes), so a test can hold a body at a known line and signal its process.

Every request records the sender's pid (header ``X-Worker-Pid``), so a test can
SIGKILL or SIGSTOP exactly the pool child that is charging.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from celery_agboss.testing.gateway import FakeGateway
from celery_agboss.testing.gateway_server import FakeGatewayServer, GatewayCall, Reply
from celery_agboss.testing.gateway_types import FakeGatewayErrorKind
from tests.support.processes import wait_until

GATE_BOUND_SECONDS = 60.0


@dataclass
class Note:
    event: str
    task_id: str | None
    pid: int | None
    at: float
    fields: dict[str, Any] = field(default_factory=dict)


class _Gate:
    def __init__(self) -> None:
        self.opened = threading.Event()
        self.waiting: list[int] = []  # pids that reached the gate (in order)


class GatewayHTTPServer(FakeGatewayServer):
    """``with GatewayHTTPServer(gateway) as server: server.url``; see the module docstring.

    The package's :class:`FakeGatewayServer` with the test-only ``/note`` and ``/gate``
    endpoints, its port bound at construction, and the status mapping these tests were
    written against (every error but a decline or a conflict is a 503)."""

    error_status = {
        FakeGatewayErrorKind.DECLINED: 402,
        FakeGatewayErrorKind.CONFLICT: 409,
        FakeGatewayErrorKind.IN_PROGRESS: 409,
        FakeGatewayErrorKind.LOOKUP_UNSUPPORTED: 501,
    }

    def __init__(self, gateway: FakeGateway | None = None) -> None:
        super().__init__(gateway or FakeGateway(), declined_cards=())
        self._notes: list[Note] = []
        self._gates: dict[str, _Gate] = {}
        self.route("POST", "/note", self._note_endpoint)
        self.route("POST", "/gate", self._gate_endpoint)
        self.start()  # the URL is known from construction on; __enter__ only returns it

    # --- life cycle -------------------------------------------------------------------

    def __enter__(self) -> GatewayHTTPServer:
        self.start()
        return self

    def stop(self) -> None:
        with self._lock:
            gates = list(self._gates.values())
        for gate in gates:
            gate.opened.set()
        super().stop()

    # --- what tests read and do ---------------------------------------------------------

    @property
    def charge_pids(self) -> list[int]:
        """The pid of every charge's sender, in the order the charges arrived."""
        return [seen.pid for seen in self.charges_seen if seen.pid is not None]

    @property
    def notes(self) -> list[Note]:
        with self._lock:
            return list(self._notes)

    def notes_of(self, event: str, task_id: str | None = None) -> list[Note]:
        return [
            n for n in self.notes if n.event == event and (task_id is None or n.task_id == task_id)
        ]

    def _gate(self, name: str) -> _Gate:
        with self._lock:
            return self._gates.setdefault(name, _Gate())

    def gate_waiters(self, name: str) -> list[int]:
        gate = self._gate(name)
        with self._lock:
            return list(gate.waiting)

    def open_gate(self, name: str) -> None:
        self._gate(name).opened.set()

    # --- the endpoints ------------------------------------------------------------------

    def _note_endpoint(self, call: GatewayCall) -> Reply:
        body = dict(call.body)
        note = Note(
            event=str(body.pop("event")),
            task_id=body.pop("task_id", None),
            pid=call.pid,
            at=time.time(),
            fields=body,
        )
        with self._lock:
            self._notes.append(note)
        return Reply(204)

    def _gate_endpoint(self, call: GatewayCall) -> Reply:
        gate = self._gate(str(call.body.get("name")))
        with self._lock:
            gate.waiting.append(call.pid or 0)
        opened = gate.opened.wait(GATE_BOUND_SECONDS)
        return Reply(200 if opened else 504, {"opened": opened})

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        """The base handler, with ``_charge(body, pid)`` as the hook a subclass's handler
        overrides (tests/deployment/gateway.py's ``RecordingGatewayServer`` does)."""
        base: Any = super()._handler_class()
        server = self

        class Handler(base):  # type: ignore[misc]
            def dispatch(self, call: GatewayCall) -> None:
                if (call.method, call.path) == ("POST", "/charge"):
                    self._charge(call.body, call.pid)
                else:
                    super().dispatch(call)

            def _charge(self, body: dict[str, Any], pid: int | None) -> None:
                self.reply(server.charge_endpoint(GatewayCall("POST", "/charge", {}, body, pid)))

        handler: type[BaseHTTPRequestHandler] = Handler
        return handler


def wait_for(predicate: Callable[[], Any], timeout: float, what: str | Callable[[], str]) -> Any:
    """:func:`tests.support.processes.wait_until` with what is awaited third: poll
    ``predicate`` until truthy; an AssertionError naming ``what`` after ``timeout``."""
    return wait_until(predicate, timeout, message=what)


__all__ = ["GatewayHTTPServer", "Note", "wait_for"]
