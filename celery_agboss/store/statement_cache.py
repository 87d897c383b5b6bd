"""Statements of the hot path, built once and run with parameters.

Building a SQLAlchemy Core statement and computing its cache key costs more than
running it on a loopback PostgreSQL (about 1.4 ms against 0.3 ms per statement,
measured on the benchmark machine): the statements every delivery runs are built
once per dialect and clock offset, with ``bindparam`` placeholders for their values,
and reused. While a test has a sabotage switch on, they are built afresh each time,
since a switch can change their shape.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Hashable, Iterator
from typing import Any, TypeVar

from sqlalchemy.engine import Connection, Engine

from celery_agboss.core import sabotage
from celery_agboss.store.driver_errors import translated

S = TypeVar("S")

MAX_SHAPES = 256
"""Per builder: the clock offset is part of the key, and tests move it freely."""


def built_once(builder: Callable[..., S]) -> Callable[..., S]:
    """Cache ``builder(conn, *key)`` by ``(dialect name, *key)``; ``key`` must be hashable."""
    cache: dict[tuple[Hashable, ...], S] = {}
    lock = threading.Lock()

    @functools.wraps(builder)
    def get(conn: Connection, *key: Any) -> S:
        if sabotage.any_active():
            return builder(conn, *key)
        full = (conn.dialect.name, *key)
        found = cache.get(full)
        if found is None:
            found = builder(conn, *key)
            with lock:
                if len(cache) >= MAX_SHAPES:
                    cache.clear()
                cache[full] = found
        return found

    return get


_COMPILED_ATTRIBUTE = "_agboss_driver_sql"


def run_compiled(conn: Connection, statement: Any, parameters: dict[str, Any]) -> Any:
    """Run a statement ``built_once`` gave as its dialect's SQL text, compiled once: the
    hot path's statements skip SQLAlchemy's per-call cache key (walking a statement of
    several CTEs costs about what sending it does). Only for values the driver adapts
    itself (text, integers, booleans, None, lists) and result columns read by name;
    while a test has a protection switched off, it runs as any statement."""
    if sabotage.any_active():
        return conn.execute(statement, parameters)
    compiled = getattr(statement, _COMPILED_ATTRIBUTE, None)
    if compiled is None or compiled[0] != conn.dialect.name:
        done = statement.compile(dialect=conn.dialect)
        if done.positional or done.literal_execute_params or done.post_compile_params:
            raise TypeError("run_compiled takes named parameters rendered at compile time")
        # The statement's own values (a constant, a None it sets); the caller gives the rest.
        defaults = {
            done.bind_names[bind]: bind.effective_value
            for bind in done.binds.values()
            if not bind.required
        }
        compiled = (conn.dialect.name, done.string, defaults)
        setattr(statement, _COMPILED_ATTRIBUTE, compiled)
    values = {**compiled[2], **parameters}
    driver = conn.connection.dbapi_connection
    if conn.dialect.driver != "psycopg" or not getattr(driver, "autocommit", False):
        # Only a statement that is its own transaction skips SQLAlchemy: in a transaction,
        # SQLAlchemy must see the statement that begins it, or it would not commit it.
        return conn.exec_driver_sql(compiled[1], values)
    return _on_the_driver(conn, driver, compiled[1], values)


class DriverRow(tuple[Any, ...]):
    """A row read off the driver, read by column name as a SQLAlchemy row is."""

    _names: dict[str, int] = {}  # each row class holds its own

    def __getattr__(self, name: str) -> Any:
        try:
            return self[self._names[name]]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def _mapping(self) -> dict[str, Any]:
        return {name: self[index] for name, index in self._names.items()}


class DriverResult:
    """What a statement run on the driver returned: ``first()`` and ``one()``, as
    SQLAlchemy's result gives them."""

    def __init__(self, rows: list[DriverRow]) -> None:
        self._rows = rows

    def first(self) -> DriverRow | None:
        return self._rows[0] if self._rows else None

    def one(self) -> DriverRow:
        if len(self._rows) != 1:
            raise LookupError(f"expected one row, the statement returned {len(self._rows)}")
        return self._rows[0]


