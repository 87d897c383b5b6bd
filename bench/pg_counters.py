"""PostgreSQL's own count of a database's transactions, and what the store keeps on disk.

``pg_stat_database.xact_commit + xact_rollback`` counts every transaction of every
session on one database, whoever opened it: the workers, the publisher, the driver's
own queries (SQLAlchemy's ``pool_pre_ping`` is one autocommit ``SELECT 1`` per
checkout). It is read from a connection to *another* database (the admin one), so
the reading itself is never counted. PostgreSQL 15 flushes a backend's counts
lazily: when it goes idle, but at most once a second, and a backend that flushed less
than a second ago waits for its idle timeout (``PGSTAT_IDLE_INTERVAL``, 10 s, measured
here: 8 to 12 s). So a reading is trusted only ``QUIET_SECONDS`` after the last
activity, and once the counters have stopped moving.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine

QUIET_SECONDS = 12.0
"""Longer than PostgreSQL 15's idle flush timeout of a backend's counters (10 s)."""
STILL_SECONDS = 1.0
"""And the counters must not move for this long at the end (a late flush)."""
POLL_SECONDS = 0.25


@dataclass(frozen=True)
class Reading:
    transactions: int
    settled: bool
    """False when the counters still moved at the deadline (the number is then a guess)."""


class TransactionCounters:
    """Reads the transaction counters of ``database`` over a connection to ``admin_url``."""

    def __init__(self, admin_url: str, database: str) -> None:
        self.database = database
        self._engine: Engine = create_engine(admin_url, isolation_level="AUTOCOMMIT")

    def now(self) -> int:
        with self._engine.connect() as conn:
            conn.execute(text("SELECT pg_stat_clear_snapshot()"))
            value = conn.execute(
                text(
                    "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = :name"
                ),
                {"name": self.database},
            ).scalar_one()
        return int(value)

    def settled(self, idle_since: float, timeout: float = 60.0) -> Reading:
        """The count once every session has had ``QUIET_SECONDS`` to flush since
        ``idle_since`` (``time.monotonic()`` when the last activity ended) or since the
        counters last moved, whichever is later; bounded by ``timeout``."""
        deadline = time.monotonic() + timeout
        value = self.now()
        quiet_from = idle_since
        still_from = time.monotonic()
        while True:
            now = time.monotonic()
            if now - quiet_from >= QUIET_SECONDS and now - still_from >= STILL_SECONDS:
                return Reading(value, settled=True)
            if now >= deadline:
                return Reading(value, settled=False)
            time.sleep(POLL_SECONDS)
            latest = self.now()
            if latest != value:
                value, still_from = latest, time.monotonic()
                if still_from - idle_since >= QUIET_SECONDS:
                    quiet_from = still_from  # not a late flush: new activity, wait again

    def close(self) -> None:
        self._engine.dispose()


@dataclass(frozen=True)
class TableFootprint:
    table: str
    rows: int
    bytes: int
    """``pg_total_relation_size``: the table, its indexes and TOAST."""


def store_footprint(url: str) -> list[TableFootprint]:
    """Rows and bytes of every ``agboss_*`` table of the store at ``url`` (PostgreSQL)."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            names = conn.execute(
                text(
                    "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() "
                    "AND tablename LIKE 'agboss\\_%' ORDER BY tablename"
                )
            ).scalars()
            found = []
            for name in list(names):
                rows = conn.execute(text(f'SELECT count(*) FROM "{name}"')).scalar_one()
                size = conn.execute(
                    text("SELECT pg_total_relation_size(CAST(:name AS regclass))"),
                    {"name": f'"{name}"'},
                ).scalar_one()
                found.append(TableFootprint(str(name), int(rows), int(size)))
            return found
    finally:
        engine.dispose()


__all__ = ["Reading", "TableFootprint", "TransactionCounters", "store_footprint"]
