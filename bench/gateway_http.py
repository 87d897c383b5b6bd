"""The ``FakeGateway`` of the end-to-end benchmark, in a process of its own.

A small JSON endpoint on 127.0.0.1 (a free port): ``POST /charge`` ``{"amount",
"idempotency_key", "reference"}`` → the receipt, ``GET /lookup?key=…`` → the
receipt or ``null``, ``GET /payments`` → ``{"count": n}`` (how the benchmark
checks that each task charged once). ``--latency-ms N`` makes every charge and
lookup answer N ms late, as a gateway across the internet does (the benchmark's
second setting). It runs as ``python -m bench.gateway_http``,
apart from the benchmark process, as a real gateway is remote: the publisher and
the gateway never share one interpreter lock. Both sides of the comparison call
it the same way, one connection per call (``bench.gateway_client``).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from celery_agboss.testing.gateway import FakeGateway, FakeGatewayError


class GatewayServer:
    """``with GatewayServer() as server: server.url``; ``server.gateway`` is the fake."""

    def __init__(self, gateway: FakeGateway | None = None, *, latency_ms: float = 0.0) -> None:
        self.gateway = gateway or FakeGateway()
        self._server = ThreadingHTTPServer(
            ("127.0.0.1", 0), _handler(self.gateway, latency_ms / 1000)
        )
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


def _handler(gateway: FakeGateway, latency_seconds: float) -> type[BaseHTTPRequestHandler]:
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
            if latency_seconds > 0:
                time.sleep(latency_seconds)
            self._send(200, gateway.lookup(key))

        def do_POST(self) -> None:
            if urlsplit(self.path).path != "/charge":
                self._send(404, {"error": "not found"})
                return
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            if latency_seconds > 0:
                time.sleep(latency_seconds)
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


def main(argv: list[str] | None = None) -> int:
    """Serve until SIGTERM; the first line printed names the URL."""
    parser = argparse.ArgumentParser(prog="python -m bench.gateway_http")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="delay of each answer")
    args = parser.parse_args(argv)
    if not 0 <= args.latency_ms <= 60_000:
        parser.error("--latency-ms must be between 0 and 60000")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    with GatewayServer(latency_ms=args.latency_ms) as server:
        print(f"{LISTENING} {server.url}", flush=True)
        while not stop.wait(1.0):
            pass
    return 0


LISTENING = "bench gateway listening on"

if __name__ == "__main__":
    sys.exit(main())

__all__ = ["LISTENING", "GatewayServer", "main"]
