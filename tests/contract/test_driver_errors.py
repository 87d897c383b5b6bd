"""Driver errors leave the store as store errors, never as psycopg/sqlite3/SQLAlchemy ones.

Above the store, code tells three cases apart and nothing else: the store could not
be reached or the connection broke (``StoreUnavailableError``: re-read, never guess),
a row stayed locked past the lock timeout (``StoreLockTimeoutError``), and the rest.
"""

from __future__ import annotations

import sqlite3
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import exc as sa_exc

from celery_agboss.core.executions import ExecutionMessage
from celery_agboss.core.store_protocol import LeaseRef
from celery_agboss.errors import StoreError, StoreLockTimeoutError, StoreUnavailableError
from celery_agboss.store.databases import create_store_engine
from celery_agboss.store.execution_store import SQLAlchemyExecutionStore
from celery_agboss.store.fences import lock_timeout_ms
from celery_agboss.store.migrate import migrate
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore
from tests.contract.conftest import StoreFactory
from tests.support.databases import TemplateDatabase
from tests.support.services import libpq_url

TemplateFactory = Callable[[str, Callable[[str], None]], TemplateDatabase]
DRIVER_ERRORS = (psycopg.Error, sqlite3.Error, sa_exc.SQLAlchemyError)
TTL_MS = 2_000  # lock timeout ttl/4 = 500 ms on PostgreSQL


def _raises_store_error(expected: type[StoreError], action: Callable[[], object]) -> StoreError:
    with pytest.raises(StoreError) as caught:
        action()
    assert isinstance(caught.value, expected), repr(caught.value)
    assert not isinstance(caught.value, DRIVER_ERRORS)
    return caught.value


def test_a_row_locked_past_the_lock_timeout_raises_store_lock_timeout(
    store_factory: StoreFactory, store_url: str, store_backend: str
) -> None:
    holder_store = store_factory()
    if store_backend == "sqlite":
        # SQLite's lock timeout is the busy timeout: shorten it for this store only.
        engine = create_store_engine(store_url, sqlite_busy_timeout_ms=300)
        waiter = SQLAlchemyStore(engine)
    else:
        engine = None
        waiter = store_factory()
    grant = holder_store.acquire_lease(f"lock:{uuid.uuid4().hex}", uuid.uuid4().hex, 30_000)
    assert grant is not None
    inside, release = threading.Event(), threading.Event()

    def hold() -> None:
        with holder_store.fenced(grant.lease, 30_000):
            inside.set()
            release.wait(20)

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    try:
        assert inside.wait(10)
        started = time.monotonic()

        def wait_for_the_row() -> None:
            with waiter.fenced(grant.lease, TTL_MS):
                pass

        _raises_store_error(StoreLockTimeoutError, wait_for_the_row)
        waited = time.monotonic() - started
        limit = 0.3 if store_backend == "sqlite" else lock_timeout_ms(TTL_MS) / 1000
        assert limit * 0.8 <= waited < limit + 2.0, f"waited {waited:.2f}s for a {limit}s timeout"
        assert lock_timeout_ms(TTL_MS) < TTL_MS / 3
    finally:
        release.set()
        thread.join(10)
        if engine is not None:
            engine.dispose()


@pytest.mark.postgres
def test_a_refused_postgresql_connection_raises_store_unavailable() -> None:
    store = SQLAlchemyStore("postgresql+psycopg://postgres@127.0.0.1:1/test")
    try:
        lease = LeaseRef("nowhere", "holder", 1)
        _raises_store_error(StoreUnavailableError, store.now_ms)
        _raises_store_error(StoreUnavailableError, lambda: store.acquire_lease("s", "h", 1000))
        _raises_store_error(StoreUnavailableError, lambda: store.renew_leases([lease], 1000))

        def fenced() -> None:
            with store.fenced(lease, 1000):
                pass

        _raises_store_error(StoreUnavailableError, fenced)
    finally:
        store.close()


