"""PostgreSQL template databases and their copies."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import psycopg
import pytest

from tests.support import databases
from tests.support.databases import TemplateDatabase
from tests.support.services import libpq_url

pytestmark = pytest.mark.postgres


# Building a template must not depend on ``prepare`` closing its connections.
left_open: list[psycopg.Connection[tuple[str]]] = []


@pytest.fixture(autouse=True)
def close_left_open() -> Iterator[None]:
    yield
    while left_open:
        left_open.pop().close()


def with_a_table(url: str) -> None:
    conn = psycopg.connect(libpq_url(url))
    conn.execute("CREATE TABLE marks (label text)")
    conn.execute("INSERT INTO marks VALUES ('from the template')")
    conn.commit()
    left_open.append(conn)


def labels(url: str) -> list[str]:
    with psycopg.connect(libpq_url(url)) as conn:
        return [row[0] for row in conn.execute("SELECT label FROM marks ORDER BY label")]


def test_copies_start_from_the_template_and_do_not_share_writes(
    postgres_templates: Callable[[str, Callable[[str], None]], TemplateDatabase],
    clone_postgres: Callable[[TemplateDatabase], str],
) -> None:
    template = postgres_templates("with a table", with_a_table)
    first, second = clone_postgres(template), clone_postgres(template)
    with psycopg.connect(libpq_url(first)) as conn:
        conn.execute("INSERT INTO marks VALUES ('only in the first')")

    assert labels(first) == ["from the template", "only in the first"]
    assert labels(second) == ["from the template"]
    assert first.startswith("postgresql+psycopg://")
    assert databases.database_name(first).startswith("agboss_t_")


def test_a_template_is_built_once_per_session(
    postgres_templates: Callable[[str, Callable[[str], None]], TemplateDatabase],
) -> None:
    calls: list[str] = []
    first = postgres_templates("counted", calls.append)
    second = postgres_templates("counted", calls.append)
    assert first is second
    assert calls == [first.url]


def test_copies_are_dropped_after_the_test(
    postgres_admin_url: str, empty_postgres_url: str
) -> None:
    name = databases.database_name(empty_postgres_url)
    databases.drop_database(postgres_admin_url, name)
    with psycopg.connect(libpq_url(postgres_admin_url)) as conn:
        row = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
    assert row is None
