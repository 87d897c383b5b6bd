"""A FakeGateway in the test process, reachable from worker subprocesses over HTTP.

The test keeps the one ``FakeGateway`` whose ``requests`` and ``payments`` it
asserts on; workers talk to it through a tiny JSON endpoint on 127.0.0.1:

- ``POST /charge`` ``{"amount", "idempotency_key", "reference"}`` → the receipt, or
  ``{"error": kind}`` with 402/409/503 (a dropped answer closes the connection);
- ``GET /lookup?key=…`` → the receipt or ``null`` (G2);
- ``POST /note`` ``{"event", "task_id", "pid", …}`` → 204: a worker says where it is
  (a body started, ended); the test reads ``notes``;
- ``POST /gate`` ``{"name", "pid"}`` → blocks until the test opens the gate (or a
  bound passes), so a test can hold a body at a known line and signal its process.

Every request records the sender's pid (header ``X-Worker-Pid``), so a test can
SIGKILL or SIGSTOP exactly the pool child that is charging.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from celery_agboss.testing.gateway import FakeGateway
from celery_agboss.testing.gateway_types import FakeGatewayError, FakeGatewayTimeout

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


class GatewayHTTPServer:
    """``with GatewayHTTPServer(gateway) as server: server.url``; see the module docstring."""

    def __init__(self, gateway: FakeGateway | None = None) -> None:
        self.gateway = gateway or FakeGateway()
        self._lock = threading.Lock()
        self._notes: list[Note] = []
        self._gates: dict[str, _Gate] = {}
        self.charge_pids: list[int] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="gateway-http", daemon=True
        )

    # --- life cycle -------------------------------------------------------------------

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> GatewayHTTPServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            gates = list(self._gates.values())
        for gate in gates:
            gate.opened.set()
        self.gateway.close()
        self._server.shutdown()
        self._server.server_close()

    # --- what tests read and do ---------------------------------------------------------

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

    # --- the endpoint -------------------------------------------------------------------

    def _record_note(self, body: dict[str, Any], pid: int | None) -> None:
        note = Note(
            event=str(body.pop("event")),
            task_id=body.pop("task_id", None),
            pid=pid,
            at=time.time(),
            fields=body,
        )
        with self._lock:
            self._notes.append(note)

    def _wait_gate(self, name: str, pid: int | None) -> bool:
        gate = self._gate(name)
        with self._lock:
            gate.waiting.append(pid or 0)
        return gate.opened.wait(GATE_BOUND_SECONDS)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def _pid(self) -> int | None:
                value = self.headers.get("X-Worker-Pid")
                return int(value) if value and value.isdigit() else None

            def _body(self) -> dict[str, Any]:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b"{}"
                value = json.loads(raw or b"{}")
                return value if isinstance(value, dict) else {}

            def _send(self, status: int, payload: Any = None) -> None:
                data = b"" if status == 204 else json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the caller died while we answered: exactly what some tests do

            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                if parts.path != "/lookup":
                    self._send(404, {"error": "not found"})
                    return
                key = parse_qs(parts.query).get("key", [""])[0]
                try:
                    self._send(200, server.gateway.lookup(key))
                except FakeGatewayError as exc:
                    self._send(501, {"error": exc.kind.value})

            def do_POST(self) -> None:
                path = urlsplit(self.path).path
                body = self._body()
                pid = self._pid()
                if path == "/note":
                    server._record_note(body, pid)
                    self._send(204)
                elif path == "/gate":
                    opened = server._wait_gate(str(body.get("name")), pid)
                    self._send(200 if opened else 504, {"opened": opened})
                elif path == "/charge":
                    self._charge(body, pid)
                else:
                    self._send(404, {"error": "not found"})

            def _charge(self, body: dict[str, Any], pid: int | None) -> None:
                if pid is not None:
                    with server._lock:
                        server.charge_pids.append(pid)
                try:
                    receipt = server.gateway.charge(
                        int(body["amount"]),
                        body.get("idempotency_key"),
                        reference=body.get("reference"),
                    )
                except FakeGatewayTimeout:
                    self.close_connection = True  # the answer is lost: no response at all
                    return
                except FakeGatewayError as exc:
                    status = {"CONFLICT": 409, "IN_PROGRESS": 409, "DECLINED": 402}.get(
                        exc.kind.value, 503
                    )
                    self._send(status, {"error": exc.kind.value, "message": str(exc)})
                    return
                self._send(200, receipt)

        return Handler


def wait_for(predicate: Callable[[], Any], timeout: float, what: str | Callable[[], str]) -> Any:
    """Poll ``predicate`` until truthy; AssertionError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            text = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout:g}s waiting for {text}")
        time.sleep(0.05)


__all__ = ["GatewayHTTPServer", "Note", "wait_for"]
