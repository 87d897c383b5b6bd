"""The store set as ``agboss_database_url`` in a project with the Django app installed.

A fenced effect then runs on the store's own connection, not on Django's: ``fn``'s ORM
writes were on Django's autocommit connection, outside the fenced transaction, with no
word said (a zombie's write committed, a failed effect's write stayed; on SQLite the
write waited for the store's own write lock, timed out, and each retry wrote again
without a record). Now they are refused, naming the setting that fences them (the
store as an alias): nothing of the effect is written, and the execution fails as any
refused effect does, its undo refunding the charge (counted at the fake gateway).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.django.money_script import run_shop

pytestmark = [pytest.mark.slow]


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
)
def test_fns_orm_write_with_the_store_by_url_is_refused(
    request: pytest.FixtureRequest, tmp_path: Path, backend: str
) -> None:
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'shop.sqlite3'}"
    else:
        url = request.getfixturevalue("empty_postgres_url")
    script = """
    report(paying(lambda ref, conn: mark_paid(ref)).apply(args=("o-1",), task_id="t-1"))
    """
    out = run_shop(request, tmp_path, backend, script, store_url=url)
    assert out["result"] == "OutsideFenceWriteError", out
    assert "set agboss_django_database" in out["message"]
    assert out["gateway"] == ["charge", "refund"], "never charged without the order paid"
    assert (out["state"], out["paid"], out["effects"]) == ("FAILED", 0, 0), out


def test_a_read_through_the_orm_still_passes(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    script = """
    def read(ref, conn):
        return Order.objects.get(pk=ref).times_paid

    report(paying(read).apply(args=("o-1",), task_id="t-1"))
    """
    url = f"sqlite:///{tmp_path / 'shop.sqlite3'}"
    out = run_shop(request, tmp_path, "sqlite", script, store_url=url)
    assert out["gateway"] == ["charge"]
    assert (out["state"], out["effects"]) == ("COMPLETED", 1), out
