"""``migrate(url)``: bring a database to the latest celery_agboss schema (Alembic ``head``).

Safe to run from every worker at start-up: idempotent, and concurrent runs are
serialised (SQLite's write lock; a PostgreSQL advisory lock), so the second one
finds the schema already current. Each run tells the revisions where the store stood
when it started (``_REVISION_AT_START``, under that lock): a store that existed
before a revision is one workers of an older version may still be using, whatever
its tables hold at that moment (revision 0007 keeps its tenant). Each run, each sweep
(``newer_than_this_code``) and each Django ``manage.py migrate`` also record this
version's retention-rules generation in ``agboss_meta`` unless a higher one (or one
this version cannot read) is there (``record_retention_generation``): keep rules change
without a migration too, and an older sweep must not delete by its rules on such a store.
Each run also records where the store is as the place of its deployment id, once
(``_record_place``): a copy of the store, migrated elsewhere, is then told it is one.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import select, text
from sqlalchemy.engine import URL, Connection, Engine

from celery_agboss.store.databases import create_store_engine
from celery_agboss.store.driver_errors import translated
from celery_agboss.store.retention import RETENTION_RULES_GENERATION
from celery_agboss.store.schema_executions import meta

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
_ADVISORY_LOCK_KEY = 0x61676_B6F5  # arbitrary, constant: "agbos"
_VERSION_TABLE = "agboss_alembic_version"
_REVISION_AT_START = "agboss.revision_at_start"
"""The key of ``Config.attributes`` under which ``migrate`` tells the revisions the
store's revision when the run began (None: this run creates the store). Absent when
Alembic is run by hand: a revision then judges by what the tables hold."""


RETENTION_GENERATION_KEY = "retention.generation"
"""The ``agboss_meta`` row holding the highest ``RETENTION_RULES_GENERATION`` of any
version that migrated or swept the store."""

GENERATION_WITHOUT_A_ROW = 1
"""The generation of a store no version recorded one for: the rules of the version
before the row existed (it lacked the keep rule of generation 2)."""


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic ``Config`` for our migrations (``connection`` passed through attributes)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def migrate(url: str | URL | Engine, revision: str = "head") -> None:
    """Upgrade the database at ``url`` to ``revision`` (the latest by default)."""
    if isinstance(url, Engine):
        _upgrade(url, revision)
        return
    engine = create_store_engine(url)
    try:
        _upgrade(engine, revision)
    finally:
        engine.dispose()


def _upgrade(engine: Engine, revision: str) -> None:
    with translated(), engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_ADVISORY_LOCK_KEY})")
        config = alembic_config(conn)
        config.attributes[_REVISION_AT_START] = _revision_of(conn)
        command.upgrade(config, revision)
        record_retention_generation(conn)
        _record_place(conn)


def _record_place(conn: Connection) -> None:
    """Where the store is, recorded as its deployment id's place when it has none (the id
    minted just now, or by a version before the row): how a copy is told later
    (``celery_agboss.store.deployment.record_place``). Never moved here: a copy must not
    take the original's place by being migrated."""
    from celery_agboss.store.deployment import record_place

    record_place(conn)


def _revision_of(conn: Connection) -> str | None:
    context = MigrationContext.configure(conn, opts={"version_table": _VERSION_TABLE})
    return context.get_current_revision()


@functools.cache
def _scripts() -> ScriptDirectory:
    """The revisions this version ships (read from disk once per process)."""
    return ScriptDirectory.from_config(alembic_config())


def head_revision() -> str:
    """The latest revision this version of celery_agboss ships (its schema)."""
    head = _scripts().get_current_head()
    if head is None:
        raise RuntimeError(f"no Alembic revision under {MIGRATIONS_DIR}")
    return head


def is_known_revision(revision: str) -> bool:
    """Whether this version ships ``revision``: a store at one it does not know was
    migrated by a newer version of celery_agboss."""
    try:
        return _scripts().get_revision(revision) is not None
    except CommandError:  # Alembic's answer for an id it cannot locate
        return False


def current_revision(url: str | URL | Engine) -> str | None:
    """The revision the database is at, or None when it was never migrated."""
    engine = url if isinstance(url, Engine) else create_store_engine(url)
    try:
        with translated(), engine.connect() as conn:
            return _revision_of(conn)
    finally:
        if engine is not url:
            engine.dispose()


