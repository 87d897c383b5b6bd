"""The fault-injecting proxy, against the real PostgreSQL.

The fault suite trusts this proxy to produce two crash windows exactly: a
connection cut before COMMIT (nothing committed) and a COMMIT whose answer is
lost (committed, but the client saw an error).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tests.support.services import libpq_url
from tests.support.tcp_proxy import CommitFault, PostgresProxy, _holds_commit

pytestmark = pytest.mark.postgres


@pytest.fixture
def database(empty_postgres_url: str) -> Iterator[str]:
    with psycopg.connect(libpq_url(empty_postgres_url), autocommit=True) as conn:
        conn.execute("CREATE TABLE payments (id int PRIMARY KEY)")
    yield libpq_url(empty_postgres_url)


def through(proxy: PostgresProxy, url: str, **kwargs: Any) -> psycopg.Connection[Any]:
    return psycopg.connect(proxy.url_for(url), connect_timeout=5, **kwargs)


def committed_ids(url: str) -> list[int]:
    with psycopg.connect(url) as conn:
        return [row[0] for row in conn.execute("SELECT id FROM payments ORDER BY id")]


def _insert_then_the_commit_fails(proxy: PostgresProxy, database: str, payment: int) -> None:
    """Insert ``payment`` through the proxy, whose armed fault makes the client's COMMIT
    fail (whether the database committed is what the test asks)."""
    conn = through(proxy, database)
    try:
        conn.execute(f"INSERT INTO payments VALUES ({payment})")
        with pytest.raises(psycopg.OperationalError):
            conn.commit()
    finally:
        conn.close()


def test_a_query_through_the_proxy_gets_its_answer(
    postgres_proxy: PostgresProxy, database: str
) -> None:
    with through(postgres_proxy, database) as conn:
        assert conn.execute("SELECT 41 + 1").fetchone() == (42,)
        conn.execute("INSERT INTO payments VALUES (1)")
        conn.commit()
    assert committed_ids(database) == [1]
    assert postgres_proxy.faults_fired == 0


def test_the_proxy_talks_in_the_clear_to_a_client_that_prefers_tls(
    postgres_proxy: PostgresProxy, database: str
) -> None:
    with through(postgres_proxy, database, sslmode="prefer") as conn:
        assert conn.pgconn.ssl_in_use is False
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_a_commit_whose_answer_is_dropped_errors_for_the_client_but_is_committed(
    postgres_proxy: PostgresProxy, database: str
) -> None:
    postgres_proxy.drop_answer_after_commit()
    _insert_then_the_commit_fails(postgres_proxy, database, 7)

    postgres_proxy.wait_for_faults(1)
    assert committed_ids(database) == [7]


def test_only_the_armed_number_of_commits_lose_their_answer(
    postgres_proxy: PostgresProxy, database: str
) -> None:
    postgres_proxy.drop_answer_after_commit(times=1)
    with through(postgres_proxy, database) as first:
        first.execute("INSERT INTO payments VALUES (1)")
        with pytest.raises(psycopg.OperationalError):
            first.commit()
    with through(postgres_proxy, database) as second:
        second.execute("INSERT INTO payments VALUES (2)")
        second.commit()
    assert committed_ids(database) == [1, 2]
    assert postgres_proxy.faults_fired == 1


def test_a_commit_cut_before_it_is_forwarded_commits_nothing(
    postgres_proxy: PostgresProxy, database: str
) -> None:
    postgres_proxy.arm_commit_fault(CommitFault.CUT_BEFORE)
    _insert_then_the_commit_fails(postgres_proxy, database, 3)

    assert postgres_proxy.faults_fired == 1
    assert committed_ids(database) == []


def test_cutting_every_connection_aborts_the_open_transactions(
    postgres_proxy: PostgresProxy, database: str
) -> None:
    conn = through(postgres_proxy, database)
    try:
        conn.execute("INSERT INTO payments VALUES (5)")
        assert postgres_proxy.cut_all() == 1
        with pytest.raises(psycopg.OperationalError):
            conn.execute("INSERT INTO payments VALUES (6)")
    finally:
        conn.close()

    assert committed_ids(database) == []
    # New connections still go through.
    with through(postgres_proxy, database) as again:
        assert again.execute("SELECT 1").fetchone() == (1,)


def test_read_committed_is_not_mistaken_for_a_commit(
    postgres_proxy: PostgresProxy, database: str
) -> None:
    postgres_proxy.drop_answer_after_commit()
    with through(postgres_proxy, database) as conn:
        conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
        conn.execute("INSERT INTO payments VALUES (9)")  # BEGIN ISOLATION LEVEL READ COMMITTED
        conn.execute("SELECT 'commit' IS NOT NULL")  # a string literal, in an extended query
        assert postgres_proxy.faults_fired == 0
        with pytest.raises(psycopg.OperationalError):
            conn.commit()
    assert committed_ids(database) == [9]


def test_a_commit_sent_as_a_prepared_statement_is_seen(
    postgres_proxy: PostgresProxy, database: str
) -> None:
    postgres_proxy.drop_answer_after_commit()
    with through(postgres_proxy, database, autocommit=True) as conn:
        conn.execute("BEGIN", prepare=False)
        conn.execute("INSERT INTO payments VALUES (11)")
        with pytest.raises(psycopg.OperationalError):
            conn.execute("COMMIT", prepare=True)
    postgres_proxy.wait_for_faults(1)
    assert committed_ids(database) == [11]


def test_new_connections_can_be_refused(postgres_proxy: PostgresProxy, database: str) -> None:
    postgres_proxy.reject_new_connections()
    with pytest.raises(psycopg.OperationalError):
        through(postgres_proxy, database)
    postgres_proxy.reject_new_connections(False)
    with through(postgres_proxy, database) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_stopping_the_proxy_closes_what_it_carries(database: str) -> None:
    proxy = PostgresProxy.in_front_of(database).start()
    conn = through(proxy, database)
    try:
        assert proxy.open_connections == 1
        proxy.stop()
        assert proxy.open_connections == 0
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
    finally:
        conn.close()
        proxy.stop()


def test_a_one_statement_write_is_taken_for_a_commit() -> None:
    """The store's one-statement writes commit by themselves (autocommit): the proxy
    treats them as COMMITs; a statement merely inside a transaction is not one."""
    assert _holds_commit(b"WITH agboss_fence AS (UPDATE agboss_leases SET x = 1) SELECT 1")
    assert not _holds_commit(b"UPDATE agboss_leases SET x = 1 FROM (SELECT 1) AS agboss_clock")
    assert not _holds_commit(b"SELECT 'agboss_fence'")
