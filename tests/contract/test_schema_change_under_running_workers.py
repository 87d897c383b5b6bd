"""A migration adds a column to ``agboss_executions`` while workers of this process run
(a rolling deploy, docs/store.md): their verdicts keep committing *and* being read.

The verdict with its release returns the execution's row as ``*``, which PostgreSQL
expands on every call, so the same SQL text returns one more column after the
migration. Two caches held that shape from before it:

- the row classes ``statement_cache._on_the_driver`` reads a row through: keyed by the
  SQL text, every name after the new column pointed one column too early, and the
  caller of a verdict that had committed and released its lease got a ``ValueError``
  (the Celery task reported a failure for a completed, charged execution). Keyed by the
  result's column names, the row is read as the server sent it;
- the statement psycopg had prepared on the server (at its sixth run): PostgreSQL
  refuses it ("cached plan must not change result type") before running it, on every
  later run too. It is deallocated and sent once more: written once, and the
  connection keeps working.

PostgreSQL only: the verdict is one statement there alone, and on SQLite every statement
goes through SQLAlchemy, which reads each result's columns from its own description.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine
from sqlalchemy.pool import NullPool

from celery_agboss.core.executions import ExecutionRecord, ExecutionState
from celery_agboss.store.execution_store import SQLAlchemyExecutionStore
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore
from celery_agboss.store.statement_cache import autocommit_connection
from tests.contract.one_statement_world import TTL_MS, started

pytestmark = pytest.mark.postgres

RUNS = 8
"""More verdicts than psycopg runs a statement before preparing it (5)."""

RESULT = '{"json": "ch_1"}'


@pytest.fixture
def unprepared(executions: SQLAlchemyExecutionStore) -> Iterator[SQLAlchemyExecutionStore]:
    """A worker's store on the same database that prepares no statement: only the row
    classes are cached across the migration."""
    store = SQLAlchemyStore(
        executions.store.engine.url, engine_options={"prepared_statements": False}
    )
    yield SQLAlchemyExecutionStore(store)
    store.close()


@pytest.fixture
def one_connection(executions: SQLAlchemyExecutionStore) -> Iterator[SQLAlchemyExecutionStore]:
    """A worker's store on the same database with one pooled connection, so the verdicts
    run before the migration are prepared on the connection the next one runs on."""
    url = executions.store.engine.url
    store = SQLAlchemyStore(url, engine_options={"pool_size": 1, "max_overflow": 0})
    yield SQLAlchemyExecutionStore(store)
    store.close()


def migrate_from_another_process(engine: Engine) -> None:
    """A migration on a connection of its own (not the worker's: psycopg forgets its
    prepared statements after an ``ALTER`` on its own connection)."""
    other = create_engine(engine.url, poolclass=NullPool)
    with other.begin() as conn:
        conn.execute(text("ALTER TABLE agboss_executions ADD COLUMN added_by_a_migration integer"))
    other.dispose()


def finished(executions: SQLAlchemyExecutionStore, execution_id: str) -> ExecutionRecord:
    lease = started(executions, execution_id)
    record = executions.finish_and_release(lease, TTL_MS, RESULT, frozenset())
    assert record is not None, "the plain end is one statement on PostgreSQL"
    return record


def assert_committed_as_read(executions: SQLAlchemyExecutionStore, record: ExecutionRecord) -> None:
    """The record the verdict returned is the row it committed, its lease released once
    (read in autocommit: a rollback would make psycopg deallocate every statement the
    connection prepared)."""
    assert record.state is ExecutionState.COMPLETED
    assert record.result == RESULT and isinstance(record.read_at_ms, int)
    assert record.terminal_at_ms == record.updated_at_ms == record.read_at_ms
    with autocommit_connection(executions.store.engine) as conn:
        row = conn.execute(
            text(
                "SELECT e.state, e.result, e.updated_at_ms, e.deliveries, l.released "
                "FROM agboss_executions e JOIN agboss_leases l ON l.scope = e.id "
                "WHERE e.id = :id"
            ),
            {"id": record.id},
        ).one()
    assert tuple(row) == ("COMPLETED", RESULT, record.updated_at_ms, 1, True)


def prepared_verdicts(executions: SQLAlchemyExecutionStore) -> int:
    """How many verdict statements the pool's one connection holds prepared."""
    with autocommit_connection(executions.store.engine) as conn:
        return int(
            conn.exec_driver_sql(
                "SELECT count(*) FROM pg_prepared_statements "
                "WHERE statement LIKE '%%agboss_verdict%%'"
            ).scalar_one()
        )


def test_a_verdict_after_a_column_was_added_is_read_by_its_own_columns(
    unprepared: SQLAlchemyExecutionStore,
) -> None:
    for n in range(RUNS):
        assert_committed_as_read(unprepared, finished(unprepared, f"exec-before-{n}"))
    migrate_from_another_process(unprepared.store.engine)
    record = finished(unprepared, "exec-after")
    assert record.id == "exec-after"
    assert_committed_as_read(unprepared, record)


def test_a_verdict_prepared_before_the_migration_is_sent_again_and_written_once(
    one_connection: SQLAlchemyExecutionStore,
) -> None:
    for n in range(RUNS):
        finished(one_connection, f"exec-before-{n}")
    assert prepared_verdicts(one_connection) == 1, "the verdict was not prepared: vacuous"
    migrate_from_another_process(one_connection.store.engine)
    record = finished(one_connection, "exec-after")
    assert record.id == "exec-after"
    assert_committed_as_read(one_connection, record)
    assert prepared_verdicts(one_connection) == 0  # the refused statement was dropped
    for n in range(RUNS):  # the connection keeps working, and prepares the verdict anew
        assert_committed_as_read(one_connection, finished(one_connection, f"exec-later-{n}"))
    assert prepared_verdicts(one_connection) == 1
