"""Engines for the two supported databases, configured the way the store relies on.

SQLite: an absolute path only (a relative one would silently give each worker
its own database), WAL, a generous busy timeout, foreign keys, pysqlite's own
transaction handling switched off so that our ``BEGIN IMMEDIATE`` is what really
runs (design: trap 12), and connections a watchdog can interrupt safely
(``sqlite_watch``). PostgreSQL: psycopg 3, a connection that sat idle in the pool is
pinged before it is handed out (``ping_connections_idle_for``).
"""

from __future__ import annotations

import os
import sqlite3
import time
from typing import Any, Literal

from sqlalchemy import create_engine, event
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, DisconnectionError

from celery_agboss.errors import ConfigurationError
from celery_agboss.store import sqlite_fork
from celery_agboss.store.sqlite_watch import WatchedConnection

SQLITE_BUSY_TIMEOUT_MS = 30_000
"""How long a SQLite writer waits for the single write lock. A fenced transaction holds
it at most a quarter of its lease TTL (``sqlite_watch`` rolls back one that holds it
longer), so a renewal queued behind one or two of them still lands in time; the
generous value is for migrations and other unfenced writers."""

POOL_PING_AFTER_IDLE_SECONDS = 2.0
"""A pooled PostgreSQL connection idle longer than this is pinged before use. SQLAlchemy's
``pool_pre_ping`` pings at every checkout, and on psycopg each ping is a transaction of
its own: as many as the store's (one per transaction the store opens). A connection used
a moment ago is alive or fails its first statement, which the store reports as
``StoreUnavailableError`` (the delivery is retried) and which makes SQLAlchemy throw the
pool's older connections away."""

POSTGRES_CONNECT_TIMEOUT_SECONDS = 10
"""Unless the URL sets ``connect_timeout``: how long opening a connection may take."""

SQLITE_NOW_FUNCTION = "agboss_now_ms"
"""A SQL function registered on every SQLite connection: the host clock in ms, which
on SQLite (one host) is the database clock."""

BEGIN_MODE_OPTION = "agboss_sqlite_begin"
"""Execution option: ``"deferred"`` opens a read-only SQLite transaction that does not
take the write lock; anything else (the default) begins ``IMMEDIATE``."""


def _sqlite_now_ms() -> int:
    return time.time_ns() // 1_000_000


def add_sqlite_clock(dbapi_connection: sqlite3.Connection) -> None:
    """The store's statements read the database clock through ``SQLITE_NOW_FUNCTION``:
    registered on each connection the store opens, and on one it borrows."""
    dbapi_connection.create_function(SQLITE_NOW_FUNCTION, 0, _sqlite_now_ms)


def sqlite_unshared(path: str) -> Literal["in-memory", "relative"] | None:
    """Why every worker process could not open the SQLite database ``path`` as the same
    store (None: they can): the one rule for a store URL and for a Django alias."""
    if path in ("", ":memory:") or path.startswith("file:") or "mode=memory" in path:
        return "in-memory"
    if not os.path.isabs(path):
        return "relative"
    return None


def checked_url(url: str | URL) -> URL:
    """``url`` parsed, refused unless every worker process can share it as the store:
    PostgreSQL, or a SQLite file by an absolute path. The settings check it when read,
    ``normalize_url`` when an engine is made (one rule, one set of messages)."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ConfigurationError(
            f"agboss_database_url {redact_url(str(url))!r} is not a database URL",
            setting="agboss_database_url",
        ) from None
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        path = parsed.database or ""
        query = "&".join(f"{name}={value}" for name, value in parsed.query.items())
        unshared = sqlite_unshared(f"{path}?{query}" if query else path)
        if unshared == "in-memory":
            raise ConfigurationError(
                "agboss_database_url: a SQLite store must be a file every worker process opens; "
                "set an absolute path, e.g. 'sqlite:////var/lib/shop/agboss.db'",
                setting="agboss_database_url",
            )
        if unshared == "relative":
            raise ConfigurationError(
                f"agboss_database_url: the SQLite path {path!r} is relative, so each worker "
                "would open the file under its own working directory; set an absolute path, "
                f"e.g. 'sqlite:///{os.path.abspath(path)}'",
                setting="agboss_database_url",
            )
    elif backend != "postgresql":
        raise ConfigurationError(
            f"agboss_database_url: backend {backend!r} is not supported; use "
            "'postgresql+psycopg://…' or an absolute 'sqlite:////…' path",
            setting="agboss_database_url",
        )
    return parsed


def normalize_url(url: str | URL) -> URL:
    """``checked_url``, PostgreSQL's driver pinned to psycopg 3."""
    parsed = checked_url(url)
    if parsed.get_backend_name() == "sqlite":
        return parsed
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.get_driver_name() != "psycopg":
        raise ConfigurationError(
            "agboss_database_url: PostgreSQL is supported through psycopg 3 only; "
            "use postgresql+psycopg://…",
            setting="agboss_database_url",
        )
    return parsed


