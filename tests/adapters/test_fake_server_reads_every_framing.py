"""A ``FakeGatewayServer`` reads a request body however HTTP/1.1 frames it, and counts
once what it cannot read.

A client that streams its body (``Transfer-Encoding: chunked``, no ``Content-Length``)
had it read as empty: the charge was refused for a missing amount, never processed, and a
garbled chunk passed for an empty body. JSON nested deeper than Python's recursion limit
raised out of the handler, and the send was answered by a dropped connection.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from celery_agboss.testing.gateway import FakeGateway
from celery_agboss.testing.gateway_server import FakeGatewayServer
from celery_agboss.testing.gateway_types import GatewayRequest, GatewayRequestOutcome

TIMEOUT = 10.0
INVALID = GatewayRequestOutcome.INVALID


@pytest.fixture
def server() -> Iterator[FakeGatewayServer]:
    """The plain ``/charge`` server (no dialect), stopped after the test."""
    made = FakeGatewayServer(FakeGateway(), dialect=None)
    try:
        yield made.start()
    finally:
        made.stop()


def _exchange(
    server: FakeGatewayServer, head: str, body: bytes, *, hang_up: bool = False
) -> tuple[int, bytes]:
    """Send raw bytes on one connection: the answer's status and body. ``hang_up`` closes
    the client's side for writing once sent, as a client that died mid-body leaves it."""
    parts = urlsplit(server.url)
    with socket.create_connection((parts.hostname or "", parts.port or 0), TIMEOUT) as sock:
        sock.sendall(head.replace("\n", "\r\n").encode() + b"\r\n" + body)
        if hang_up:
            sock.shutdown(socket.SHUT_WR)
        answer = sock.makefile("rb")
        status = int(answer.readline().split()[1])
        length = 0
        while (line := answer.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        return status, answer.read(length)


def _chunked_post(server: FakeGatewayServer, chunks: bytes, extra: str = "") -> int:
    head = (
        "POST /charge HTTP/1.1\nHost: x\nContent-Type: application/json\n"
        f"Transfer-Encoding: chunked\nConnection: close\n{extra}"
    )
    return _exchange(server, head, chunks)[0]


def _in_chunks(data: bytes, size: int) -> bytes:
    pieces = [data[at : at + size] for at in range(0, len(data), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


def _only(gateway: FakeGateway) -> GatewayRequest:
    requests = gateway.requests
    assert len(requests) == 1, requests
    return requests[0]


CHARGE = json.dumps({"idempotency_key": "k-streamed", "amount": 500, "reference": "7"}).encode()


@pytest.mark.parametrize("size", [1, 7, len(CHARGE)])
def test_a_chunked_charge_is_read_and_processed_once(server: FakeGatewayServer, size: int) -> None:
    assert _chunked_post(server, _in_chunks(CHARGE, size)) == 200
    request = _only(server.gateway)
    assert (request.idempotency_key, request.outcome) == (
        "k-streamed",
        GatewayRequestOutcome.PROCESSED,
    )
    assert [seen.reference for seen in server.charges_seen] == ["7"]


def test_chunk_extensions_and_trailers_are_read_past(server: FakeGatewayServer) -> None:
    body = b"%x;note=1\r\n%s\r\n0\r\nX-Trailer: yes\r\n\r\n" % (len(CHARGE), CHARGE)
    assert _chunked_post(server, body) == 200
    assert _only(server.gateway).outcome is GatewayRequestOutcome.PROCESSED


def test_chunked_wins_over_a_content_length(server: FakeGatewayServer) -> None:
    assert _chunked_post(server, _in_chunks(CHARGE, 5), "Content-Length: 3\n") == 200
    assert _only(server.gateway).outcome is GatewayRequestOutcome.PROCESSED


BROKEN = {
    "a size that is not hex": b"zz\r\n{}\r\n0\r\n\r\n",
    "a size with a 0x prefix": b"0x2\r\n{}\r\n0\r\n\r\n",
    "a chunk longer than its size": b"2\r\n{}}\r\n0\r\n\r\n",
    "no last chunk": b"2\r\n{}\r\n",
    "no end after the last chunk": b"2\r\n{}\r\n0\r\n",
    "trailer fields without end": b"0\r\n" + b"X-T: 1\r\n" * 200,
}


@pytest.mark.parametrize("how", sorted(BROKEN))
def test_a_broken_chunked_body_counts_once_as_invalid(server: FakeGatewayServer, how: str) -> None:
    """Refused for its framing (not read as an empty body and refused for a missing
    amount), answered, and recorded once."""
    head = (
        "POST /charge HTTP/1.1\nHost: x\nContent-Type: application/json\n"
        "Transfer-Encoding: chunked\nIdempotency-Key: k\n"
    )
    status, answer = _exchange(server, head, BROKEN[how], hang_up=True)
    assert status == 400 and b"chunk" in answer, answer
    request = _only(server.gateway)
    assert (request.outcome, request.answered) == (INVALID, True)
    assert server.gateway.payments == []


def test_a_transfer_coding_it_cannot_undo_counts_once_as_invalid(
    server: FakeGatewayServer,
) -> None:
    head = "POST /charge HTTP/1.1\nHost: x\nTransfer-Encoding: gzip\nConnection: close\n"
    status, answer = _exchange(server, head, b"", hang_up=True)
    assert status == 400 and b"Transfer-Encoding" in answer, answer
    assert _only(server.gateway).outcome is INVALID


def test_json_nested_too_deep_is_answered_and_counted_once(server: FakeGatewayServer) -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    head = (
        "POST /charge HTTP/1.1\nHost: x\nContent-Type: application/json\n"
        f"Content-Length: {len(deep)}\nConnection: close\n"
    )
    status, body = _exchange(server, head, deep)
    assert status == 400 and b"too deep" in body, body
    assert _only(server.gateway).outcome is INVALID
