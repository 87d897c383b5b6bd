"""The few SQL pieces that differ between SQLite and PostgreSQL.

The database clock: PostgreSQL ``clock_timestamp()`` (the time of the statement's
evaluation, not of the transaction's start), SQLite the host clock through a
function registered on each connection. Both get a bound, test-only offset.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import BigInteger, Table, bindparam, cast, extract, func, select, type_coerce
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.selectable import Subquery

from celery_agboss.store.databases import SQLITE_NOW_FUNCTION
from celery_agboss.store.statement_cache import built_once


def is_postgresql(conn: Connection) -> bool:
    return conn.dialect.name == "postgresql"


@built_once
def now_expr(conn: Connection, offset_ms: int) -> ColumnElement[int]:
    """The database clock in integer ms, plus ``offset_ms`` (a bound parameter). Built
    once per dialect and offset: an expression is immutable, and building it is most of
    what a statement that embeds it costs in Python."""
    if is_postgresql(conn):
        base: ColumnElement[Any] = func.floor(extract("epoch", func.clock_timestamp()) * 1000).cast(
            BigInteger
        )
    else:
        base = getattr(func, SQLITE_NOW_FUNCTION)()
    offset = bindparam(None, offset_ms, type_=BigInteger)
    return type_coerce(base + offset, BigInteger)


def insert_or_nothing(conn: Connection, table: Table) -> Any:
    """``INSERT … ON CONFLICT DO NOTHING`` for the connection's dialect."""
    if is_postgresql(conn):
        return postgresql.insert(table).on_conflict_do_nothing()
    return sqlite.insert(table).on_conflict_do_nothing()


def inserted_row(*values: Any) -> Any:
    """The ``SELECT`` of an ``INSERT … SELECT``: its columns' names come from the
    ``INSERT``'s list, so each value gets a two- or three-letter label rather than
    SQLAlchemy's ``anon_N``. A hot-path statement must stay within the 4,096 bytes
    psycopg keeps its parsing for, or it is parsed again on every call."""
    return select(*(value.label(f"v{i}") for i, value in enumerate(values)))


def json_text(conn: Connection, column: ColumnElement[Any], name: str) -> ColumnElement[Any]:
    """The text of the top-level field ``name`` of a JSON text column (NULL when absent).
    Off the hot path only: it parses the column's text on every row it reads."""
    if is_postgresql(conn):
        return func.json_extract_path_text(cast(column, postgresql.JSON), name)
    return func.json_extract(column, f"$.{name}")


CLOCK_ALIAS = "agboss_clock"


@built_once
def clock(conn: Connection, offset_ms: int) -> Subquery:
    """A one-row relation ``(now)``: the database clock read ONCE for a statement.

    ``clock_timestamp()`` (and SQLite's host clock) advance between two evaluations
    in one statement, so a statement that needs "now" twice (``expires = now + ttl``
    and ``acquired = now``, or a guard and a ``SET``) joins this relation instead and
    reads ``clock.c.now`` everywhere: the row it writes is consistent to the ms.
    """
    return select(now_expr(conn, offset_ms).label("now")).subquery(CLOCK_ALIAS)