_ROW_CLASSES: dict[tuple[bytes | None, ...], type[DriverRow]] = {}
"""Keyed by the result's column names as the server sent them, never by the SQL text:
a statement returning ``*`` (the verdict's) is expanded by the server on every call, so
a migration that adds, drops or reorders a column while this process runs (a rolling
deploy) changes its columns under the same text. Reading the names off the result costs
about 2 µs for 28 columns (``cursor.description`` would cost about 25 µs)."""


def _on_the_driver(conn: Connection, driver: Any, sql: str, values: dict[str, Any]) -> DriverResult:
    """``sql`` sent on the connection's psycopg cursor, skipping SQLAlchemy's execution
    context and its result metadata, rebuilt from the cursor's description on every call
    (about a third of the CPU a one-statement write costs the caller, measured on the
    hot path). The engine's cursor events still fire around it (the commit guard, the
    benchmarks' counters, the tests' statement lists), and a driver error is handled as
    SQLAlchemy handles one (a lost connection invalidated, the error wrapped). Rows are
    read by name through a class made once per list of result columns (``_ROW_CLASSES``),
    and a statement prepared before a migration changed its columns is sent again."""
    cursor = driver.cursor()
    try:
        dispatch = conn.dispatch
        statement, parameters = sql, values
        for before in dispatch.before_cursor_execute:
            statement, parameters = before(conn, cursor, statement, parameters, None, False)
        try:
            try:
                cursor.execute(statement, parameters)
            except Exception as error:
                if not _prepared_before_a_migration(error):
                    raise
                # Refused before it ran (nothing written: in autocommit the statement was
                # its own transaction). Every prepared statement is dropped, psycopg's
                # list of them with it, and the statement sent once more, unprepared.
                cursor.execute("DEALLOCATE ALL")
                cursor.execute(statement, parameters)
        except BaseException as error:
            # As SQLAlchemy's own execute does: an interruption (a SystemExit, a timeout
            # raised into the thread) leaves the connection mid-statement, so it is
            # invalidated, never pooled again; the error goes on, wrapped or as it is.
            conn._handle_dbapi_exception(error, statement, parameters, cursor, None)
            raise  # pragma: no cover - the handler raises
        for after in dispatch.after_cursor_execute:
            after(conn, cursor, statement, parameters, None, False)
        rows = cursor.fetchall() if cursor.pgresult is not None and cursor.pgresult.nfields else []
        if not rows:
            return DriverResult([])
        result = cursor.pgresult
        shape = tuple(map(result.fname, range(result.nfields)))
        row_class = _ROW_CLASSES.get(shape)
        if row_class is None:
            names = {column.name: index for index, column in enumerate(cursor.description or ())}
            row_class = type("DriverRow", (DriverRow,), {"_names": names})
            if len(_ROW_CLASSES) >= MAX_SHAPES:
                _ROW_CLASSES.clear()
            _ROW_CLASSES[shape] = row_class
        return DriverResult([row_class(row) for row in rows])
    finally:
        cursor.close()


def _prepared_before_a_migration(error: Exception) -> bool:
    """PostgreSQL refusing a statement this connection prepared (psycopg prepares one at
    its sixth run) because its result's columns changed since: a migration another
    process ran added, dropped or retyped a column a ``*`` returns (the verdict's). The
    server checks this while it binds the statement, before running any of it, and
    refuses it on every later run too, until the statement is deallocated."""
    if getattr(error, "sqlstate", None) != "0A000":  # feature_not_supported
        return False
    where = getattr(getattr(error, "diag", None), "source_function", None)
    return where == "RevalidateCachedQuery" or "cached plan must not change" in str(error)


@contextlib.contextmanager
def autocommit_connection(engine: Engine) -> Iterator[Connection]:
    """A connection of its own in autocommit, for a write sent as one statement (the
    statement is its transaction); a driver error, a refused connection included,
    leaves as the store's."""
    with translated(), engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        yield conn


__all__ = ["autocommit_connection", "built_once", "run_compiled"]
