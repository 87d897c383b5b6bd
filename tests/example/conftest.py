"""What the example's tests share: a shop database on each store."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(params=["sqlite", "postgresql"])
def shop_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'shop.db'}"
    url: str = request.getfixturevalue("empty_postgres_url")
    return url
