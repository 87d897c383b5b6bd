"""SQLite fenced transactions may not hold the single write lock past their bound
(design: lock bound).

SQLite has one writer for the whole database and no lock timeout: a fenced
transaction left open (a fenced effect's ``fn`` that sleeps or calls a slow service)
makes every other execution's lease renewal wait behind it until their leases lapse.
So each SQLite fenced transaction is watched, and one that is still open at its
deadline is rolled back from the watchdog's thread.

Rolling back from another thread is the dangerous part: afterwards the connection is
in autocommit mode, so the next statement of the fenced code would commit on its
own, outside the fence, and pysqlite's ``commit()`` would silently do nothing. Hence
``WatchedConnection`` (the connection class of every store engine): while a fenced
transaction is watched, every call into SQLite on its connection runs under the
connection's guard lock and first refuses if the watchdog interrupted the
transaction or the transaction is no longer open. The watchdog takes the same lock
before it rolls back, so no check can race with the rollback. An interrupted
connection is never reused: the store invalidates it.
"""

from __future__ import annotations

import logging
import math
import os
import sqlite3
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any, Literal, TypeVar, cast

from sqlalchemy.engine import Connection

from celery_agboss.core.log_events import (
    STORE_SQLITE_FENCED_TRANSACTION_INTERRUPTED,
    STORE_SQLITE_WATCHDOG_FAILED,
    STORE_SQLITE_WATCHDOG_ROLLBACK_FAILED,
    log_event,
)
from celery_agboss.errors import CommitInsideFencedEffectError, ConfigurationError

T = TypeVar("T")
C = TypeVar("C", bound="WatchedCursor")

INTERRUPT_AGAIN_SECONDS = 0.05
"""While a statement of an overdue transaction still runs, interrupt it again this often:
an ``interrupt()`` that arrives just before the statement starts is a no-op."""


class FencedTransactionInterruptedError(sqlite3.OperationalError):
    """The watchdog rolled this fenced transaction back; every later call on its connection
    raises this (the store turns it into ``StoreLockTimeoutError``)."""


class FencedTransactionEndedError(sqlite3.OperationalError):
    """The fenced transaction is no longer open although nobody committed it: a statement
    run now would commit on its own, outside the fence."""


class FencedWatch:
    """One watched fenced transaction. ``interrupted`` and ``finished`` change under the
    connection's ``agboss_state`` lock, so the watchdog never interrupts a connection
    whose transaction already ended (and which may be serving another one)."""

    __slots__ = ("bound_ms", "conn", "deadline", "finished", "interrupted", "ttl_ms")

    def __init__(self, conn: WatchedConnection, bound_ms: int, ttl_ms: int) -> None:
        self.conn = conn
        self.bound_ms = bound_ms
        self.ttl_ms = ttl_ms
        self.deadline = time.monotonic() + bound_ms / 1000
        self.interrupted = False
        self.finished = False

    def error(self) -> FencedTransactionInterruptedError:
        return FencedTransactionInterruptedError(
            f"the fenced transaction held SQLite's single write lock for more than "
            f"{self.bound_ms} ms (a quarter of its lease TTL of {self.ttl_ms} ms) and was "
            "rolled back, so that other executions' lease renewals could go through; "
            "nothing of it was committed. Keep a fenced effect's fn short: do slow work "
            "(a remote call, a wait, a long computation) outside it, or use PostgreSQL, "
            "where a fenced transaction locks only its own lease row"
        )

    def refuse_if_over(self) -> None:
        """Under the guard lock, before any call into SQLite for this transaction."""
        if self.interrupted:
            raise self.error()
        if not self.conn.in_transaction:
            raise FencedTransactionEndedError(
                "the fenced transaction is no longer open although it was not committed "
                "(SQLite rolls a whole transaction back on ON CONFLICT ROLLBACK, "
                "RAISE(ROLLBACK) or a full disk, and a raw DBAPI rollback ends it too); "
                "nothing of it was committed and nothing more of it may run, since a "
                "statement now would commit on its own, outside the fence"
            )

    def finish(self) -> None:
        """The transaction ended (committed or rolled back): the watchdog leaves it alone."""
        with self.conn.agboss_state:
            self.finished = True

    def interrupt_and_roll_back(self) -> None:
        """The watchdog's side: flag, interrupt a running statement, then roll back under
        the guard lock, which no statement or commit of the transaction holds any more."""
        conn = self.conn
        if not self._interrupt(first=True):
            return
        while not conn.agboss_guard.acquire(timeout=INTERRUPT_AGAIN_SECONDS):
            if not self._interrupt(first=False):
                return
        try:
            with conn.agboss_state:
                if self.finished:
                    return
            try:
                sqlite3.Connection.rollback(conn)
            except sqlite3.Error as exc:  # closed meanwhile: nothing holds the lock then
                log_event(STORE_SQLITE_WATCHDOG_ROLLBACK_FAILED, logging.WARNING, error=str(exc))
            self.finish()
        finally:
            conn.agboss_guard.release()
        log_event(
            STORE_SQLITE_FENCED_TRANSACTION_INTERRUPTED,
            logging.WARNING,
            bound_ms=self.bound_ms,
            ttl_ms=self.ttl_ms,
        )

    def _interrupt(self, *, first: bool) -> bool:
        """False when the transaction already ended. Held under ``agboss_state`` so that
        ``end()`` cannot return (and the connection go back to the pool) in between."""
        with self.conn.agboss_state:
            if self.finished:
                return False
            if first:
                self.interrupted = True
            try:
                self.conn.interrupt()
            except sqlite3.Error:  # closed meanwhile
                return False
            return True

    def end(self) -> bool:
        """The transaction's thread is done with it: detach; True when it was interrupted
        (then the connection must be invalidated, never reused)."""
        with self.conn.agboss_state:
            self.finished = True
            interrupted = self.interrupted
        self.conn.agboss_watch = None
        return interrupted


