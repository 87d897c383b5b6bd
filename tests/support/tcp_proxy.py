"""A TCP proxy in front of PostgreSQL that breaks connections on purpose.

Clients connect to ``proxy.url_for(url)`` instead of ``url``. The proxy can:

- cut every connection it carries, now (:meth:`PostgresProxy.cut_all`);
- act on the next COMMIT a client sends (:meth:`PostgresProxy.arm_commit_fault`):
  ``CommitFault.DROP_ANSWER`` forwards the COMMIT, so the server commits, but
  throws the server's answer away and then closes the connection: the client
  sees an error for a transaction that did commit. ``CommitFault.CUT_BEFORE``
  closes the connection without forwarding the COMMIT: the client sees an
  error for a transaction that did not commit.

To see the COMMIT it reads the PostgreSQL wire protocol in the clear: it answers
the client's SSL and GSSAPI encryption requests with "no" itself, so a client
with the default ``sslmode=prefer`` carries on without TLS (one that requires
TLS cannot use the proxy). A COMMIT is a simple query (``Q``), or the execution
of a parsed statement (``P``, ``B``, ``E``), whose text holds the word COMMIT
outside quotes, or one of the store's one-statement writes, sent in autocommit (its
text names the ``agboss_fence`` it joins): each commits by itself.
"""

from __future__ import annotations

import enum
import re
import socket
import struct
import threading
from collections.abc import Iterator
from urllib.parse import urlsplit

from tests.support.processes import wait_until
from tests.support.relay import CHUNK, accepted_pairs, close_sockets, loopback_listener, proxied_url

_SSL_REQUEST = 80877103
_GSSENC_REQUEST = 80877104
_COMMIT = re.compile(rb"\bcommit\b", re.IGNORECASE)
# The store's one-statement writes (a claim, a settle) commit by themselves: sent in
# autocommit, their text names the fence they join (store/intent_transitions.py).
_ONE_STATEMENT = re.compile(rb"\bagboss_fence\b")
# Quoted text cannot hold a statement: 'literals', "identifiers", $tag$bodies$tag$.
_QUOTED = re.compile(rb"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|\$(\w*)\$.*?\$\1\$", re.DOTALL)
_ANSWER_DEADLINE_SECONDS = 10.0


class CommitFault(enum.Enum):
    DROP_ANSWER = "forward the COMMIT, drop the server's answer, close"
    CUT_BEFORE = "close without forwarding the COMMIT"


class _MessageReader:
    """Splits one direction of a PostgreSQL stream into whole messages."""

    def __init__(self, *, startup: bool) -> None:
        # The client's first messages (startup, SSL request) have no type byte.
        self.startup = startup
        self.buffer = bytearray()

    def feed(self, data: bytes) -> Iterator[bytes]:
        self.buffer += data
        while True:
            header = 4 if self.startup else 5
            if len(self.buffer) < header:
                return
            length_at = 0 if self.startup else 1
            (length,) = struct.unpack_from("!I", self.buffer, length_at)
            size = length_at + length
            if len(self.buffer) < size:
                return
            message = bytes(self.buffer[:size])
            del self.buffer[:size]
            if self.startup and _startup_code(message) not in (_SSL_REQUEST, _GSSENC_REQUEST):
                self.startup = False
            yield message


def _startup_code(message: bytes) -> int:
    code: int = struct.unpack_from("!I", message, 4)[0] if len(message) >= 8 else 0
    return code


def _holds_commit(query: bytes) -> bool:
    unquoted = _QUOTED.sub(b"''", query)
    return _COMMIT.search(unquoted) is not None or _ONE_STATEMENT.search(unquoted) is not None


def _cstrings(body: bytes, count: int) -> list[bytes]:
    """The first ``count`` NUL-terminated strings of a message body."""
    parts = body.split(b"\0", count)
    return parts[:count] if len(parts) > count else [b""] * count


class _CommitDetector:
    """Finds the client message that makes the server run a COMMIT.

    A simple query (``Q``) runs at once. In the extended protocol a COMMIT runs at
    the Execute (``E``) of a portal bound (``B``) to a statement parsed (``P``)
    from COMMIT text, so the statements and portals are followed by name.
    """

    def __init__(self) -> None:
        self.commit_statements: set[bytes] = set()
        self.commit_portals: set[bytes] = set()

    def runs_commit(self, message: bytes) -> bool:
        kind, body = message[:1], message[5:]
        if kind == b"Q":
            return _holds_commit(body.rstrip(b"\0"))
        if kind == b"P":
            name, query = _cstrings(body, 2)
            self._mark(self.commit_statements, name, _holds_commit(query))
        elif kind == b"B":
            portal, statement = _cstrings(body, 2)
            self._mark(self.commit_portals, portal, statement in self.commit_statements)
        elif kind == b"E":
            (portal,) = _cstrings(body, 1)
            return portal in self.commit_portals
        return False

    @staticmethod
    def _mark(names: set[bytes], name: bytes, commit: bool) -> None:
        if commit:
            names.add(name)
        else:
            names.discard(name)


