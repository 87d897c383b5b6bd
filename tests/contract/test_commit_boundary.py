"""The fence is checked again at the commit boundary (design: P1, P2).

A fenced transaction extends its lease when it begins and once more right before
COMMIT: a long effect keeps its lease after it commits (the renewer skipped the
locked row meanwhile), and a transaction that outlived its lease on the database
clock commits nothing. ``COMMIT`` (or ``END``, ``ROLLBACK``, ``BEGIN``) sent as SQL text
by code inside a store transaction would end it behind SQLAlchemy's back, without that
check: the store refuses it as it refuses ``Connection.commit()``; savepoints work.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import event, text

from celery_agboss.core.protections import (
    ENGINE_COMMIT_CHECK_SKIPPED_PAST_ITS_BOUND,
    FENCE_NOT_RECHECKED_AT_COMMIT,
)
from celery_agboss.core.store_protocol import EffectRecord, Store
from celery_agboss.errors import CommitInsideFencedEffectError, ExecutionFencedError
from celery_agboss.store.migrate import migrate
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore
from celery_agboss.testing import VirtualClock, sabotage
from tests.conftest import TemplateFactory
from tests.contract.conftest import granted
from tests.support.databases import TemplateDatabase
from tests.support.processes import wait_until

TTL_MS = 10_000


@pytest.fixture
def pg_store(
    postgres_templates: TemplateFactory, clone_postgres: Callable[[TemplateDatabase], str]
) -> Iterator[SQLAlchemyStore]:
    """A store on PostgreSQL, on the real database clock (no test offset)."""
    opened = SQLAlchemyStore(clone_postgres(postgres_templates("store", migrate)))
    yield opened
    opened.close()


def _effect(scope: str, token: int) -> EffectRecord:
    return EffectRecord(
        key=f"{scope}:effect",
        execution_id=scope,
        name="test.effect",
        result={"ok": True},
        token=token,
        created_at_ms=0,
    )


def _write_past_the_lease(
    store: Store, db_clock: VirtualClock, scope: str, *, release: bool = False
) -> None:
    """A holder's fenced write (ending its lease at commit if ``release``, as a
    delivery's verdict does) whose transaction outlives the lease before its COMMIT."""
    grant = granted(store, scope, TTL_MS)
    with store.fenced(grant.lease, TTL_MS) as tx:
        tx.insert_effect(_effect(scope, grant.lease.token))
        if release:
            tx.release_at_commit()
        db_clock.advance(TTL_MS * 1.1 / 1000)


def test_a_long_fenced_transaction_keeps_its_lease_after_it_commits(
    store: Store, db_clock: VirtualClock
) -> None:
    grant = granted(store, "long", TTL_MS)
    with store.fenced(grant.lease, TTL_MS) as tx:
        tx.insert_effect(_effect("long", grant.lease.token))
        db_clock.advance(TTL_MS * 0.9 / 1000)
    state = store.read_lease("long")
    assert state is not None and state.live
    assert state.expires_at_ms - state.db_now_ms > TTL_MS * 0.9
    assert store.read_effect("long:effect") is not None


def test_a_fenced_transaction_that_outlived_its_lease_commits_nothing(
    store: Store, db_clock: VirtualClock
) -> None:
    with pytest.raises(ExecutionFencedError):
        _write_past_the_lease(store, db_clock, "late")
    assert store.read_effect("late:effect") is None


def test_without_the_commit_check_a_transaction_past_its_lease_commits(
    store: Store, db_clock: VirtualClock
) -> None:
    """Sabotage twin: the write of a holder past its lease goes in."""
    with sabotage(FENCE_NOT_RECHECKED_AT_COMMIT):
        _write_past_the_lease(store, db_clock, "late")
    assert store.read_effect("late:effect") is not None


# --- a transaction that ends its lease (a delivery's verdict and release) -------------------


def test_a_fenced_transaction_can_end_by_releasing_its_lease(store: Store) -> None:
    grant = granted(store, "done", TTL_MS)
    with store.fenced(grant.lease, TTL_MS) as tx:
        tx.insert_effect(_effect("done", grant.lease.token))
        tx.release_at_commit()
    state = store.read_lease("done")
    assert state is not None and state.released and not state.live
    assert store.read_effect("done:effect") is not None
    assert store.acquire_lease("done", "holder-b", TTL_MS) is not None  # free at once


def test_a_releasing_transaction_that_outlived_its_lease_commits_nothing(
    store: Store, db_clock: VirtualClock
) -> None:
    """The release stands for the commit-time extension: an outlived holder writes
    nothing, and a take-over that happened meanwhile is not released by it."""
    with pytest.raises(ExecutionFencedError):
        _write_past_the_lease(store, db_clock, "late-end", release=True)
    assert store.read_effect("late-end:effect") is None
    state = store.read_lease("late-end")
    assert state is not None and not state.released


def test_without_the_commit_check_a_releasing_transaction_past_its_lease_commits(
    store: Store, db_clock: VirtualClock
) -> None:
    """Sabotage twin of the one above."""
    with sabotage(FENCE_NOT_RECHECKED_AT_COMMIT):
        _write_past_the_lease(store, db_clock, "late-end", release=True)
    assert store.read_effect("late-end:effect") is not None


