"""A fork while a thread of this process holds SQLite's write lock (a prefork worker's
main process renewing a lease as it replaces a killed pool process): the child's own
store can still write.

SQLite keeps a process's view of the file's locks in memory; a child forked inside a
write transaction inherits it, and its new connection waits out its busy timeout for a
lock nobody in it holds. The store's engines make a fork wait for such a transaction
(``celery_agboss.store.sqlite_fork``); the twin (``sqlite-fork-unguarded``) forks in
the middle of it, and the child cannot write.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from sqlalchemy import text

from celery_agboss.core.protections import SQLITE_FORK_UNGUARDED
from celery_agboss.store.databases import create_store_engine
from celery_agboss.testing import sabotage

CHILD_BUSY_TIMEOUT_MS = 3000
HOLD_SECONDS = 0.5


def _child_writes(url: str) -> bool:
    """Fork while another thread is inside a write transaction that it ends 0.5 s later;
    True when the child, with a 3 s busy timeout, wrote a row."""
    engine = create_store_engine(url)
    with engine.begin() as conn:
        conn.execute(text("create table if not exists marks (who text)"))
    inside, release = threading.Event(), threading.Event()

    def writer() -> None:
        with engine.begin() as conn:
            conn.execute(text("insert into marks values ('parent')"))
            inside.set()
            release.wait(10)

    thread = threading.Thread(target=writer)
    thread.start()
    assert inside.wait(10)
    threading.Timer(HOLD_SECONDS, release.set).start()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's outcome is its exit status
        try:
            child = create_store_engine(url, sqlite_busy_timeout_ms=CHILD_BUSY_TIMEOUT_MS)
            with child.begin() as conn:
                conn.execute(text("insert into marks values ('child')"))
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    release.set()
    thread.join(10)
    engine.dispose()
    return os.waitstatus_to_exitcode(status) == 0


def test_a_child_forked_during_a_write_transaction_can_write(tmp_path: Path) -> None:
    assert _child_writes(f"sqlite:///{tmp_path / 'store.db'}")


def test_a_fork_inside_a_write_transaction_leaves_the_child_locked_out(
    tmp_path: Path,
) -> None:
    with sabotage(SQLITE_FORK_UNGUARDED):
        wrote = _child_writes(f"sqlite:///{tmp_path / 'store.db'}")
    assert not wrote


@pytest.mark.parametrize("rounds", [3])
def test_forks_after_the_transactions_ended_do_not_wait(tmp_path: Path, rounds: int) -> None:
    """Nothing stays marked: a connection back in the pool is no longer writing."""
    from celery_agboss.store import sqlite_fork

    engine = create_store_engine(f"sqlite:///{tmp_path / 'store.db'}")
    for _ in range(rounds):
        with engine.begin() as conn:
            conn.execute(text("create table if not exists t (x int)"))
            conn.execute(text("insert into t values (1)"))
    with engine.connect() as conn:
        conn.execute(text("select count(*) from t")).scalar()
    assert sqlite_fork.GUARD._writing == 0
    engine.dispose()


def test_an_invalidated_connection_is_no_longer_writing(tmp_path: Path) -> None:
    """The store discards a connection the watchdog rolled back: it stops counting."""
    from celery_agboss.store import sqlite_fork

    engine = create_store_engine(f"sqlite:///{tmp_path / 'store.db'}")
    with engine.connect() as conn:
        conn.execute(text("create table t (x int)"))
        conn.invalidate()
    assert sqlite_fork.GUARD._writing == 0
    engine.dispose()
