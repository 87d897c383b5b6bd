"""The migrations that ship in the package produce exactly the declared schema.

Applied to an empty database, ``migrate(url)`` must leave nothing for Alembic's
autogenerate to add, drop or alter against ``celery_agboss.store.metadata`` — the
check procrastinate runs in CI — on SQLite and on PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text

from celery_agboss.core.history import HistoryEvent, next_history_row, verify_history
from celery_agboss.core.store_protocol import INTENT_RECORD, Reliance
from celery_agboss.core.undo_steps import compensation_key
from celery_agboss.store import metadata
from celery_agboss.store.databases import create_store_engine
from celery_agboss.store.migrate import MIGRATIONS_DIR, alembic_config, current_revision, migrate
from celery_agboss.store.shared_records import rely_on_txn
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore
from tests.support import services

VERSION_TABLE = "agboss_alembic_version"


@pytest.fixture(
    params=[
        pytest.param("sqlite", marks=pytest.mark.sqlite),
        pytest.param("postgresql", marks=pytest.mark.postgres),
    ]
)
def empty_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database with no tables at all."""
    backend: str = request.param
    if backend not in services.selected_backends():
        pytest.skip(f"{backend} not in {services.BACKENDS_ENV_VAR}")
    if backend == "sqlite":
        return f"sqlite:///{tmp_path.resolve() / 'empty.db'}"
    url: str = request.getfixturevalue("empty_postgres_url")
    return url


def _diff(url: str) -> list[object]:
    engine = create_store_engine(url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn, opts={"version_table": VERSION_TABLE, "compare_type": True}
            )
            return list(compare_metadata(context, metadata))
    finally:
        engine.dispose()


def _tables(url: str) -> set[str]:
    engine = create_store_engine(url)
    try:
        with engine.connect() as conn:
            return set(inspect(conn).get_table_names())
    finally:
        engine.dispose()


def test_migrations_on_an_empty_database_produce_exactly_the_declared_metadata(
    empty_database_url: str,
) -> None:
    assert _tables(empty_database_url) == set()
    migrate(empty_database_url)
    assert _diff(empty_database_url) == []
    assert _tables(empty_database_url) == {*metadata.tables, VERSION_TABLE}
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert current_revision(empty_database_url) == head


def test_migrating_twice_changes_nothing(empty_database_url: str) -> None:
    migrate(empty_database_url)
    migrate(empty_database_url)
    assert _diff(empty_database_url) == []


def test_every_table_is_prefixed_and_the_migrations_ship_in_the_package() -> None:
    assert metadata.tables, "no tables declared"
    assert all(name.startswith("agboss_") for name in metadata.tables)
    assert (MIGRATIONS_DIR / "env.py").is_file()
    assert list((MIGRATIONS_DIR / "versions").glob("*.py"))


def _upgraded_from(url: str, revision: str, rows: Callable[[Any], None]) -> None:
    """The store at ``revision`` with the ``rows`` its code left, then migrated to head."""
    migrate(url, revision)
    engine = create_store_engine(url)
    try:
        with engine.begin() as conn:
            rows(conn)
    finally:
        engine.dispose()
    migrate(url)


# --- 0006: records several executions share --------------------------------------------

_OLD_KEY = b"migration-tests-pseudonym-key-32b"


def _old_rows(conn: Any) -> None:
    """What the code before 0006 left: A charged order 1 (business-keyed) and completed;
    B replayed it and waits; A's step-keyed charge of order 2 was declined and A's body
    did not go past it (a retry may send it again); C's decline it did go past."""
    now = 1_800_000_000_000
    conn.execute(
        text(
            "INSERT INTO agboss_executions (id, task_name, state, args, kwargs, options, "
            "requested_at_ms, wake_requested, recovery_count, deliveries, cancel_requested, "
            "links_dispatched, redrive_planned, updated_at_ms, terminal_at_ms) VALUES "
            "('exec-a', 'shop.pay', 'COMPLETED', '[]', '{}', '{}', :now, false, 0, 1, false, "
            "false, false, :now, :now), "
            "('exec-b', 'shop.pay', 'WAITING', '[]', '{}', '{}', :now, false, 0, 1, false, "
            "false, false, :now, NULL)"
        ),
        {"now": now},
    )
    insert = text(
        "INSERT INTO agboss_outbound_calls (idempotency_key, execution_id, name, "
        "business_key_handle, fingerprint, request, result, result_stored, status, attempt, "
        "first_attempt_at_ms, completed_at_ms, failure, failure_passed) VALUES (:key, :by, "
        "'shop.charge', :handle, 'f', '{}', 'null', :stored, :status, 1, :now, :done, "
        ":failure, :passed)"
    )
    rows = [
        ("default:b:order%3A1:shop.charge", "exec-a", "h1", True, "COMPLETED", None, False),
        ("default:t:exec-a:shop.charge", "exec-a", None, False, "FAILED", "{}", False),
        ("default:t:exec-c:shop.charge", "exec-c", None, False, "FAILED", "{}", True),
    ]
    for key, by, handle, stored, status, failure, passed in rows:
        conn.execute(
            insert,
            {
                "key": key,
                "by": by,
                "handle": handle,
                "stored": stored,
                "status": status,
                "now": now,
                "done": now if status == "COMPLETED" else None,
                "failure": failure,
                "passed": passed,
            },
        )
    conn.execute(
        text(
            "INSERT INTO agboss_record_uses (kind, record_key, execution_id, used_at_ms) "
            "VALUES ('intent', 'default:b:order%3A1:shop.charge', 'exec-b', :now)"
        ),
        {"now": now},
    )
    first = next_history_row(
        _OLD_KEY,
        None,
        idempotency_key="default:b:order%3A1:shop.charge",
        at_ms=now,
        event=HistoryEvent.CLAIMED,
        from_status=None,
        to_status="PENDING",
        attempt=1,
        holder="h",
        token=1,
        detail={},
    )
    conn.execute(
        text(
            "INSERT INTO agboss_intent_history (idempotency_key, seq, at_ms, event, "
            "from_status, to_status, attempt, holder, token, detail, prev_digest, digest) "
            "VALUES (:k, 1, :at, :event, NULL, 'PENDING', 1, 'h', 1, '{}', NULL, :digest)"
        ),
        {"k": first.idempotency_key, "at": now, "event": first.event, "digest": first.digest},
    )


