"""What the tests' TCP proxies share: a loopback listener, the accept loop that pairs each
client with a fresh upstream connection, closing a pair, and the proxied URL.

Used by the PostgreSQL proxy (tests/support/tcp_proxy.py) and the broker proxy
(tests/integration/broker_proxy.py), which differ only in what they do with the bytes.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit, urlunsplit

CHUNK = 65536
"""How many bytes a pump reads at once."""


def loopback_listener(poll_seconds: float) -> socket.socket:
    """A listening socket on an ephemeral port of 127.0.0.1; ``accept`` times out after
    ``poll_seconds``, so an accept loop sees its stop flag."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=64)
    listener.settimeout(poll_seconds)
    return listener


def accepted_pairs(
    listener: socket.socket,
    upstream: tuple[str, int],
    stopping: threading.Event,
    refuse: Callable[[], bool] = lambda: False,
) -> Iterator[tuple[socket.socket, socket.socket]]:
    """Each accepted client with a new connection to ``upstream``, both blocking, until
    ``stopping`` is set or the listener is closed. A client is closed at once while
    ``refuse()`` says so, or when ``upstream`` cannot be reached (as if it had gone)."""
    while not stopping.is_set():
        try:
            client, _ = listener.accept()
        except TimeoutError:
            continue
        except OSError:
            return
        if refuse():
            client.close()
            continue
        try:
            server = socket.create_connection(upstream, timeout=5)
        except OSError:
            client.close()
            continue
        client.settimeout(None)
        server.settimeout(None)
        yield client, server


def close_sockets(*sockets: socket.socket) -> None:
    """Shut down both directions, then close, each socket; quietly if it is gone already."""
    for sock in sockets:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            sock.close()


def proxied_url(url: str, port: int) -> str:
    """``url`` with its host and port replaced by ``127.0.0.1:port``; the user and
    password, path and query kept."""
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@" if userinfo else ""
    return urlunsplit(parts._replace(netloc=f"{netloc}127.0.0.1:{port}"))
