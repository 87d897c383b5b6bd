"""The SQLite watchdog's race (design: lock bound): once it rolled a fenced transaction back from
its own thread, nothing more of that transaction may commit.

After a rollback from another thread the connection is in autocommit mode, where the
fenced code's next statement would commit on its own and pysqlite's ``commit()``
would do nothing at all. The first test shows that hazard on a plain connection;
the others show that a watched connection refuses instead, whenever the deadline
falls.
"""

from __future__ import annotations

import contextlib
import os
import random
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Engine

from celery_agboss.errors import StoreLockTimeoutError
from celery_agboss.store.databases import create_store_engine
from celery_agboss.store.migrate import migrate
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore
from celery_agboss.store.sqlite_watch import (
    FencedTransactionEndedError,
    FencedTransactionInterruptedError,
    FencedTransactionWatchdog,
    FencedWatch,
    WatchedConnection,
)
from tests.support.processes import wait_until

pytestmark = pytest.mark.sqlite


@pytest.fixture
def database(tmp_path: Path) -> Path:
    path = tmp_path / "watch.db"
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("CREATE TABLE writes (txn INTEGER NOT NULL, n INTEGER NOT NULL)")
    return path


@pytest.fixture
def engine(database: Path) -> Iterator[Engine]:
    made = create_store_engine(f"sqlite:///{database}")
    yield made
    made.dispose()


@pytest.fixture
def watchdog() -> Iterator[FencedTransactionWatchdog]:
    made = FencedTransactionWatchdog()
    yield made
    made.stop()


def committed_rows(database: Path) -> list[tuple[int, int]]:
    """What another connection sees: only what was committed."""
    with contextlib.closing(sqlite3.connect(database)) as conn:
        rows = conn.execute("SELECT txn, n FROM writes ORDER BY txn, n").fetchall()
    return [(int(txn), int(n)) for txn, n in rows]


