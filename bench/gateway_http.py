"""The ``FakeGateway`` of the end-to-end benchmark, in a process of its own.

A small JSON endpoint on 127.0.0.1 (a free port): ``POST /charge`` ``{"amount",
"idempotency_key", "reference"}`` → the receipt, ``GET /lookup?key=…`` → the
receipt or ``null``, ``GET /payments`` → ``{"count": n}`` (how the benchmark
checks that each task charged once). It runs as ``python -m bench.gateway_http``,
apart from the benchmark process, as a real gateway is remote: the publisher and
the gateway never share one interpreter lock. Both sides of the comparison call
it the same way, one connection per call (``bench.gateway_client``).
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from celery_agboss.testing.gateway import FakeGateway, FakeGatewayError


class GatewayServer:
    """``with GatewayServer() as server: server.url``; ``server.gateway`` is the fake."""

    def __init__(self, gateway: FakeGateway | None = None) -> None:
        self.gateway = gateway or FakeGateway()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self.gateway))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="bench-gateway", daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> GatewayServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.gateway.close()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)


def _handler(gateway: FakeGateway) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, status: int, payload: Any) -> None:
            data = json.dumps(payload).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except OSError:
                pass

        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            if parts.path == "/payments":
                self._send(200, {"count": len(gateway.payments)})
                return
            if parts.path != "/lookup":
                self._send(404, {"error": "not found"})
                return
            key = parse_qs(parts.query).get("key", [""])[0]
            self._send(200, gateway.lookup(key))

        def do_POST(self) -> None:
            if urlsplit(self.path).path != "/charge":
                self._send(404, {"error": "not found"})
                return
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            try:
                receipt = gateway.charge(
                    int(body["amount"]),
                    body.get("idempotency_key"),
                    reference=body.get("reference"),
                )
            except FakeGatewayError as exc:
                self._send(503, {"error": exc.kind.value})
                return
            self._send(200, receipt)

    return Handler


def main() -> int:
    """Serve until SIGTERM; the first line printed names the URL."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    with GatewayServer() as server:
        print(f"{LISTENING} {server.url}", flush=True)
        while not stop.wait(1.0):
            pass
    return 0


LISTENING = "bench gateway listening on"

if __name__ == "__main__":
    sys.exit(main())

__all__ = ["LISTENING", "GatewayServer", "main"]
