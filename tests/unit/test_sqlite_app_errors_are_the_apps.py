"""An application's own SQLite error inside a fenced effect stays the application's.

The store's SQLite errors were classified by words in their message: an application's
query failing on "malformed JSON", or on a constraint of a table named ``…busy…``, was
taken for the store's trouble (unavailable, lock timeout) and its delivery retried until
the execution parked, the customer charged and the order never marked paid. SQLite's
result code decides now; the words only for an error raised without one.
"""

from __future__ import annotations

import sqlite3
import sys

import pytest

from celery_agboss.errors import StoreLockTimeoutError, StoreUnavailableError
from celery_agboss.store.driver_errors import raise_if_store_trouble, translate


def _raised(sql: str) -> sqlite3.Error:
    conn = sqlite3.connect(":memory:")
    try:
        conn.execute("CREATE TABLE shop_busy_slot (slot TEXT PRIMARY KEY)")
        conn.execute("INSERT INTO shop_busy_slot VALUES ('a')")
        conn.execute(sql)
    except sqlite3.Error as error:
        return error
    finally:
        conn.close()
    raise AssertionError(f"{sql!r} did not fail")


@pytest.mark.skipif(
    sys.version_info < (3, 11), reason="sqlite3 errors carry their result code from 3.11"
)
@pytest.mark.parametrize(
    "sql",
    ["SELECT json('{not json')", "INSERT INTO shop_busy_slot VALUES ('a')"],
    ids=["malformed-json", "busy-named-table"],
)
def test_an_applications_own_error_is_not_the_stores_trouble(sql: str) -> None:
    error = _raised(sql)
    raise_if_store_trouble(error)  # returns: the application's error, left as it is
    assert not isinstance(translate(error), (StoreUnavailableError, StoreLockTimeoutError))


def test_a_locked_database_is_still_a_lock_timeout(tmp_path: object) -> None:
    path = f"{tmp_path}/store.db"
    holder = sqlite3.connect(path, isolation_level=None)
    waiter = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        holder.execute("CREATE TABLE t (x)")
        holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(sqlite3.OperationalError) as caught:
            waiter.execute("BEGIN IMMEDIATE")
    finally:
        holder.close()
        waiter.close()
    assert isinstance(translate(caught.value), StoreLockTimeoutError)
    with pytest.raises(StoreLockTimeoutError):
        raise_if_store_trouble(caught.value)