def create_store_engine(
    url: str | URL,
    *,
    sqlite_busy_timeout_ms: int = SQLITE_BUSY_TIMEOUT_MS,
    prepared_statements: bool = True,
    **kwargs: Any,
) -> Engine:
    """An engine for ``url`` set up as the store needs (see the module docstring).

    ``prepared_statements=False`` (``agboss_prepared_statements``): psycopg prepares no
    statement on the server, for a pooler that gives each transaction another server
    connection, where a statement prepared on one is missing on the next.
    Pass an engine of your own to ``SQLAlchemyStore`` only if it was made here.
    """
    parsed = normalize_url(url)
    # Our statements join a one-row clock relation (``dialect.clock``) that the
    # cartesian-product linter would flag, although it is the point.
    kwargs.setdefault("enable_from_linting", False)
    if parsed.get_backend_name() == "sqlite":
        return _sqlite_engine(parsed, sqlite_busy_timeout_ms, kwargs)
    connect_args = dict(kwargs.pop("connect_args", {}))
    if "connect_timeout" not in parsed.query:
        # libpq waits forever by default; an unreachable store must become an error.
        connect_args.setdefault("connect_timeout", POSTGRES_CONNECT_TIMEOUT_SECONDS)
    if not prepared_statements:
        connect_args["prepare_threshold"] = None
    if connect_args:
        kwargs["connect_args"] = connect_args
    engine = create_engine(parsed, **kwargs)
    if not kwargs.get("pool_pre_ping"):
        ping_connections_idle_for(engine, POOL_PING_AFTER_IDLE_SECONDS)
    return engine


_CHECKED_IN_AT = "agboss_checked_in_at"


def ping_connections_idle_for(engine: Engine, seconds: float) -> None:
    """Ping a pooled connection before it is handed out only when it sat idle in the pool
    for more than ``seconds`` (or was never used): SQLAlchemy's pessimistic disconnect
    handling, without a round trip (and a transaction) in front of every transaction.
    A dead one is replaced (``DisconnectionError`` makes the pool connect again)."""

    @event.listens_for(engine, "checkin")
    def _checked_in(_dbapi_connection: Any, record: Any) -> None:
        record.info[_CHECKED_IN_AT] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checked_out(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        checked_in_at = record.info.get(_CHECKED_IN_AT)
        if checked_in_at is not None and time.monotonic() - checked_in_at <= seconds:
            return
        try:
            alive = engine.dialect.do_ping(dbapi_connection)
        except Exception as exc:
            raise DisconnectionError(f"a pooled connection failed its ping: {exc}") from exc
        if not alive:
            raise DisconnectionError("a pooled connection failed its ping")


def _sqlite_engine(url: URL, busy_timeout_ms: int, kwargs: dict[str, Any]) -> Engine:
    connect_args = dict(kwargs.pop("connect_args", {}))
    connect_args.setdefault("timeout", busy_timeout_ms / 1000)
    connect_args.setdefault("check_same_thread", False)
    # Every connection can be watched: a long fenced transaction is rolled back
    # (design: lock bound).
    factory = connect_args.setdefault("factory", WatchedConnection)
    if not (isinstance(factory, type) and issubclass(factory, WatchedConnection)):
        raise ConfigurationError(
            "a SQLite connection factory for the store must subclass "
            "celery_agboss.store.sqlite_watch.WatchedConnection"
        )
    engine = create_engine(url, connect_args=connect_args, **kwargs)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: sqlite3.Connection, _record: Any) -> None:
        # Stop pysqlite from emitting BEGIN (and COMMIT before DDL) on its own.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            cursor.execute("PRAGMA journal_mode = WAL")
            cursor.execute("PRAGMA synchronous = FULL")
            cursor.execute("PRAGMA foreign_keys = ON")
        finally:
            cursor.close()
        add_sqlite_clock(dbapi_connection)

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        mode = conn.get_execution_options().get(BEGIN_MODE_OPTION)
        if mode == "deferred":
            conn.exec_driver_sql("BEGIN DEFERRED")
            return
        # A write transaction: no fork of this process while it holds the lock.
        sqlite_fork.GUARD.begin_write(conn.connection.info)
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    @event.listens_for(engine, "checkin")
    def _on_checkin(_dbapi_connection: Any, record: Any) -> None:
        sqlite_fork.GUARD.end_write(record.info)

    @event.listens_for(engine, "invalidate")
    def _on_invalidate(_dbapi_connection: Any, record: Any, _exc: Any) -> None:
        sqlite_fork.GUARD.end_write(record.info)  # a discarded connection writes no more

    return engine


def dispose_after_fork(engine: Engine) -> None:
    """In a forked child: forget the parent's pooled connections without closing them
    (closing would end the parent's sessions; sharing would interleave two processes
    on one socket)."""
    engine.dispose(close=False)


_SECRET_QUERY_WORDS = ("password", "secret", "token")
"""A query key holding one of these (libpq's ``password``, ``sslpassword``) is hidden."""


def redact_url(url: str) -> str:
    """The URL as logs may show it: its password hidden, wherever it is given (libpq also
    takes ``?password=`` and ``?sslpassword=`` in the query string)."""
    try:
        parsed = make_url(url)
        hidden = {
            key: "***"
            for key in parsed.query
            if any(word in key.lower() for word in _SECRET_QUERY_WORDS)
        }
        return parsed.update_query_dict(hidden).render_as_string(hide_password=True)
    except ArgumentError:
        return "<unparseable URL>"
