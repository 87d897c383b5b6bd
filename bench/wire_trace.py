"""Round trips to PostgreSQL as the driver sends them: libpq's own trace of the wire.

Counting SQLAlchemy's events would miss what the store sends past Core (driver-level
SQL, psycopg's prepared statements, a pipeline), and a guess is no count. So each of an
engine's pooled connections is traced by libpq (``PQtrace``, psycopg's
``PGconn.trace``) while a window is open, one file per connection, and the files are
read when it closes. An exchange is one wait for the server: it ends with the server's
``ReadyForQuery``, which it sends once per simple ``Query`` and once per ``Sync`` of the
extended protocol, so BEGIN, COMMIT, ROLLBACK, a pool ping, a statement and a separate
``Parse`` of a prepared statement each count one, and a pipeline counts once per Sync.
The status letter of ``ReadyForQuery`` (``I`` idle, ``T`` in a transaction, ``E``
failed) tells an autocommit statement (idle before and after: a transaction of its own)
from one inside BEGIN … COMMIT.

Tracing starts at a connection's checkout inside the window and stops at its first
checkout after it, in the thread that holds the connection (libpq is not thread-safe).
"""

from __future__ import annotations

import os
import re
import threading
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.pool import Pool

MESSAGE = re.compile(r"^([FB])\t\d+\t(\w+)\t?(.*)$")
"""One traced message: direction (F: to the server, B: from it), length, type, fields.
A statement's text may span lines; its other lines match nothing."""
SQL_TEXT = re.compile(r'^\s*(?:"[^"]*"\s+)?"(.*)')
"""The text of a ``Query`` (``"SQL``) or of a ``Parse`` (``"name" "SQL``)."""

KINDS = ("statement", "begin", "commit", "rollback", "ping", "prepare")
"""What an exchange is, by the first message the client sent in it."""


@dataclass
class WireCount:
    """Exchanges (round trips) by kind, and the transactions they made."""

    exchanges: Counter[str] = field(default_factory=Counter)
    autocommit: int = 0
    """Statements sent outside BEGIN … COMMIT: each a transaction of its own."""
    connections: int = 0

    @property
    def round_trips(self) -> int:
        return sum(self.exchanges.values())

    @property
    def transactions(self) -> int:
        """Transactions the exchanges committed or rolled back, pings left out."""
        return self.exchanges["commit"] + self.exchanges["rollback"] + self.autocommit

    def add(self, other: WireCount) -> None:
        self.exchanges.update(other.exchanges)
        self.autocommit += other.autocommit
        self.connections += other.connections


def _kind(first: tuple[str, str] | None, bind_sent: bool) -> str:
    if first is None:
        return "statement"
    kind, fields = first
    found = SQL_TEXT.match(fields)
    sql = (found.group(1) if found else fields).strip().rstrip('"').strip().upper()
    if kind == "Parse" and not bind_sent:
        return "prepare"
    if sql.startswith(("BEGIN", "START TRANSACTION")):
        return "begin"
    if sql.startswith(("COMMIT", "END")):
        return "commit"
    if sql.startswith(("ROLLBACK", "ABORT")):
        return "rollback"
    if sql.rstrip(";") == "SELECT 1":
        return "ping"
    return "statement"


def parse_trace(text: str) -> WireCount:
    """The exchanges of one connection's trace (``PQtrace`` output)."""
    count = WireCount(connections=1)
    first: tuple[str, str] | None = None
    bind_sent = False
    status = "I"  # a connection is traced from its checkout, idle
    for line in text.splitlines():
        found = MESSAGE.match(line)
        if found is None:
            continue
        direction, kind, fields = found.groups()
        if direction == "F":
            if first is None and kind in ("Query", "Parse", "Bind"):
                first = (kind, fields)
            bind_sent = bind_sent or kind == "Bind"
            continue
        if kind != "ReadyForQuery":
            continue
        after = fields.strip()[:1] or "I"
        what = _kind(first, bind_sent)
        count.exchanges[what] += 1
        if what == "statement" and status == "I" and after == "I":
            count.autocommit += 1
        status, first, bind_sent = after, None, False
    return count


class WireTrace:
    """Counts the round trips of every pooled connection to ``database`` (whichever engine
    of this process holds it) between ``start`` and ``stop``; ``close`` stops listening."""

    def __init__(self, database: str, folder: Path) -> None:
        self.database = database
        self.folder = folder
        self._lock = threading.Lock()
        self._window: Path | None = None
        self._traced: dict[int, tuple[Any, int, Path]] = {}
        """id(psycopg connection) → (it, its trace file's descriptor, the window)."""
        self._out: set[int] = set()
        """The traced connections checked out now (in use: only their holder touches them)."""
        # First of the checkout listeners: the store's own ping of an idle connection
        # (a round trip) runs after it, traced.
        event.listen(Pool, "checkout", self._on_checkout, insert=True)
        event.listen(Pool, "checkin", self._on_checkin)

    def close(self) -> None:
        self.stop()
        event.remove(Pool, "checkout", self._on_checkout)
        event.remove(Pool, "checkin", self._on_checkin)

    def _ours(self, dbapi_connection: Any) -> Any:
        """The psycopg connection, when it is one to our database."""
        driver = getattr(dbapi_connection, "driver_connection", dbapi_connection)
        if getattr(driver, "pgconn", None) is None:
            return None  # not psycopg (SQLite: no wire)
        return driver if getattr(driver.info, "dbname", None) == self.database else None

    def _on_checkout(self, dbapi_connection: Any, record: Any, proxy: Any) -> None:
        driver = self._ours(dbapi_connection)
        if driver is None:
            return
        key = id(driver)
        with self._lock:
            window = self._window
            traced = self._traced.pop(key, None)
            if traced is not None and traced[0] is driver and traced[2] == window:
                self._traced[key] = traced
                self._out.add(key)
                return  # traced in this window already
            if window is not None:
                self._out.add(key)
        if traced is not None:
            self._untrace(driver, traced)
        if window is None:
            return
        path = window / f"{uuid.uuid4().hex}.trace"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        driver.pgconn.trace(fd)  # through a FILE libpq never closes: we do, after untrace
        from psycopg import pq

        driver.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
        with self._lock:
            self._traced[key] = (driver, fd, window)

    def _on_checkin(self, dbapi_connection: Any, record: Any) -> None:
        driver = self._ours(dbapi_connection)
        if driver is not None:
            with self._lock:
                self._out.discard(id(driver))

    @staticmethod
    def _untrace(driver: Any, traced: tuple[Any, int, Path]) -> None:
        if traced[0] is driver:
            driver.pgconn.untrace()  # flushes libpq's buffered trace
        os.close(traced[1])

    def start(self) -> None:
        window = self.folder / f"wire-{uuid.uuid4().hex[:8]}"
        window.mkdir(parents=True)
        with self._lock:
            self._window = window

    def stop(self) -> WireCount:
        """What the window's connections exchanged. Each connection in the pool is
        untraced here, which flushes its file; one checked out in another thread (a
        renewal) is untraced at its next checkout, and its last lines may be missed."""
        with self._lock:
            window, self._window = self._window, None
            for key, traced in list(self._traced.items()):
                if key not in self._out:
                    del self._traced[key]
                    self._untrace(traced[0], traced)
        total = WireCount()
        if window is None:
            return total
        for path in sorted(window.glob("*.trace")):
            total.add(parse_trace(path.read_text(encoding="utf-8", errors="replace")))
        return total


__all__ = ["KINDS", "WireCount", "WireTrace", "parse_trace"]