class _Link:
    """One client connection and its upstream connection."""

    def __init__(self, proxy: PostgresProxy, client: socket.socket, server: socket.socket):
        self.proxy = proxy
        self.client = client
        self.server = server
        self.dropping = threading.Event()
        self.closed = threading.Event()
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self.threads = [
            threading.Thread(target=self._client_to_server, daemon=True, name="proxy-c2s"),
            threading.Thread(target=self._server_to_client, daemon=True, name="proxy-s2c"),
        ]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def close(self) -> None:
        with self._lock:
            if self.closed.is_set():
                return
            self.closed.set()
        if self._timer is not None:
            self._timer.cancel()
        close_sockets(self.client, self.server)
        self.proxy._forget(self)

    def _client_to_server(self) -> None:
        reader = _MessageReader(startup=True)
        detector = _CommitDetector()
        try:
            while not self.closed.is_set():
                data = self.client.recv(CHUNK)
                if not data:
                    break
                for message in reader.feed(data):
                    if not self._forward_client_message(reader, detector, message):
                        return
        except OSError:
            pass
        finally:
            self.close()

    def _forward_client_message(
        self, reader: _MessageReader, detector: _CommitDetector, message: bytes
    ) -> bool:
        """Forward one client message; False once the link is closed."""
        if reader.startup and _startup_code(message) in (_SSL_REQUEST, _GSSENC_REQUEST):
            self.client.sendall(b"N")  # "no encryption": the client goes on in the clear
            return True
        if not reader.startup and detector.runs_commit(message):
            fault = self.proxy._take_commit_fault()
            if fault is CommitFault.CUT_BEFORE:
                self.proxy._fault_fired()
                self.close()
                return False
            if fault is CommitFault.DROP_ANSWER:
                self.dropping.set()
                self._timer = threading.Timer(_ANSWER_DEADLINE_SECONDS, self.close)
                self._timer.daemon = True
                self._timer.start()
        self.server.sendall(message)
        return True

    def _server_to_client(self) -> None:
        reader = _MessageReader(startup=False)
        try:
            while not self.closed.is_set():
                data = self.server.recv(CHUNK)
                if not data:
                    break
                messages = list(reader.feed(data))
                if not self.dropping.is_set():
                    self.client.sendall(data)
                    continue
                # The answer to the COMMIT ends with ReadyForQuery: drop it all, then close.
                if any(message[:1] == b"Z" for message in messages):
                    self.close()
                    self.proxy._fault_fired()
                    return
        except OSError:
            pass
        finally:
            self.close()


class PostgresProxy:
    """A threaded TCP proxy on 127.0.0.1 (an ephemeral port) in front of PostgreSQL."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self._listener: socket.socket | None = None
        self._acceptor: threading.Thread | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._links: set[_Link] = set()
        self._all_threads: list[threading.Thread] = []
        self._fault: CommitFault | None = None
        self._fault_times: int | None = 0
        self._faults_fired = 0
        self._rejecting = False

    @classmethod
    def in_front_of(cls, url: str) -> PostgresProxy:
        """A proxy (not started) in front of the server that ``url`` names."""
        parts = urlsplit(url)
        return cls(parts.hostname or "127.0.0.1", parts.port or 5432)

    # -- life cycle ---------------------------------------------------------

    def start(self) -> PostgresProxy:
        self._listener = loopback_listener(0.1)
        self._acceptor = threading.Thread(target=self._accept_loop, daemon=True, name="proxy")
        self._acceptor.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        if self._acceptor is not None:
            self._acceptor.join(timeout)
        if self._listener is not None:
            self._listener.close()
        self.cut_all()
        for thread in self._all_threads:
            thread.join(timeout)

    def __enter__(self) -> PostgresProxy:
        return self if self._listener is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._listener is None:
            raise RuntimeError("the proxy has not been started")
        port: int = self._listener.getsockname()[1]
        return port

    def url_for(self, url: str) -> str:
        """``url`` (SQLAlchemy or libpq form) with its host and port replaced by the proxy's."""
        return proxied_url(url, self.port)

    # -- faults -------------------------------------------------------------

    def cut_all(self) -> int:
        """Close every connection the proxy carries now; returns how many. New ones are accepted."""
        with self._lock:
            links = list(self._links)
        for link in links:
            link.close()
        return len(links)

    def arm_commit_fault(
        self, fault: CommitFault = CommitFault.DROP_ANSWER, *, times: int | None = 1
    ) -> None:
        """Apply ``fault`` to the next ``times`` COMMITs (on any connection); None: to all."""
        with self._lock:
            self._fault = fault
            self._fault_times = times

    def drop_answer_after_commit(self, *, times: int | None = 1) -> None:
        """The next COMMIT reaches the server, its answer never reaches the client."""
        self.arm_commit_fault(CommitFault.DROP_ANSWER, times=times)

    def disarm(self) -> None:
        with self._lock:
            self._fault = None
            self._fault_times = 0

    def reject_new_connections(self, reject: bool = True) -> None:
        """While set, a new client connection is closed as soon as it is accepted."""
        with self._lock:
            self._rejecting = reject

    @property
    def faults_fired(self) -> int:
        """How many commit faults have completed (answer dropped and link closed, or cut)."""
        with self._lock:
            return self._faults_fired

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._links)

    def wait_for_faults(self, count: int = 1, timeout: float = 10.0) -> None:
        wait_until(
            lambda: self.faults_fired >= count,
            timeout,
            message=f"{count} commit fault(s) to fire (fired: {self.faults_fired})",
        )

    # -- internals ----------------------------------------------------------

    def _accept_loop(self) -> None:
        assert self._listener is not None
        for client, server in accepted_pairs(
            self._listener, self.upstream, self._stopping, self._refusing
        ):
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link = _Link(self, client, server)
            with self._lock:
                self._links.add(link)
                self._all_threads = [t for t in self._all_threads if t.is_alive()]
                self._all_threads.extend(link.threads)
            link.start()

    def _refusing(self) -> bool:
        with self._lock:
            return self._rejecting

    def _forget(self, link: _Link) -> None:
        with self._lock:
            self._links.discard(link)

    def _take_commit_fault(self) -> CommitFault | None:
        with self._lock:
            if self._fault is None or self._fault_times == 0:
                return None
            if self._fault_times is not None:
                self._fault_times -= 1
            return self._fault

    def _fault_fired(self) -> None:
        with self._lock:
            self._faults_fired += 1
