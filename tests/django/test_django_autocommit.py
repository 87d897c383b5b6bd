"""A store alias whose Django connection is not in autocommit mode is refused.

Under ``"AUTOCOMMIT": False`` Django's outermost ``atomic()`` is a savepoint that never
commits. Before, such an alias was taken as the store: a fenced effect "committed"
nothing (its ORM write, its record and the fence's lease update left in Django's open
transaction, rolled back when the connection closed), the order charged and never
marked paid. Now the store-URL rules refuse the alias (nothing runs, nothing charged),
and the fence refuses a connection some code turned autocommit off on
(``set_autocommit(False)``): the effect never passes for written.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.django.money_script import run_shop

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


def test_an_alias_with_autocommit_off_is_refused_before_any_charge(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    script = """
    report(paying(lambda ref, conn: mark_paid(ref)).apply(args=("o-1",), task_id="t-1"))
    """
    out = run_shop(request, tmp_path, "postgresql", script, AUTOCOMMIT=False)
    assert out["result"] == "ConfigurationError" and "AUTOCOMMIT" in out["message"], out
    assert out["gateway"] == [], "nothing charged"
    assert (out["state"], out["paid"], out["effects"]) == (None, 0, 0), out


def test_a_fenced_effect_on_a_connection_out_of_autocommit_is_refused(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The charge is refunded by its undo: the order was never marked paid."""
    script = """
    connection.set_autocommit(False)   # some code of the project's, before the task
    report(paying(lambda ref, conn: mark_paid(ref)).apply(args=("o-1",), task_id="t-1"))
    """
    out = run_shop(request, tmp_path, "postgresql", script)
    assert out["result"] == "ConfigurationError" and "autocommit" in out["message"], out
    assert out["gateway"] == ["charge", "refund"], "never charged without the order paid"
    assert (out["state"], out["paid"], out["effects"]) == ("FAILED", 0, 0), out
