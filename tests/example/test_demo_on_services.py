"""The same command on Redis and PostgreSQL: ``--broker-url`` and ``--database-url``.

A part of the table (a crash with the outbox's receipt, an undo killed mid-refund, a
3-D Secure pause answered by the web entry point and a webhook), both columns, from this
tree, on a Redis database and an empty PostgreSQL database of the test's own.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.example.support import REPO_ROOT, run_scenarios

pytestmark = pytest.mark.timeout(900)

SUBSET = ["ps5", "ps10", "ps21"]


def test_the_table_runs_on_redis_and_postgresql(
    tmp_path: Path, redis_url: str, empty_postgres_url: str
) -> None:
    arguments = [*SUBSET, "--broker-url", redis_url, "--database-url", empty_postgres_url]
    run = run_scenarios(
        REPO_ROOT / ".venv" / "bin" / "python",
        arguments,
        cwd=REPO_ROOT,
        results=tmp_path / "table.json",
    )
    assert run.returncode == 0, run.output[-6000:]
    assert sorted(run.table) == sorted(SUBSET)
    assert run.missed() == [], run.output[-6000:]
    print(f"unprotected rows whose harm did not show this run: {run.harm_not_shown()}")