class WatchedConnection(sqlite3.Connection):
    """The pysqlite connection of every store engine: free when no fenced transaction is
    watched on it, guarded (see the module docstring) while one is."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.agboss_guard = threading.RLock()
        """Held around every call into SQLite while watched, and by the watchdog's rollback."""
        self.agboss_state = threading.Lock()
        self.agboss_watch: FencedWatch | None = None

    def guarded(self, call: Callable[..., T], *args: Any) -> T:
        watch = self.agboss_watch
        if watch is None:
            return call(*args)
        with self.agboss_guard:
            watch.refuse_if_over()
            try:
                return call(*args)
            except sqlite3.Error as exc:
                if watch.interrupted:  # the statement was interrupted by the watchdog
                    raise watch.error() from exc
                raise

    def cursor(self, factory: Any = None) -> Any:
        if factory is None:
            factory = WatchedCursor
        elif self.agboss_watch is not None and not (
            isinstance(factory, type) and issubclass(factory, WatchedCursor)
        ):
            raise sqlite3.ProgrammingError(
                "a watched fenced transaction's connection hands out its own cursors only"
            )
        return super().cursor(factory)

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        # pysqlite's own shortcut would use an unguarded cursor.
        cursor: WatchedCursor = self.cursor()
        return cursor.execute(sql, parameters)

    def executemany(self, sql: str, parameters: Iterable[Any], /) -> sqlite3.Cursor:
        cursor: WatchedCursor = self.cursor()
        return cursor.executemany(sql, parameters)

    if sys.version_info >= (3, 11):

        def blobopen(self, *args: Any, **kwargs: Any) -> sqlite3.Blob:
            opened: sqlite3.Blob = self.guarded(
                lambda: super(WatchedConnection, self).blobopen(*args, **kwargs)
            )
            return opened

    def executescript(self, sql_script: str, /) -> sqlite3.Cursor:
        if self.agboss_watch is not None:
            raise CommitInsideFencedEffectError(
                "executescript() commits the open transaction before it runs: refused "
                "inside a fenced transaction (run the statements one by one)"
            )
        return super().executescript(sql_script)

    def commit(self) -> None:
        watch = self.agboss_watch
        if watch is None:
            super().commit()
            return
        with self.agboss_guard:
            # Also refuses when no transaction is open: pysqlite's commit() would then do
            # nothing, and a rolled-back transaction would look committed.
            watch.refuse_if_over()
            try:
                super().commit()
            except sqlite3.Error as exc:
                if watch.interrupted:
                    raise watch.error() from exc
                raise
            watch.finish()

    def rollback(self) -> None:
        watch = self.agboss_watch
        if watch is None:
            super().rollback()
            return
        with self.agboss_guard:
            super().rollback()
            watch.finish()

    def close(self) -> None:
        with self.agboss_guard:
            super().close()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
        /,
    ) -> Literal[False]:
        if self.agboss_watch is None:
            return super().__exit__(exc_type, exc, traceback)
        # pysqlite's own __exit__ would bypass the guarded commit and rollback.
        if exc_type is None:
            self.commit()
        else:
            self.rollback()
        return False