@pytest.mark.sqlite
def test_an_unreachable_sqlite_file_raises_store_unavailable(tmp_path: Path) -> None:
    store = SQLAlchemyStore(f"sqlite:///{tmp_path.resolve() / 'missing-dir' / 'agboss.db'}")
    try:
        _raises_store_error(StoreUnavailableError, store.now_ms)
        _raises_store_error(StoreUnavailableError, lambda: store.acquire_lease("s", "h", 1000))
    finally:
        store.close()


@pytest.fixture
def postgres_store_url(
    postgres_templates: TemplateFactory, clone_postgres: Callable[[TemplateDatabase], str]
) -> str:
    """A migrated store database on PostgreSQL only."""
    return clone_postgres(postgres_templates("store", migrate))


def test_a_server_ending_the_session_mid_transaction_raises_store_unavailable(
    postgres_store_url: str,
) -> None:
    store = SQLAlchemyStore(postgres_store_url)
    try:
        grant = store.acquire_lease(f"kill:{uuid.uuid4().hex}", uuid.uuid4().hex, 30_000)
        assert grant is not None
        lease = grant.lease

        def session_ended_mid_transaction() -> None:
            with store.fenced(lease, 30_000) as tx:
                pid = tx.connection.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
                with psycopg.connect(libpq_url(postgres_store_url), autocommit=True) as admin:
                    admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
                tx.read_effect("anything")

        _raises_store_error(StoreUnavailableError, session_ended_mid_transaction)
        # The pool recovers: the next transaction gets a fresh connection.
        assert store.read_lease(lease.scope) is not None
    finally:
        store.close()


def test_a_server_ending_the_sessions_before_a_one_statement_write_raises_store_unavailable(
    postgres_store_url: str,
) -> None:
    """The one-statement writes go to psycopg's cursor directly: a connection the server
    ended still leaves as ``StoreUnavailableError``, and, as SQLAlchemy does for its own
    statements, the pool then drops every connection older than the failure (a server
    restart ended them all), so the next write gets a fresh one, not the next dead one."""
    store = SQLAlchemyStore(postgres_store_url)
    executions = SQLAlchemyExecutionStore(store)
    try:
        assert executions.record_requested(_message("one-statement-1"))
        with store.engine.connect() as one, store.engine.connect() as two:  # both pooled after
            pids = [c.exec_driver_sql("SELECT pg_backend_pid()").scalar_one() for c in (one, two)]
        with psycopg.connect(libpq_url(postgres_store_url), autocommit=True) as admin:
            for pid in pids:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        _raises_store_error(
            StoreUnavailableError,
            lambda: executions.record_requested(_message("one-statement-2")),
        )
        assert executions.record_requested(_message("one-statement-3"))
        assert executions.read_execution("one-statement-2") is None
    finally:
        store.close()


def test_an_interruption_during_a_one_statement_write_drops_its_connection(
    postgres_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``SystemExit`` (a worker told to stop) raised while a one-statement write is on
    the wire leaves its connection in an unknown state: it goes on as it is, and the
    connection is invalidated, never handed to the next write."""
    store = SQLAlchemyStore(postgres_store_url)
    executions = SQLAlchemyExecutionStore(store)
    try:
        assert executions.record_requested(_message("interrupted-1"))
        with store.engine.connect() as conn:  # the pool's one connection
            pooled = conn.connection.dbapi_connection
        assert pooled is not None and not pooled.closed

        def interrupted(*args: object, **kwargs: object) -> None:
            raise SystemExit("stop")

        monkeypatch.setattr(psycopg.Cursor, "execute", interrupted)
        with pytest.raises(SystemExit):
            executions.record_requested(_message("interrupted-2"))
        monkeypatch.undo()
        assert pooled.closed
        assert executions.record_requested(_message("interrupted-3"))
    finally:
        store.close()


def _message(execution_id: str) -> ExecutionMessage:
    return ExecutionMessage(execution_id, "shop.charge", "[42]", "{}", "{}", None, None)