def test_0006_gives_rows_in_flight_the_meaning_the_old_code_acted_on(
    empty_database_url: str,
) -> None:
    _upgraded_from(empty_database_url, "0005", _old_rows)
    store = SQLAlchemyStore(empty_database_url)
    try:
        shared = store.read_intent("default:b:order%3A1:shop.charge")
        declined = store.read_intent("default:t:exec-a:shop.charge")
        went_past = store.read_intent("default:t:exec-c:shop.charge")
        assert shared is not None and declined is not None and went_past is not None
        assert {shared.sent_by, declined.sent_by} == {"exec-a"}
        assert declined.retry_for == "exec-a", "its creator's retry may still send it"
        assert went_past.retry_for is None, "a decline its body went past is replayed"
        with store.read_transaction() as tx:
            record = tx.read_shared(INTENT_RECORD, shared.idempotency_key)
        assert record is not None and record.reliance == 2
        users = {user.execution_id: user for user in record.users}
        assert users["exec-a"].relied and users["exec-a"].completed_on
        assert users["exec-b"].relied and not users["exec-b"].completed_on
        history = store.read_history(shared.idempotency_key)
        assert verify_history(_OLD_KEY, history).ok
        assert history[0].execution_id is None
    finally:
        store.close()


# --- 0008: steps undone before 0006 --------------------------------------------------------

_REFUNDED = "default:b:order%3A1:shop.charge"
_LONG = "default:b:" + "o" * 190 + ":shop.charge"  # its done mark's key is a digest
_KEPT = "default:b:order%3A2:shop.charge"


def _undone_before_0006(conn: Any) -> None:
    """What the code before 0006 left (and 0006 carried over): A charged orders 1, 2 and a
    long-keyed one (business-keyed), failed, and its undos refunded orders 1 and the long
    one (each a done mark keyed ``<step key>:compensation``); order 2's was not undone."""
    now = 1_800_000_000_000
    conn.execute(
        text(
            "INSERT INTO agboss_executions (id, task_name, state, args, kwargs, options, "
            "requested_at_ms, wake_requested, recovery_count, deliveries, cancel_requested, "
            "links_dispatched, redrive_planned, updated_at_ms, terminal_at_ms) VALUES "
            "('exec-a', 'shop.pay', 'FAILED', '[]', '{}', '{}', :now, false, 0, 1, false, "
            "false, false, :now, :now)"
        ),
        {"now": now},
    )
    insert = text(
        "INSERT INTO agboss_outbound_calls (idempotency_key, execution_id, name, "
        "business_key_handle, fingerprint, request, result, result_stored, status, attempt, "
        "first_attempt_at_ms, completed_at_ms, sent_by, reliance) VALUES (:key, 'exec-a', "
        "'shop.charge', 'handle', 'f', '{}', 'null', true, 'COMPLETED', 1, :now, :now, "
        "'exec-a', 1)"
    )
    for key in (_REFUNDED, _LONG, _KEPT):
        conn.execute(insert, {"key": key, "now": now})
    mark = text(
        "INSERT INTO agboss_fenced_effects (key, execution_id, name, result, token, "
        "created_at_ms, reliance) VALUES (:key, 'exec-a', 'agboss.compensation', 'null', 1, "
        ":at, 0)"
    )
    for key in (_REFUNDED, _LONG):
        conn.execute(mark, {"key": compensation_key(key), "at": now + 5})


def test_0008_marks_a_step_undone_before_0006_so_no_replay_hands_it_out_as_paid(
    empty_database_url: str,
) -> None:
    _upgraded_from(empty_database_url, "0007", _undone_before_0006)
    store = SQLAlchemyStore(empty_database_url)
    try:
        with store.read_transaction() as tx:
            shared = {k: tx.read_shared(INTENT_RECORD, k) for k in (_REFUNDED, _LONG, _KEPT)}
        for key in (_REFUNDED, _LONG):
            record = shared[key]
            assert record is not None and record.undo_by == "exec-a" and record.compensated, key
        kept = shared[_KEPT]
        assert kept is not None and kept.undo_by is None and not kept.compensated
        with store.engine.begin() as conn:  # a second click of order 1 is refused its receipt
            assert rely_on_txn(conn, INTENT_RECORD, _REFUNDED, "exec-b") is Reliance.UNDONE
            assert rely_on_txn(conn, INTENT_RECORD, _KEPT, "exec-b") is Reliance.RELIED
    finally:
        store.close()