class WatchedCursor(sqlite3.Cursor):
    """A cursor whose every call into SQLite goes through its connection's guard."""

    def _guarded(self, call: Callable[..., T], *args: Any) -> T:
        return cast(WatchedConnection, self.connection).guarded(call, *args)

    def execute(self: C, sql: str, parameters: Any = (), /) -> C:
        return self._guarded(super().execute, sql, parameters)

    def executemany(self: C, sql: str, parameters: Iterable[Any], /) -> C:
        return self._guarded(super().executemany, sql, parameters)

    def executescript(self: C, sql_script: str, /) -> C:
        if cast(WatchedConnection, self.connection).agboss_watch is not None:
            raise CommitInsideFencedEffectError(
                "executescript() commits the open transaction before it runs: refused "
                "inside a fenced transaction (run the statements one by one)"
            )
        super().executescript(sql_script)
        return self

    def fetchone(self) -> Any:
        return self._guarded(super().fetchone)

    def fetchmany(self, size: int | None = 1) -> list[Any]:
        return self._guarded(super().fetchmany, size)

    def fetchall(self) -> list[Any]:
        return self._guarded(super().fetchall)

    def __next__(self) -> Any:
        return self._guarded(super().__next__)

    def close(self) -> None:
        conn = cast(WatchedConnection, self.connection)
        if conn.agboss_watch is None:
            super().close()
            return
        with conn.agboss_guard:
            super().close()


class FencedTransactionWatchdog:
    """One thread per store that rolls back SQLite fenced transactions open past their bound.

    ``watch``/``unwatch`` are a lock and a set operation each (fenced transactions are the
    hot path); the thread sleeps until the earliest deadline and is woken only when a new
    one comes first. A forked child starts with no watches and no thread.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._watches: set[FencedWatch] = set()
        self._sleeping_until = math.inf
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._pid = os.getpid()
        _live_watchdogs.add(self)

    def watch(self, conn: Connection, *, bound_ms: int, ttl_ms: int) -> FencedWatch:
        """Watch the transaction just begun on ``conn`` (its BEGIN IMMEDIATE returned)."""
        raw = conn.connection.driver_connection
        if not isinstance(raw, WatchedConnection):
            raise ConfigurationError(
                "this SQLite engine was not made by create_store_engine (its connections "
                "are not WatchedConnection), so long fenced transactions cannot be "
                "interrupted; pass a URL or an engine from create_store_engine"
            )
        watch = FencedWatch(raw, bound_ms, ttl_ms)
        raw.agboss_watch = watch
        with self._lock:
            self._reset_if_forked()
            self._watches.add(watch)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="agboss-sqlite-watchdog", daemon=True
                )
                self._thread.start()
            elif watch.deadline < self._sleeping_until:
                self._wake.notify()
        return watch

    def unwatch(self, watch: FencedWatch) -> bool:
        """Done with ``watch``; True when the watchdog interrupted it (invalidate the
        connection)."""
        interrupted = watch.end()
        with self._lock:
            self._watches.discard(watch)
        return interrupted

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread (``SQLAlchemyStore.close``); a later ``watch`` starts a new one."""
        with self._lock:
            self._stopping = True
            self._wake.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        with self._lock:
            self._stopping = False
            if self._thread is thread:
                self._thread = None

    def _run(self) -> None:
        while True:
            with self._lock:
                if self._stopping or self._pid != os.getpid():
                    return
                now = time.monotonic()
                due = [watch for watch in self._watches if watch.deadline <= now]
                if not due:
                    self._sleeping_until = min(
                        (watch.deadline for watch in self._watches), default=math.inf
                    )
                    wait = self._sleeping_until - now
                    self._wake.wait(None if math.isinf(wait) else wait)
                    self._sleeping_until = -math.inf  # awake: nobody needs to wake us
                    continue
                self._watches.difference_update(due)
            for watch in due:
                try:
                    watch.interrupt_and_roll_back()
                except Exception:  # the watchdog must outlive any one bad connection
                    log_event(STORE_SQLITE_WATCHDOG_FAILED, logging.ERROR, exc_info=True)

    def _reset_if_forked(self) -> None:
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._watches.clear()
            self._thread = None
            self._stopping = False
            self._sleeping_until = math.inf


_live_watchdogs: weakref.WeakSet[FencedTransactionWatchdog] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """The parent's watches are of connections this child never uses; its locks may be held
    by threads that do not exist here."""
    for watchdog in list(_live_watchdogs):
        watchdog._lock = threading.Lock()
        watchdog._wake = threading.Condition(watchdog._lock)
        watchdog._reset_if_forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
