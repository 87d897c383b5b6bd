"""Which celery_agboss step opened each store transaction, counted per process.

The end-to-end benchmark counts every transaction on the run's database from
PostgreSQL's own counters (``bench.pg_counters``); this module says what they were.
A listener on SQLAlchemy's ``begin`` event (installed only inside the benchmark: the
worker app does it when its config names a folder) walks the Python stack at each
``BEGIN``, and at each statement sent outside a SQLAlchemy transaction (a statement
that is its own transaction, on the driver's cursor), and names the transaction by the
innermost celery_agboss function it knows (``KIND_OF_FUNCTION``); a transaction opened
by a function it does not know is counted as ``other:<function>``, never dropped, so a
new transaction in the product shows up by name. Each process writes its counts to
``<folder>/<role>-<pid>.json``: every ``FLUSH_EVERY`` transactions, from a timer while
counts changed, and at exit, so a killed prefork child loses little and an idle
worker's file is current.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

FLUSH_EVERY = 100
FLUSH_INTERVAL_SECONDS = 0.25
PACKAGE = "celery_agboss"


@dataclass(frozen=True)
class Kind:
    name: str
    serves: str
    """The guarantee the transaction is there for (design: guarantees, traps)."""


PUBLISH = Kind("publish record", "trap 9: a message lost before any worker started it is re-sent")
START = Kind("start", "P1: acquire the lease and mark RUNNING in one transaction")
CLAIM = Kind("claim/read intent", "P3: the intent PENDING before the call leaves")
SETTLE = Kind("settle", "P3: the outcome stored, so a replay never sends again")
EFFECT = Kind("fenced effect", "P2: the write commits once, under the lease check")
VERDICT = Kind("verdict", "P4: the execution's terminal state and result stored")
RELEASE = Kind("release", "P1/P5: the lease given back (wake-up checked)")
COMPLETE = Kind(
    "complete + release", "P4 + P1: terminal state, result and lease release in one (+ links)"
)
LINKS = Kind("links recorded", "trap 4: callbacks and chords dispatched once")
RENEWAL = Kind("renewal", "P1: the lease kept alive while the body runs")
SWEEP_WATCH = Kind("sweep watch", "P4: a worker notices that no sweep runs")
HELD = Kind("held messages", "P4: a worker's unstarted payment messages listed, never re-published")
CONNECT = Kind("connection set-up", "none: the dialect's first queries in a process")
PRE_PING = Kind("pool pre-ping", "none: SQLAlchemy pool_pre_ping, an autocommit SELECT 1")

KNOWN_KINDS = (
    PUBLISH,
    START,
    CLAIM,
    SETTLE,
    EFFECT,
    VERDICT,
    RELEASE,
    COMPLETE,
    LINKS,
    RENEWAL,
    SWEEP_WATCH,
    HELD,
    CONNECT,
    PRE_PING,
)
BACKGROUND = frozenset(kind.name for kind in (RENEWAL, SWEEP_WATCH, HELD, CONNECT, PRE_PING))
"""Kinds a process opens on a timer or once, however many tasks it runs: a cost per
process and interval (renewals have their own goal), not per task."""
SERVES = {kind.name: kind.serves for kind in KNOWN_KINDS}

# Function names (``co_name``) of celery_agboss that open one kind of transaction. The
# product changes under the benchmark: a name missing here is reported, not guessed.
KIND_OF_FUNCTION: dict[str, Kind] = {
    "record_published": PUBLISH,
    "on_before_task_publish": PUBLISH,
    "record_requested": PUBLISH,
    "start_delivery": START,
    "_claim_or_read": CLAIM,
    "_claim": CLAIM,
    "claim": CLAIM,
    "read_intent": CLAIM,
    "_settle": SETTLE,
    "settle": SETTLE,
    "settle_result": SETTLE,
    "fenced_effect": EFFECT,
    "verdict": VERDICT,
    "record_verdict": VERDICT,
    "conclude": COMPLETE,
    "release": RELEASE,
    "end_if_open": RELEASE,
    "record_links_dispatched": LINKS,
    "mark_links_dispatched": LINKS,
    "renew_all": RENEWAL,
    "renew": RENEWAL,
    "_renew_once": RENEWAL,
    "sweep_freshness": SWEEP_WATCH,
    "_until_next_tick": SWEEP_WATCH,
    "_tick": SWEEP_WATCH,
    "check_sweep_freshness": SWEEP_WATCH,
    "write_held": HELD,
    "forget_held": HELD,
}

PLUMBING = frozenset(
    {
        "_begin",
        "_run",
        "transaction",
        "fenced",
        "__enter__",
        "__exit__",
        "translated",
        "_fenced_begin",
        "begin",
    }
)
"""Store helpers that every transaction passes through: they name none."""


def classify(frame: FrameType | None) -> str:
    """The kind of the transaction whose ``BEGIN`` runs under ``frame``."""
    first_named: str | None = None
    while frame is not None:
        module = str(frame.f_globals.get("__name__", ""))
        if module == PACKAGE or module.startswith(PACKAGE + "."):
            name = frame.f_code.co_name
            kind = KIND_OF_FUNCTION.get(name)
            if kind is not None:
                return kind.name
            if first_named is None and name not in PLUMBING and not name.startswith("<"):
                first_named = f"{module.removeprefix(PACKAGE + '.')}.{name}"
        frame = frame.f_back
    return f"other:{first_named or 'outside celery_agboss'}"


STACKS_ENV = "AGBOSS_BENCH_TX_STACKS"
"""Set (to anything) to count by the whole celery_agboss stack: how to extend the table."""


def stack_of(frame: FrameType | None) -> str:
    """The celery_agboss functions under ``frame``, innermost first."""
    names: list[str] = []
    while frame is not None:
        module = str(frame.f_globals.get("__name__", ""))
        if module.startswith(PACKAGE):
            names.append(frame.f_code.co_name)
        frame = frame.f_back
    return " < ".join(names)


STATEMENT_MICROSECONDS = "statement_us"
STATEMENTS = "statements"


class TransactionCounter:
    """Counts the ``BEGIN``s of one process on one database, and times its statements
    (``before_cursor_execute`` to ``after_cursor_execute``: a statement sent in autocommit
    includes its commit; a transaction's ``COMMIT`` is not a cursor execute and is not
    timed); written as JSON."""

    def __init__(self, folder: Path, role: str, database: str) -> None:
        self.folder = folder
        self.role = role
        self.database = database
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._counts: Counter[str] = Counter()
        self._timings: Counter[str] = Counter()
        self._started = threading.local()
        self._unflushed = 0
        self._timer: threading.Thread | None = None

    def install(self, target: Any = Engine) -> None:
        """Listen on ``target``: an engine, or the ``Engine`` class (every engine)."""
        event.listen(target, "begin", self._on_begin)
        event.listen(target, "first_connect", self._on_first_connect)
        event.listen(target, "checkout", self._on_checkout)
        event.listen(target, "before_cursor_execute", self._before_statement)
        event.listen(target, "after_cursor_execute", self._after_statement)

    def _before_statement(self, conn: Connection, *args: Any) -> None:
        if conn.engine.url.database != self.database:
            return
        if not conn.in_transaction():
            # A statement that is its own transaction, sent past SQLAlchemy (the store's
            # one-statement writes go to the driver's cursor): no BEGIN event names it.
            self._count(classify(sys._getframe(1)))
        self._started.at = time.perf_counter()

    def _after_statement(self, conn: Connection, *args: Any) -> None:
        started = getattr(self._started, "at", None)
        if started is None or conn.engine.url.database != self.database:
            return
        self._started.at = None
        spent = round((time.perf_counter() - started) * 1_000_000)
        with self._lock:
            self._start_over_if_forked()
            self._timings[STATEMENT_MICROSECONDS] += spent
            self._timings[STATEMENTS] += 1

    def _on_begin(self, conn: Connection) -> None:
        if conn.engine.url.database != self.database:
            return
        frame = sys._getframe(1)
        kind = classify(frame)
        if STACKS_ENV in os.environ:
            kind = f"{kind} <= {stack_of(frame)}"
        self._count(kind)

    def _on_first_connect(self, dbapi_connection: Any, record: Any) -> None:
        # The dialect's start-up queries run outside any BEGIN event: one transaction.
        if self._ours(dbapi_connection):
            self._count(CONNECT.name)

    def _on_checkout(self, dbapi_connection: Any, record: Any, proxy: Any) -> None:
        # With pool_pre_ping the pool has just pinged this connection, in autocommit mode
        # on psycopg: a transaction of its own that no BEGIN event shows.
        pool = getattr(proxy, "_pool", None)
        if getattr(pool, "_pre_ping", False) and self._ours(dbapi_connection):
            self._count(PRE_PING.name)

    def _ours(self, dbapi_connection: Any) -> bool:
        """A psycopg connection to the counted database (SQLite has no such counters)."""
        return getattr(getattr(dbapi_connection, "info", None), "dbname", None) == self.database

    def _count(self, kind: str) -> None:
        with self._lock:
            self._start_over_if_forked()
            self._counts[kind] += 1
            self._unflushed += 1
            due = self._unflushed >= FLUSH_EVERY
            if self._timer is None:
                self._timer = threading.Thread(
                    target=self._flush_while_alive, name="bench-tx-flush", daemon=True
                )
                self._timer.start()
        if due:
            self.flush()

    def _start_over_if_forked(self) -> None:
        """A forked child starts from zero (called under the lock)."""
        if self._pid != os.getpid():
            self._pid, self._counts, self._unflushed = os.getpid(), Counter(), 0
            self._timings = Counter()
            self._timer = None

    def _flush_while_alive(self) -> None:
        pid = os.getpid()
        while self._pid == pid:
            time.sleep(FLUSH_INTERVAL_SECONDS)
            if self._unflushed:
                self.flush()

    def flush(self) -> None:
        """Write this process's counts (atomically: a reader never sees half a file)."""
        with self._lock:
            counts, self._unflushed = dict(self._counts), 0
            timings = dict(self._timings)
            pid = self._pid
        if pid != os.getpid():
            return
        path = self.folder / f"{self.role}-{pid}.json"
        partial = path.with_suffix(".tmp")
        try:
            partial.write_text(
                json.dumps({"role": self.role, "counts": counts, "timings": timings}), "utf-8"
            )
            os.replace(partial, path)
        except OSError:
            pass  # the run is over and its folder gone: nobody reads these counts any more


def read_counts(folder: Path, part: str = "counts") -> dict[str, Counter[str]]:
    """Counts per role (``worker``, ``publisher``), summed over the processes; with
    ``part="timings"``, the statements' count and time (``STATEMENTS``,
    ``STATEMENT_MICROSECONDS``)."""
    totals: dict[str, Counter[str]] = {}
    for path in sorted(folder.glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        totals.setdefault(str(data["role"]), Counter()).update(data.get(part, {}))
    return totals


def difference(after: dict[str, Counter[str]], before: dict[str, Counter[str]]) -> Counter[str]:
    """Transactions per ``role: kind`` between two readings."""
    found: Counter[str] = Counter()
    for role, counts in after.items():
        earlier = before.get(role, Counter())
        for kind, count in counts.items():
            if count - earlier.get(kind, 0):
                found[f"{role}: {kind}"] = count - earlier.get(kind, 0)
    return found


__all__ = [
    "KIND_OF_FUNCTION",
    "KNOWN_KINDS",
    "SERVES",
    "STATEMENTS",
    "STATEMENT_MICROSECONDS",
    "Kind",
    "TransactionCounter",
    "classify",
    "difference",
    "read_counts",
]
