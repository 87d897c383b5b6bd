"""The same command on Redis and PostgreSQL: ``--broker-url`` and ``--database-url``.

A subset of the table (a crash, a pause, an undo, a webhook, the outbox's receipt), both
columns, from this tree, on a Redis database and an empty PostgreSQL database of the
test's own.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.example.support import REPO_ROOT, run_scenarios

pytestmark = pytest.mark.timeout(900)

SUBSET = ["ps2", "ps5", "ps10", "ps11", "ps15", "ps21"]


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
