"""A TCP proxy in front of a broker, to cut a worker's connections on purpose.

A worker given ``proxy.url_for(broker_url)`` talks to Redis or RabbitMQ through
it; :meth:`BrokerProxy.cut_all` closes every connection it carries at once (a
network blip, a broker restart, a RabbitMQ channel closed), while new
connections are still accepted, so the worker reconnects as it would in life.
"At once" matters: the connections are closed one after another, so every one of
them first stops forwarding, as a network partition silences them all together.
Otherwise a worker that reacts to the first closed connection could begin a
transaction (kombu's restore of its unacknowledged messages: WATCH, then MULTI)
on a pooled connection the loop closes a moment later, and fail it.
The test process keeps its own direct connection. Every thread is a daemon and
every socket is closed by :meth:`close`.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from urllib.parse import urlsplit

from tests.support.relay import CHUNK, accepted_pairs, close_sockets, loopback_listener, proxied_url


class BrokerProxy:
    """``with BrokerProxy("127.0.0.1", 6379) as proxy: proxy.url_for(url); proxy.cut_all()``."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self._listener = loopback_listener(0.2)
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._silenced: set[socket.socket] = set()  # client sockets of pairs being cut
        self._closing = threading.Event()
        self.accepted = 0
        self.cuts = 0
        self._thread = threading.Thread(target=self._accept, name="broker-proxy", daemon=True)

    @classmethod
    def for_url(cls, url: str) -> BrokerProxy:
        parts = urlsplit(url)
        default = 5672 if parts.scheme.startswith("amqp") else 6379
        return cls(parts.hostname or "127.0.0.1", parts.port or default)

    @property
    def port(self) -> int:
        port: int = self._listener.getsockname()[1]
        return port

    def url_for(self, url: str) -> str:
        """``url`` with its host and port replaced by the proxy's."""
        return proxied_url(url, self.port)

    # --- life cycle ---------------------------------------------------------------------

    def __enter__(self) -> BrokerProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._closing.set()
        self.cut_all()
        with contextlib.suppress(OSError):
            self._listener.close()
        if self._thread.is_alive():
            self._thread.join(5)

    # --- what tests do --------------------------------------------------------------------

    def connections(self) -> int:
        with self._lock:
            return len(self._pairs)

    def cut_all(self) -> int:
        """Close every carried connection now (both ends); how many were cut."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
            self._silenced.update(client for client, _ in pairs)
            self.cuts += 1
        for client, upstream in pairs:
            close_sockets(client, upstream)
        return len(pairs)

    # --- the forwarding -------------------------------------------------------------------

    def _accept(self) -> None:
        for client, upstream in accepted_pairs(self._listener, self.target, self._closing):
            with self._lock:
                self._pairs.append((client, upstream))
                self.accepted += 1
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(
                    target=self._pump,
                    args=(source, sink, client),
                    name="broker-proxy-pump",
                    daemon=True,
                ).start()

    def _pump(self, source: socket.socket, sink: socket.socket, client: socket.socket) -> None:
        try:
            while True:
                data = source.recv(CHUNK)
                if not data or client in self._silenced:
                    break
                sink.sendall(data)
        except OSError:
            pass
        finally:
            close_sockets(source, sink)
            with self._lock:
                self._pairs = [p for p in self._pairs if source not in p]
                self._silenced.discard(client)


__all__ = ["BrokerProxy"]