def retention_generation(conn: Connection) -> int | None:
    """The retention-rules generation the store records (``GENERATION_WITHOUT_A_ROW``
    when none); None for a value this version cannot read (then it is not this one's)."""
    return _generation_of(_stored_generation(conn))


def _stored_generation(conn: Connection) -> str | None:
    found = conn.execute(select(meta.c.value).where(meta.c.key == RETENTION_GENERATION_KEY))
    value = found.scalar()
    return None if value is None else str(value)


def _generation_of(value: str | None) -> int | None:
    if value is None:
        return GENERATION_WITHOUT_A_ROW
    try:
        return int(value)
    except ValueError:
        return None


_RECORD_ATTEMPTS = 3
"""Reads and conditional writes before ``record_retention_generation`` gives up: each
failed write means another version wrote the row meanwhile (a higher generation, then
left alone)."""


def record_retention_generation(conn: Connection) -> None:
    """Raise the store's generation to this version's when ``retention_generation`` reads a
    lower one; an unreadable value is a newer version's and stays (a cast in SQL lowered
    it on SQLite and failed the whole ``migrate`` on PostgreSQL). Each write is one
    statement, taken only if the row still holds what was read, so a version recording
    at the same time is never lowered. ``migrate``, the sweep and Django's ``migrate``
    all record through here."""
    for _ in range(_RECORD_ATTEMPTS):
        stored = _stored_generation(conn)
        generation = _generation_of(stored)
        if generation is None or generation >= RETENTION_RULES_GENERATION:
            return
        if _replace_generation(conn, stored):
            return


def record_retention_generation_at(url: str | URL | Engine) -> None:
    """``record_retention_generation`` on the store at ``url`` once it was migrated: what a
    Django ``manage.py migrate`` runs, which upgrades the store only in a migration not
    applied yet (a version raising the generation alone ships none); the deployment id's
    place is recorded there too (``_record_place``)."""
    engine = url if isinstance(url, Engine) else create_store_engine(url)
    try:
        with translated(), engine.begin() as conn:
            if _revision_of(conn) is not None:
                record_retention_generation(conn)
                _record_place(conn)
    finally:
        if engine is not url:
            engine.dispose()


def _replace_generation(conn: Connection, stored: str | None) -> bool:
    """This version's generation in place of ``stored`` (None: no row); False when the row
    no longer holds it."""
    values = {
        "key": RETENTION_GENERATION_KEY,
        "value": str(RETENTION_RULES_GENERATION),
        "now": time.time_ns() // 1_000_000,
        "stored": stored,
    }
    if stored is None:
        statement = (
            "INSERT INTO agboss_meta (key, value, updated_at_ms) VALUES (:key, :value, :now) "
            "ON CONFLICT (key) DO NOTHING"
        )
    else:
        statement = (
            "UPDATE agboss_meta SET value = :value, updated_at_ms = :now "
            "WHERE key = :key AND value = :stored"
        )
    return conn.execute(text(statement), values).rowcount == 1


def newer_than_this_code(engine: Engine) -> dict[str, Any] | None:
    """Why retention of this version must not run on the store at ``engine`` (the fields
    the sweep logs), or None. The store is newer when a newer version migrated it (a
    revision this one does not ship) or recorded a higher retention-rules generation (its
    keep rules changed, migration or not): this version's deletes would lack them. A
    lower generation is raised to this version's here, so an older sweep still running
    stops deleting from then on. One read per sweep, never a delivery's."""
    with translated(), engine.connect() as conn:
        revision = _revision_of(conn)
        if revision is None:
            return None  # never migrated: the steps before this one said so
        if not is_known_revision(revision):
            return {"reason": "store-newer", "revision": revision, "head": head_revision()}
        generation = retention_generation(conn)
    if generation is None or generation > RETENTION_RULES_GENERATION:
        return {
            "reason": "rules-newer",
            "generation": "unreadable" if generation is None else generation,
            "ours": RETENTION_RULES_GENERATION,
        }
    if generation < RETENTION_RULES_GENERATION:
        with translated(), engine.begin() as conn:
            record_retention_generation(conn)
    return None
