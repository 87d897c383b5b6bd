"""``COMMIT`` sent as SQL text inside a fenced effect must not commit its writes without
the effect's record and the commit-time lease check (design: P2), on both stores."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import insert

from celery_agboss.core import protections, sabotage
from celery_agboss.errors import CommitInsideFencedEffectError
from tests.engine.app_tables import create_app_tables, ledger, notes, write_note
from tests.engine.helpers import Shop


def _commit_as_text_then_fail(shop: Shop, statement: str) -> None:
    create_app_tables(shop.store.engine)

    def sneaky(conn: Any) -> Any:
        conn.execute(insert(ledger).values(note="paid"))
        conn.exec_driver_sql(statement)
        raise RuntimeError("the effect fails after its own COMMIT")

    with shop.start("task-1") as ctx:
        with pytest.raises((CommitInsideFencedEffectError, RuntimeError)):
            ctx.fenced_effect("mark-paid", sneaky)
        ctx.fenced_effect("mark-paid", lambda conn: write_note(conn, "paid"))


@pytest.mark.parametrize("statement", ["COMMIT", "commit;", "END", "ROLLBACK"])
def test_commit_sent_as_sql_text_inside_a_fenced_effect_is_refused(
    shop: Shop, statement: str
) -> None:
    """The effect's writes commit with its record, or not at all (design: P2)."""
    _commit_as_text_then_fail(shop, statement)
    assert notes(shop.store.engine) == ["paid"]


@pytest.mark.parametrize("statement", ["/* mark */ COMMIT", "-- mark\nCOMMIT"])
def test_a_commit_behind_a_comment_is_refused(shop: Shop, statement: str) -> None:
    _commit_as_text_then_fail(shop, statement)
    assert notes(shop.store.engine) == ["paid"]


def test_a_commit_after_another_statement_in_one_text_is_refused(shop: Shop) -> None:
    """PostgreSQL runs every statement of a text sent without parameters: the write and
    its ``COMMIT`` in one ``execute`` (SQLite refuses a second statement itself)."""
    if shop.store.engine.dialect.name != "postgresql":
        pytest.skip("SQLite runs one statement per execute")
    _commit_as_text_then_fail(shop, "SELECT 1; COMMIT")
    assert notes(shop.store.engine) == ["paid"]


@pytest.mark.parametrize("statement", ["SELECT 'a; COMMIT'", "SELECT 1 -- ; COMMIT"])
def test_a_commit_inside_a_literal_or_a_comment_is_no_commit(shop: Shop, statement: str) -> None:
    create_app_tables(shop.store.engine)
    with shop.start("task-1") as ctx:
        ctx.fenced_effect("mark-paid", lambda conn: (conn.exec_driver_sql(statement), "ok")[1])
        ctx.fenced_effect("note", lambda conn: write_note(conn, "paid"))
    assert notes(shop.store.engine) == ["paid"]


def test_twin_a_commit_as_sql_text_lets_a_failed_effect_write_twice(shop: Shop) -> None:
    with sabotage.switched_off(protections.COMMIT_INSIDE_FENCED_EFFECT_ALLOWED):
        _commit_as_text_then_fail(shop, "COMMIT")
    assert notes(shop.store.engine) == ["paid", "paid"]
