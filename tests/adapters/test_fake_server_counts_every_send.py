"""Count at the gateway, over real HTTP: every money-moving request that reaches a
``FakeGatewayServer`` is one entry of ``FakeGateway.requests``, however it was answered.

Two sends were answered and never counted: a request whose body the server could not
read at all (not JSON, a truncated body, a form that is not UTF-8, an unreadable
``Content-Length``), refused by the HTTP handler before any route saw it; and a charge a
server's own handler answered through ``charge_endpoint`` (as ``tests.integration``'s
``GatewayHTTPServer`` does for ``POST /charge``), which skipped the counting of routes.
"""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import pytest

from celery_agboss.testing.gateway import FakeGateway
from celery_agboss.testing.gateway_server import FakeGatewayServer
from celery_agboss.testing.gateway_types import GatewayRequest, GatewayRequestOutcome
from tests.integration.gateway_http import GatewayHTTPServer

INVALID = GatewayRequestOutcome.INVALID
TIMEOUT = 10.0
NOT_JSON = b'{"amount": 500, "currency": "usd"'  # cut off: no closing brace


@dataclass(frozen=True)
class Answer:
    status: int | None  # None: the connection closed with no answer
    payload: object


def _send(
    url: str,
    method: str,
    path: str,
    body: bytes,
    headers: dict[str, str],
    *,
    length: int | None = None,
) -> Answer:
    """One request on a fresh connection; ``length`` larger than ``body`` sends a body
    cut short (the client's side then closed for writing, as a dying client's is)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=TIMEOUT)
    try:
        conn.putrequest(method, path)
        sent = {"Content-Length": str(len(body) if length is None else length), **headers}
        for name, value in sent.items():
            conn.putheader(name, value)
        conn.endheaders(body)
        if length is not None and length > len(body):
            assert conn.sock is not None
            conn.sock.shutdown(socket.SHUT_WR)
        try:
            response = conn.getresponse()
        except (http.client.RemoteDisconnected, ConnectionResetError):
            return Answer(None, None)
        data = response.read()
        return Answer(response.status, json.loads(data) if data else None)
    finally:
        conn.close()


@pytest.fixture
def servers() -> Iterator[list[FakeGatewayServer]]:
    """Servers a test starts; each stopped after it."""
    made: list[FakeGatewayServer] = []
    try:
        yield made
    finally:
        for server in made:
            server.stop()


def _started(servers: list[FakeGatewayServer], dialect: str | None) -> FakeGatewayServer:
    server = FakeGatewayServer(FakeGateway(), dialect=dialect)
    servers.append(server)
    return server.start()


def _only(gateway: FakeGateway) -> GatewayRequest:
    requests = gateway.requests
    assert len(requests) == 1, requests
    return requests[0]


# (dialect, path, key header, operation): every money-moving route of each dialect
MONEY_PATHS = [
    (None, "/charge", None, "charge"),
    ("stripe", "/v1/payment_intents", "Idempotency-Key", "charge"),
    ("stripe", "/v1/payment_intents/pi_x/capture", "Idempotency-Key", "capture"),
    ("stripe", "/v1/payment_intents/pi_x/cancel", "Idempotency-Key", "void"),
    ("stripe", "/v1/refunds", "Idempotency-Key", "refund"),
    ("checkout", "/payments", "Cko-Idempotency-Key", "charge"),
    ("checkout", "/payments/pay_x/captures", "Cko-Idempotency-Key", "capture"),
    ("checkout", "/payments/pay_x/refunds", "Cko-Idempotency-Key", "refund"),
    ("checkout", "/payments/pay_x/voids", "Cko-Idempotency-Key", "void"),
    ("adyen", "/v72/payments", "Idempotency-Key", "charge"),
    ("adyen", "/v72/payments/PSP1/captures", "Idempotency-Key", "capture"),
    ("adyen", "/v72/payments/PSP1/refunds", "Idempotency-Key", "refund"),
    ("adyen", "/v72/payments/PSP1/cancels", "Idempotency-Key", "void"),
    ("paypal", "/v2/checkout/orders", "PayPal-Request-Id", "charge"),
    ("paypal", "/v2/checkout/orders/O-1/capture", "PayPal-Request-Id", "charge"),
    ("paypal", "/v2/checkout/orders/O-1/authorize", "PayPal-Request-Id", "charge"),
    ("paypal", "/v2/payments/authorizations/A-1/capture", "PayPal-Request-Id", "capture"),
    ("paypal", "/v2/payments/authorizations/A-1/void", "PayPal-Request-Id", "void"),
    ("paypal", "/v2/payments/captures/C-1/refund", "PayPal-Request-Id", "refund"),
]


@pytest.mark.parametrize(("dialect", "path", "key_header", "operation"), MONEY_PATHS)
def test_an_unreadable_body_on_a_money_moving_path_is_one_invalid_request(
    servers: list[FakeGatewayServer],
    dialect: str | None,
    path: str,
    key_header: str | None,
    operation: str,
) -> None:
    server = _started(servers, dialect)
    headers = {"Content-Type": "application/json"}
    if key_header is not None:
        headers[key_header] = "key-garbled"
    answer = _send(server.url, "POST", path, NOT_JSON, headers)
    assert answer.status == 400, answer
    request = _only(server.gateway)
    assert (request.operation, request.outcome, request.answered) == (operation, INVALID, True)
    assert request.idempotency_key == (None if key_header is None else "key-garbled")
    assert request.attempt == 1 and request.object_id is None
    assert server.gateway.payments == []


FORM = "application/x-www-form-urlencoded"
UNREADABLE = {
    "not JSON at all": (b"amount=500&currency=usd", "application/json", None),
    "truncated": (b'{"amount": 5', "application/json", 40),
    "a form that is not UTF-8": (
        b"amount=500&note=\xff\xfe",
        "application/x-www-form-urlencoded",
        None,
    ),
    "no content type, not JSON": (b"\x00\x01garbage", "", None),
}


@pytest.mark.parametrize("how", sorted(UNREADABLE))
def test_each_way_a_body_is_unreadable_counts_once_with_the_key_its_header_gave(
    servers: list[FakeGatewayServer], how: str
) -> None:
    server = _started(servers, "stripe")
    body, kind, length = UNREADABLE[how]
    headers = {"Idempotency-Key": "key-1", **({"Content-Type": kind} if kind else {})}
    answer = _send(server.url, "POST", "/v1/payment_intents", body, headers, length=length)
    assert answer.status == 400, answer
    request = _only(server.gateway)
    assert (request.idempotency_key, request.outcome, request.answered) == ("key-1", INVALID, True)


def test_an_unreadable_content_length_counts_once_with_no_key(
    servers: list[FakeGatewayServer],
) -> None:
    """Nothing of the request past its headers can be read: it still counts."""
    server = _started(servers, None)
    raw = b"POST /charge HTTP/1.1\r\nHost: x\r\nContent-Length: lots\r\n\r\n{}"
    parts = urlsplit(server.url)
    with socket.create_connection((parts.hostname or "", parts.port or 0), TIMEOUT) as sock:
        sock.sendall(raw)
        status_line = sock.makefile("rb").readline()
    assert status_line.split()[1] == b"400", status_line
    request = _only(server.gateway)
    assert (request.idempotency_key, request.outcome, request.answered) == (None, INVALID, True)


def test_a_duplicate_unreadable_send_shows_twice_under_its_key(
    servers: list[FakeGatewayServer],
) -> None:
    server = _started(servers, "checkout")
    headers = {"Content-Type": "application/json", "Cko-Idempotency-Key": "dup"}
    for _ in range(2):  # the user's code sends its garbled request twice
        assert _send(server.url, "POST", "/payments", NOT_JSON, headers).status == 400
    sent = server.gateway.requests_for("dup")
    assert [(r.attempt, r.outcome) for r in sent] == [(1, INVALID), (2, INVALID)]


READS = [
    (None, "GET", "/lookup?key=k"),
    (None, "GET", "/health"),
    ("stripe", "GET", "/v1/payment_intents/pi_x"),
    ("checkout", "GET", "/payments/pay_x"),
    ("paypal", "POST", "/v1/oauth2/token"),
    ("paypal", "GET", "/v2/checkout/orders/O-1"),
    (None, "POST", "/nowhere"),
]


@pytest.mark.parametrize(("dialect", "method", "path"), READS)
def test_an_unreadable_body_on_a_read_is_refused_and_never_counted(
    servers: list[FakeGatewayServer], dialect: str | None, method: str, path: str
) -> None:
    server = _started(servers, dialect)
    headers = {"Content-Type": "application/json", "Idempotency-Key": "read"}
    assert _send(server.url, method, path, NOT_JSON, headers).status == 400
    assert server.gateway.requests == []


# --- charge_endpoint called by a server's own handler ---------------------------------


@pytest.fixture
def integration_server() -> Iterator[GatewayHTTPServer]:
    """The integration suite's server: its handler answers ``POST /charge`` itself, through
    ``charge_endpoint``, never through the route (started at construction)."""
    server = GatewayHTTPServer(FakeGateway())
    try:
        yield server
    finally:
        server.stop()


def _charge(server: FakeGatewayServer, body: dict[str, object]) -> Answer:
    data = json.dumps(body).encode()
    return _send(server.url, "POST", "/charge", data, {"Content-Type": "application/json"})


def test_a_charge_refused_by_charge_endpoint_itself_is_recorded(
    integration_server: GatewayHTTPServer,
) -> None:
    server = integration_server
    answer = _charge(server, {"idempotency_key": "k-amount", "amount": "lots"})
    assert answer.status == 400, answer
    request = _only(server.gateway)
    assert (request.idempotency_key, request.outcome, request.answered) == (
        "k-amount",
        INVALID,
        True,
    )


def test_a_charge_whose_held_answer_timed_out_in_charge_endpoint_is_not_answered(
    integration_server: GatewayHTTPServer,
) -> None:
    server = integration_server
    held = server.hold_next_answer(timeout=0.2)
    answer = _charge(server, {"idempotency_key": "k-held", "amount": 500})
    assert answer.status is None and held.reached, answer
    request = _only(server.gateway)
    assert (request.outcome, request.answered) == (GatewayRequestOutcome.PROCESSED, False)


@pytest.mark.parametrize("through", ["the route", "charge_endpoint"])
def test_a_processed_charge_is_recorded_once_however_it_came_in(
    servers: list[FakeGatewayServer], integration_server: GatewayHTTPServer, through: str
) -> None:
    """The route counts through ``charge_endpoint``, which counts on its own too: one
    entry per send, never two (nor none)."""
    server = _started(servers, None) if through == "the route" else integration_server
    assert _charge(server, {"idempotency_key": "k-ok", "amount": 500}).status == 200
    assert _charge(server, {"idempotency_key": "k-ok", "amount": 500}).status == 200
    outcomes = [r.outcome for r in server.gateway.requests]
    assert outcomes == [GatewayRequestOutcome.PROCESSED, GatewayRequestOutcome.REPLAYED]


def test_an_unreadable_charge_to_a_server_whose_handler_takes_charges_counts_once(
    integration_server: GatewayHTTPServer,
) -> None:
    server = integration_server
    headers = {"Content-Type": "application/json"}
    assert _send(server.url, "POST", "/charge", NOT_JSON, headers).status == 400
    request = _only(server.gateway)
    assert (request.idempotency_key, request.outcome, request.answered) == (None, INVALID, True)
