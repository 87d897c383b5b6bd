"""The HTTP side of :class:`~celery_agboss.testing.gateway_server.FakeGatewayServer`: a
request read into a :class:`GatewayCall`, the endpoint's :class:`Reply` written back (or
the connection closed with no answer, for a dropped one).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from io import BufferedIOBase
from typing import Any, ClassVar, Protocol
from urllib.parse import parse_qs, parse_qsl, urlsplit

from celery_agboss.testing.loopback import loopback_peer_pid

PID_HEADER = "X-Worker-Pid"


@dataclass(frozen=True)
class GatewayCall:
    """One HTTP request as an endpoint sees it.

    ``body`` is the JSON object sent, or a form's fields (flat: ``metadata[order]`` stays
    one name; a dialect that needs nesting unfolds it). ``headers`` have lower-case names.
    """

    method: str
    path: str
    query: dict[str, str]
    body: dict[str, Any]
    pid: int | None  # the sender's, from the X-Worker-Pid header
    headers: Mapping[str, str] = field(default_factory=dict)
    params: Mapping[str, str] = field(default_factory=dict)  # the route's {name} segments
    peer_port: int | None = None  # the client's port on 127.0.0.1
    server_port: int | None = None  # the port the request came in on
    # Why the body could not be read (``body`` is then empty): no endpoint is given such a
    # call, the server refuses it (and counts it, on a money-moving route).
    unreadable: str | None = None

    def sender_pid(self) -> int | None:
        """The sender's pid: from ``X-Worker-Pid``, else (an official SDK sends no such
        header) the local process that owns the connection's other end (Linux /proc)."""
        if self.pid is not None or self.peer_port is None or self.server_port is None:
            return self.pid
        return loopback_peer_pid(self.peer_port, self.server_port)

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())


@dataclass(frozen=True)
class Reply:
    """What an endpoint answers; ``drop`` closes the connection without any response."""

    status: int
    payload: Any = None
    drop: bool = False
    headers: Mapping[str, str] = field(default_factory=dict)


class _Owner(Protocol):
    def handle(self, call: GatewayCall) -> Reply: ...


class GatewayHandler(BaseHTTPRequestHandler):
    """One HTTP request served: read into a :class:`GatewayCall`, answered by ``owner``
    (the server, set on the class each server makes)."""

    owner: ClassVar[_Owner]
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the owner reads the records, not a log."""

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def _serve(self, method: str) -> None:
        parts = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(parts.query).items() if v}
        pid_text = self.headers.get(PID_HEADER) or ""
        body, unreadable = self._body()
        pid = int(pid_text) if pid_text.isdigit() else None
        headers = {name.lower(): value for name, value in self.headers.items()}
        peer, ours = int(self.client_address[1]), int(self.connection.getsockname()[1])
        call = GatewayCall(
            method, parts.path, query, body, pid, headers, {}, peer, ours, unreadable
        )
        if unreadable is not None:
            # Straight to the owner: a path a subclass takes itself expects a body.
            self.reply(self.owner.handle(call))
            return
        self.dispatch(call)

    def dispatch(self, call: GatewayCall) -> None:
        """Answer one request whose body was read (a subclass may take some paths itself)."""
        self.reply(self.owner.handle(call))

    def _body(self) -> tuple[dict[str, Any], str | None]:
        """The body, or ``{}`` and why it could not be read. A body whose end is unknown
        (no readable length, cut short, a broken chunk) leaves nothing readable after it:
        the connection closes once answered."""
        raw, unreadable = self._raw_body()
        if unreadable is not None:
            self.close_connection = True
            return {}, unreadable
        if not raw:
            return {}, None
        kind = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if kind == "application/x-www-form-urlencoded":
            try:
                return dict(parse_qsl(raw.decode("utf-8"), keep_blank_values=True)), None
            except ValueError:
                return {}, "not a UTF-8 form"
        try:
            value = json.loads(raw)
        except ValueError:
            return {}, "not JSON"
        except RecursionError:
            return {}, "JSON nested too deep"
        return (value if isinstance(value, dict) else {}), None

    def _raw_body(self) -> tuple[bytes, str | None]:
        """The body's bytes, by ``Transfer-Encoding: chunked`` (which wins over a
        ``Content-Length``, as HTTP/1.1 says) or by ``Content-Length``; with neither, a
        request has no body."""
        codings = self.headers.get("Transfer-Encoding")
        if codings is not None:
            if codings.split(",")[-1].strip().lower() != "chunked":
                return b"", f"unsupported Transfer-Encoding {codings!r}"
            return _read_chunked(self.rfile)
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0:
            return b"", "unreadable Content-Length"
        raw = self.rfile.read(length) if length else b""
        if len(raw) < length:
            return b"", f"body cut short: {len(raw)} of {length} bytes"
        return raw, None

    def reply(self, reply: Reply) -> None:
        if reply.drop:
            self.close_connection = True  # the answer is lost: no response at all
            return
        data = b"" if reply.status == 204 else json.dumps(reply.payload).encode()
        try:
            self.send_response(reply.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            self.close_connection = True  # the caller died (or was killed) meanwhile


MAX_CHUNKED_BODY = 16 * 1024 * 1024  # bytes; a fake gateway's requests are small
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,8}")
_MAX_TRAILERS = 100


def _read_chunked(stream: BufferedIOBase) -> tuple[bytes, str | None]:
    """A chunked body, joined; or why it could not be read (a size that is not hex, a
    chunk cut short or longer than its size, more than :data:`MAX_CHUNKED_BODY`, trailer
    fields with no end)."""
    parts: list[bytes] = []
    total = 0
    while True:
        line = stream.readline(1026)
        digits = line.split(b";")[0].strip()
        if _CHUNK_SIZE.fullmatch(digits) is None:
            return b"", f"unreadable chunk size {line[:40]!r}"
        size = int(digits, 16)
        if total + size > MAX_CHUNKED_BODY:
            return b"", f"chunked body over {MAX_CHUNKED_BODY} bytes"
        if size == 0:
            break
        chunk = stream.read(size + 2)  # the chunk and its CRLF
        if len(chunk) < size + 2 or chunk[size:] != b"\r\n":
            return b"", f"a chunk of {size} bytes does not end there (cut short, or longer)"
        parts.append(chunk[:size])
        total += size
    for _ in range(_MAX_TRAILERS + 1):  # trailer fields, then the empty line that ends it
        trailer = stream.readline(8192)
        if trailer in (b"\r\n", b"\n"):
            return b"".join(parts), None
        if not trailer:
            return b"", "chunked body cut short before its end"
    return b"", f"chunked body with over {_MAX_TRAILERS} trailer fields"


def unreadable_reply(call: GatewayCall) -> Reply:
    """The answer to a request whose body could not be read: nothing in it was looked at."""
    return Reply(400, {"error": "INVALID_REQUEST", "message": call.unreadable or "unreadable"})


__all__ = ["PID_HEADER", "GatewayCall", "GatewayHandler", "Reply", "unreadable_reply"]