# --- an engine-only transaction (a claim, a settle): no user code runs in it ---------------


def test_an_engine_only_transaction_past_its_lease_on_the_database_clock_commits_nothing(
    store: Store, db_clock: VirtualClock
) -> None:
    """A moved database clock is checked at the commit, as for any fenced transaction."""
    grant = granted(store, "engine-late", TTL_MS)
    fenced = store.fenced(grant.lease, TTL_MS, engine_only=True)
    with pytest.raises(ExecutionFencedError), fenced as tx:
        tx.insert_effect(_effect("engine-late", grant.lease.token))
        db_clock.advance(TTL_MS * 1.1 / 1000)
    assert store.read_effect("engine-late:effect") is None


SHORT_TTL_MS = 800


def _engine_write_outliving_its_lease(store: SQLAlchemyStore) -> None:
    """An engine-only fenced write whose transaction stays open, in real time, until the
    database clock has passed the expiry its first statement set. It polls the clock
    through its own connection: a session idle that long is ended by the server."""
    grant = granted(store, "engine-slow", SHORT_TTL_MS)
    with store.fenced(grant.lease, SHORT_TTL_MS, engine_only=True) as tx:
        tx.insert_effect(_effect("engine-slow", grant.lease.token))
        wait_until(
            lambda: tx.read_now_ms() > tx.expires_at_ms,
            timeout=10,
            interval=0.02,
            message="the database clock passes the expiry",
        )


@pytest.mark.postgres
def test_an_engine_only_transaction_that_ran_past_its_bound_is_checked_at_commit(
    pg_store: SQLAlchemyStore,
) -> None:
    """On PostgreSQL an engine-only transaction commits on its first lease check only
    when it ended within a quarter of the TTL; one that ran longer (here past the lease
    itself, in real time) is checked again, and commits nothing."""
    with pytest.raises(ExecutionFencedError):
        _engine_write_outliving_its_lease(pg_store)
    assert pg_store.read_effect("engine-slow:effect") is None


@pytest.mark.postgres
def test_without_the_bound_an_engine_only_transaction_past_its_lease_commits(
    pg_store: SQLAlchemyStore,
) -> None:
    """Sabotage twin: skipped however long it ran, the commit check lets the write in."""
    with sabotage(ENGINE_COMMIT_CHECK_SKIPPED_PAST_ITS_BOUND):
        _engine_write_outliving_its_lease(pg_store)
    assert pg_store.read_effect("engine-slow:effect") is not None


@pytest.mark.postgres
def test_a_short_engine_only_transaction_checks_its_lease_once(
    pg_store: SQLAlchemyStore,
) -> None:
    """The round trip it saves: one statement touches the lease row, not two (a fenced
    transaction running user code still checks it at both ends)."""
    seen: list[str] = []

    def note(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if "agboss_leases" in statement:
            seen.append(statement)

    grant = granted(pg_store, "engine-short", TTL_MS)
    event.listen(pg_store.engine, "before_cursor_execute", note)
    try:
        with pg_store.fenced(grant.lease, TTL_MS, engine_only=True) as tx:
            tx.insert_effect(_effect("engine-short", grant.lease.token))
        engine_only = len(seen)
        seen.clear()
        with pg_store.fenced(grant.lease, TTL_MS) as tx:
            tx.insert_effect(_effect("engine-short-2", grant.lease.token))
        with_user_code = len(seen)
    finally:
        event.remove(pg_store.engine, "before_cursor_execute", note)
    assert (engine_only, with_user_code) == (1, 2)
    assert pg_store.read_effect("engine-short:effect") is not None


# --- transaction control sent as SQL text ------------------------------------------------


@pytest.mark.parametrize(
    "statement", ["COMMIT", "  commit;", "END", "ROLLBACK", "BEGIN", "START TRANSACTION"]
)
def test_transaction_control_sent_as_text_inside_a_fenced_transaction_is_refused(
    store: Store, statement: str
) -> None:
    grant = granted(store, "sneaky", TTL_MS)
    with pytest.raises(CommitInsideFencedEffectError), store.fenced(grant.lease, TTL_MS) as tx:
        tx.insert_effect(_effect("sneaky", grant.lease.token))
        tx.connection.exec_driver_sql(statement)
    assert store.read_effect("sneaky:effect") is None


def test_savepoints_sent_as_text_still_work_inside_a_fenced_transaction(store: Store) -> None:
    grant = granted(store, "savepoint", TTL_MS)
    with store.fenced(grant.lease, TTL_MS) as tx:
        tx.connection.execute(text("SAVEPOINT agboss_review"))
        tx.insert_effect(_effect("savepoint", grant.lease.token))
        tx.connection.execute(text("ROLLBACK TO SAVEPOINT agboss_review"))
        tx.connection.execute(text("RELEASE SAVEPOINT agboss_review"))
    assert store.read_effect("savepoint:effect") is None
