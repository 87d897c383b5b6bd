"""What the example's tests share: a shop database on each store, and a runner's case
run on it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.example.support import run_script, sqlite_shop_url

RunCase = Callable[..., Any]
"""``run_case(module, *arguments)``: what ``run_script`` read from ``module``'s run."""


@pytest.fixture(params=["sqlite", "postgresql"])
def shop_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return sqlite_shop_url(tmp_path)
    url: str = request.getfixturevalue("empty_postgres_url")
    return url


@pytest.fixture
def run_case(tmp_path: Path, shop_database_url: str) -> RunCase:
    """``run_script`` of a runner in this test's folder, on its shop database."""

    def run(module: str, *arguments: str) -> Any:
        return run_script(module, str(tmp_path), shop_database_url, *arguments)

    return run
