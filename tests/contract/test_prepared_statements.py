"""``agboss_prepared_statements = False``: the store behind a pooler that hands each
transaction another server connection (PgBouncer's transaction mode before 1.21).

psycopg prepares a statement on the server once a connection has run it five times;
behind such a pooler the next transaction may land on a server connection where that
statement was never prepared. Switched off, no statement is prepared, and the store
keeps its whole contract.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import text

from celery_agboss.store.migrate import migrate
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore
from celery_agboss.testing.clock import VirtualClock
from celery_agboss.testing.contract import CONTRACT_CASES, run_contract
from tests.conftest import TemplateFactory
from tests.support.databases import TemplateDatabase

pytestmark = pytest.mark.postgres

RUNS = 10
"""More than psycopg's threshold (5) for preparing a statement on the server."""


@pytest.fixture
def postgres_url(
    postgres_templates: TemplateFactory, clone_postgres: Callable[[TemplateDatabase], str]
) -> str:
    return clone_postgres(postgres_templates("store", migrate))


@pytest.fixture
def stores(postgres_url: str) -> Iterator[Callable[[bool], SQLAlchemyStore]]:
    made: list[SQLAlchemyStore] = []

    def make(prepared: bool) -> SQLAlchemyStore:
        store = SQLAlchemyStore(
            postgres_url, engine_options={"prepared_statements": prepared, "pool_size": 1}
        )
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()


def _prepared_after_repeating_a_read(store: SQLAlchemyStore) -> int:
    for _ in range(RUNS):
        store.read_lease("prepared-statements")
    with store.engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM pg_prepared_statements")).scalar_one())


def test_switched_off_no_statement_is_prepared_on_the_server(
    stores: Callable[[bool], SQLAlchemyStore],
) -> None:
    assert _prepared_after_repeating_a_read(stores(False)) == 0


def test_left_on_a_repeated_statement_is_prepared(
    stores: Callable[[bool], SQLAlchemyStore],
) -> None:
    """Its twin: the default prepares, so the count above is not zero by accident."""
    assert _prepared_after_repeating_a_read(stores(True)) > 0


def test_switched_off_the_store_keeps_its_contract(postgres_url: str) -> None:
    clock = VirtualClock()

    def factory() -> SQLAlchemyStore:
        store = SQLAlchemyStore(
            postgres_url,
            engine_options={"prepared_statements": False},
            clock_offset_source=clock.offset_ms,
        )
        return store

    report = run_contract(factory, CONTRACT_CASES)
    assert {name: error for name, error in report.items() if error is not None} == {}
