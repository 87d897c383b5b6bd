"""A database clock that stands still, for edges that are one millisecond wide.

``VirtualClock`` moves the database clock by an offset, but real time keeps flowing
underneath: between writing ``first_attempt_at`` and the compare-and-set that reads
it, a millisecond may pass, and "one millisecond below the bound" becomes "equal".
This freezes the clock the store's SQL reads, for one store's engine only:

- SQLite: the store's ``agboss_now_ms()`` SQL function is registered again on each
  new connection, returning the frozen value;
- PostgreSQL: a schema holding its own ``clock_timestamp()`` goes first on the
  ``search_path`` of each new connection (``pg_catalog`` explicitly after it), and
  reads the frozen instant from a one-row table.

Test-only and local to the engine suite; the store is never told.
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import event, text
from sqlalchemy.engine import Engine

from celery_agboss.store.databases import SQLITE_NOW_FUNCTION

_SCHEMA = "agboss_frozen_clock"


class FrozenDatabaseClock:
    """Freeze the clock the store's SQL reads (plus the store's test offset, as ever)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.at_ms: int | None = None
        self.postgres = engine.dialect.name == "postgresql"
        if self.postgres:
            with engine.begin() as conn:
                conn.execute(text(f"CREATE SCHEMA IF NOT EXISTS {_SCHEMA}"))
                conn.execute(text(f"CREATE TABLE IF NOT EXISTS {_SCHEMA}.frozen (at_ms bigint)"))
                conn.execute(
                    text(
                        f"CREATE OR REPLACE FUNCTION {_SCHEMA}.clock_timestamp() "
                        "RETURNS timestamptz LANGUAGE sql STABLE AS $$ SELECT COALESCE("
                        f"(SELECT 'epoch'::timestamptz + at_ms * interval '1 millisecond' "
                        f"FROM {_SCHEMA}.frozen LIMIT 1), pg_catalog.clock_timestamp()) $$"
                    )
                )
        event.listen(engine, "connect", self._on_connect)
        engine.dispose()  # connections made from now on carry the hook

    def _on_connect(self, dbapi_connection: Any, _record: Any) -> None:
        if self.postgres:
            cursor = dbapi_connection.cursor()
            cursor.execute(f"SET search_path TO {_SCHEMA}, pg_catalog, public")
            cursor.close()
            dbapi_connection.commit()
        else:
            dbapi_connection.create_function(SQLITE_NOW_FUNCTION, 0, self._sqlite_now)

    def _sqlite_now(self) -> int:
        return self.at_ms if self.at_ms is not None else time.time_ns() // 1_000_000

    def freeze(self, at_ms: int | None = None) -> int:
        """Stop the clock at ``at_ms`` (default: now); returns the frozen instant."""
        value = time.time_ns() // 1_000_000 if at_ms is None else at_ms
        self.at_ms = value
        if self.postgres:
            with self.engine.begin() as conn:
                conn.execute(text(f"DELETE FROM {_SCHEMA}.frozen"))
                conn.execute(
                    text(f"INSERT INTO {_SCHEMA}.frozen (at_ms) VALUES (:v)"), {"v": value}
                )
        return value

    def close(self) -> None:
        event.remove(self.engine, "connect", self._on_connect)
        self.engine.dispose()
