"""Real ``celery worker`` subprocesses for the operations tests: the integration harness's
fixtures (a store on each backend, the gateway over HTTP, ``shop_factory``), reused."""

from __future__ import annotations

from tests.integration.conftest import (
    database_url,
    gateway,
    postgres_database_url,
    shop_factory,
    sqlite_database_url,
)
