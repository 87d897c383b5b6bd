"""A stand-in for an OpenTelemetry collector: OTLP over HTTP (protobuf), kept in memory.

The deployment's workers export their spans with the exporter docs/tracing.md installs
(``opentelemetry-exporter-otlp-proto-http``) to ``OTEL_EXPORTER_OTLP_ENDPOINT``; this
server answers ``POST /v1/traces`` as a collector does and keeps each span as a dict:
``name``, ``kind``, ``span_id``, ``parent_id``, ``trace_id``, ``attributes`` and
``events`` (``name``, ``attributes``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def _value(any_value: Any) -> Any:
    which = any_value.WhichOneof("value")
    if which is None:
        return None
    value = getattr(any_value, which)
    if which in ("array_value", "kvlist_value"):
        return str(value)
    return value


def _attributes(key_values: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in key_values}


def _spans(body: bytes) -> list[dict[str, Any]]:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        service = _attributes(resource_spans.resource.attributes).get("service.name")
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    {
                        "service": service,
                        "name": span.name,
                        "kind": int(span.kind),
                        "span_id": span.span_id.hex(),
                        "parent_id": span.parent_span_id.hex(),
                        "trace_id": span.trace_id.hex(),
                        "attributes": _attributes(span.attributes),
                        "events": [
                            {"name": e.name, "attributes": _attributes(e.attributes)}
                            for e in span.events
                        ],
                    }
                )
    return spans


class OtlpReceiver:
    """The spans received so far (a copy), and the URL to export them to."""

    def __init__(self, server: ThreadingHTTPServer) -> None:
        self._server = server
        self._lock = threading.Lock()
        self._received: list[dict[str, Any]] = []

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def spans(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._received)

    def keep(self, spans: list[dict[str, Any]]) -> None:
        with self._lock:
            self._received.extend(spans)


@contextmanager
def otlp_receiver() -> Iterator[OtlpReceiver]:
    """An OTLP/HTTP receiver on a free loopback port, for the block."""
    receiver: OtlpReceiver | None = None

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            if self.path.rstrip("/") == "/v1/traces" and receiver is not None:
                receiver.keep(_spans(body))
                self.send_response(200)
            else:
                self.send_response(404)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            return  # quiet: the test says what it found

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver = OtlpReceiver(server)
    thread = threading.Thread(target=server.serve_forever, name="otlp-receiver", daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