def write_lock_is_free(database: Path) -> bool:
    conn = sqlite3.connect(database, timeout=0, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        conn.close()


def driver_error(error: BaseException) -> BaseException | None:
    return error.orig if isinstance(error, sa_exc.DBAPIError) else None


def begin_watched(
    conn: Connection, watchdog: FencedTransactionWatchdog, bound_ms: int
) -> FencedWatch:
    conn.begin()
    return watchdog.watch(conn, bound_ms=bound_ms, ttl_ms=bound_ms * 4)


def begin_watched_with_a_row(
    conn: Connection, watchdog: FencedTransactionWatchdog, bound_ms: int
) -> FencedWatch:
    """A watched transaction that has written row (1, 1): something to commit or lose."""
    watch = begin_watched(conn, watchdog, bound_ms)
    conn.exec_driver_sql("INSERT INTO writes VALUES (1, 1)")
    return watch


def test_a_plain_connection_commits_on_its_own_after_a_rollback_from_another_thread(
    database: Path,
) -> None:
    """The hazard, without the watch: the statement after the foreign rollback commits on
    its own, and the transaction's commit() then succeeds without doing anything."""
    conn = sqlite3.connect(database, isolation_level=None, check_same_thread=False)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO writes VALUES (1, 1)")
        rollback = threading.Thread(target=conn.rollback)
        rollback.start()
        rollback.join(5)
        conn.execute("INSERT INTO writes VALUES (1, 2)")  # autocommit: outside any fence
        conn.commit()  # no error: "committed"
    finally:
        conn.close()
    assert committed_rows(database) == [(1, 2)]


def test_after_the_watchdog_rolled_back_a_statement_raises_and_commits_nothing(
    database: Path, engine: Engine, watchdog: FencedTransactionWatchdog
) -> None:
    with engine.connect() as conn:
        watch = begin_watched_with_a_row(conn, watchdog, bound_ms=100)
        # The fenced code is busy in Python, between statements (no statement to interrupt).
        wait_until(lambda: watch.finished, timeout=5, message="the watchdog's rollback")
        assert watch.interrupted
        assert write_lock_is_free(database), "the rollback did not release the write lock"

        with pytest.raises(sa_exc.OperationalError) as statement:
            conn.exec_driver_sql("INSERT INTO writes VALUES (1, 2)")
        assert isinstance(driver_error(statement.value), FencedTransactionInterruptedError)
        raw = conn.connection.driver_connection
        assert isinstance(raw, WatchedConnection)
        with pytest.raises(FencedTransactionInterruptedError):
            raw.execute("INSERT INTO writes VALUES (1, 3)")  # pysqlite's own shortcut too
        with pytest.raises(sa_exc.OperationalError) as commit:
            conn.commit()  # refused, not a silent no-op
        assert isinstance(driver_error(commit.value), FencedTransactionInterruptedError)
        assert "more than 100 ms" in str(commit.value)
        conn.rollback()
        assert watchdog.unwatch(watch) is True  # the store then invalidates the connection
        conn.invalidate()
    assert committed_rows(database) == []


def test_a_statement_still_running_at_the_deadline_is_interrupted(
    database: Path, engine: Engine, watchdog: FencedTransactionWatchdog
) -> None:
    outcome: list[BaseException] = []

    def long_statement() -> None:
        with engine.connect() as conn:
            watch = begin_watched_with_a_row(conn, watchdog, bound_ms=200)
            try:
                conn.exec_driver_sql(
                    "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r "
                    "LIMIT 2000000000) SELECT count(*) FROM r"
                ).scalar()
            except sa_exc.OperationalError as exc:
                outcome.append(exc)
            conn.rollback()
            watchdog.unwatch(watch)
            conn.invalidate()

    started = time.monotonic()
    thread = threading.Thread(target=long_statement, daemon=True)
    thread.start()
    thread.join(20)
    assert not thread.is_alive(), "the running statement was never interrupted"
    assert time.monotonic() - started < 5
    assert len(outcome) == 1
    assert isinstance(driver_error(outcome[0]), FencedTransactionInterruptedError)
    assert committed_rows(database) == []


def test_a_deadline_that_falls_anywhere_commits_a_transaction_whole_or_not_at_all(
    database: Path, engine: Engine, watchdog: FencedTransactionWatchdog
) -> None:
    """Deadlines of a few ms race every statement and the commit: a transaction that
    reported success committed all its rows; one that raised committed none."""
    rng = random.Random(20261130)
    rows_each = 5
    committed: set[int] = set()
    refused: set[int] = set()
    for txn in range(150):
        bound_ms = rng.randint(1, 8)
        pause = rng.uniform(0, 2 * bound_ms / 1000 / rows_each)
        with engine.connect() as conn:
            watch = begin_watched(conn, watchdog, bound_ms)
            try:
                for n in range(rows_each):
                    conn.exec_driver_sql(f"INSERT INTO writes VALUES ({txn}, {n})")
                    time.sleep(pause)
                conn.commit()
                committed.add(txn)
            except sa_exc.OperationalError as exc:
                assert isinstance(
                    driver_error(exc),
                    (FencedTransactionInterruptedError, FencedTransactionEndedError),
                ), exc
                refused.add(txn)
                conn.rollback()
            if watchdog.unwatch(watch):
                conn.invalidate()
    by_txn: dict[int, int] = {}
    for txn, _ in committed_rows(database):
        by_txn[txn] = by_txn.get(txn, 0) + 1
    partial = {txn: rows for txn, rows in by_txn.items() if rows != rows_each}
    assert not partial, f"transactions committed in part (txn: rows): {partial}"
    assert set(by_txn) == committed, "a refused transaction committed, or a committed one not"
    assert committed and refused, f"no race: {len(committed)} committed, {len(refused)} refused"


def test_the_watchdog_leaves_a_transaction_that_ended_in_time_alone(
    database: Path, engine: Engine, watchdog: FencedTransactionWatchdog
) -> None:
    with engine.connect() as conn:
        watch = begin_watched_with_a_row(conn, watchdog, bound_ms=50)
        conn.commit()
        assert watchdog.unwatch(watch) is False
        time.sleep(0.1)  # past the deadline of the transaction that already ended
        conn.begin()  # the same connection, now unwatched, in a transaction of its own
        conn.exec_driver_sql("INSERT INTO writes VALUES (2, 1)")
        conn.commit()
    assert not watch.interrupted
    assert committed_rows(database) == [(1, 1), (2, 1)]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_interrupts_its_own_long_fenced_transactions(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fork.db'}"
    migrate(url)
    store = SQLAlchemyStore(url)
    try:
        ttl_ms = 400  # bound 100 ms
        grant = store.acquire_lease("forked", "holder", 60_000)
        assert grant is not None
        # The parent's watchdog thread is running. On the long TTL: this transaction's
        # extension must not leave the lease to expire before the child's (a fork on a
        # busy machine can take longer than 400 ms).
        with store.fenced(grant.lease, 60_000):
            pass
        pid = os.fork()
        if pid == 0:  # the child: a fenced transaction that holds the lock too long
            code = 1
            try:
                with store.fenced(grant.lease, ttl_ms) as tx:
                    time.sleep(0.5)
                    tx.read_now_ms()
            except StoreLockTimeoutError:
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        store.close()
