"""``migrate`` records this version's retention-rules generation in ``agboss_meta``, on
SQLite and PostgreSQL: what an older sweep reads to know that keep rules it lacks are in
force on its store, with or without a migration between the versions
(design: retention). A higher generation is never lowered (an older ``migrate`` run
during a rollback), and a store from before the row gets this version's."""

from __future__ import annotations

from sqlalchemy import create_engine, text

from celery_agboss.store.databases import create_store_engine
from celery_agboss.store.migrate import RETENTION_GENERATION_KEY, migrate, newer_than_this_code
from celery_agboss.store.retention import RETENTION_RULES_GENERATION
from tests.contract import test_migrations

empty_database_url = test_migrations.empty_database_url


def _generation(url: str) -> str | None:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            found = conn.execute(
                text("SELECT value FROM agboss_meta WHERE key = :key"),
                {"key": RETENTION_GENERATION_KEY},
            )
            value = found.scalar()
    finally:
        engine.dispose()
    return None if value is None else str(value)


def _set(url: str, statement: str, **values: object) -> None:
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text(statement), {"key": RETENTION_GENERATION_KEY, **values})
    finally:
        engine.dispose()


def test_a_new_store_records_this_versions_generation(empty_database_url: str) -> None:
    migrate(empty_database_url)

    assert _generation(empty_database_url) == str(RETENTION_RULES_GENERATION)


def test_a_store_from_before_the_row_gets_this_versions_generation(
    empty_database_url: str,
) -> None:
    migrate(empty_database_url)
    _set(empty_database_url, "DELETE FROM agboss_meta WHERE key = :key")

    migrate(empty_database_url)

    assert _generation(empty_database_url) == str(RETENTION_RULES_GENERATION)


def test_a_higher_generation_is_never_lowered(empty_database_url: str) -> None:
    migrate(empty_database_url)
    higher = RETENTION_RULES_GENERATION + 8  # 10 against 2: compared as numbers, not text
    _set(empty_database_url, "UPDATE agboss_meta SET value = :v WHERE key = :key", v=str(higher))

    migrate(empty_database_url)

    assert _generation(empty_database_url) == str(higher)


def test_an_unreadable_generation_survives_migrate_and_still_stops_retention(
    empty_database_url: str,
) -> None:
    """A value this version cannot read is a newer version's (``retention_generation``):
    an older deploy's ``migrate`` left it lowered to its own on SQLite (a cast gave 0) and
    failed on PostgreSQL, and its sweep then deleted by rules older than the store's."""
    migrate(empty_database_url)
    newer = '{"rules": 3}'  # a format a newer version might write
    _set(empty_database_url, "UPDATE agboss_meta SET value = :v WHERE key = :key", v=newer)

    migrate(empty_database_url)

    assert _generation(empty_database_url) == newer
    engine = create_store_engine(empty_database_url)
    try:
        assert newer_than_this_code(engine) == {
            "reason": "rules-newer",
            "generation": "unreadable",
            "ours": RETENTION_RULES_GENERATION,
        }
    finally:
        engine.dispose()
