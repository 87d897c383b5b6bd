"""``python -m example_project.migrate``: celery_agboss's tables, then the shop's, in one database.

The one-shot step before the first worker starts (docker compose runs it as ``migrate``).
"""

from __future__ import annotations

import sys

from celery_agboss import migrate
from example_project import config, orders


def run(url: str | None = None) -> str:
    """Create every table the shop needs; the database URL it used."""
    url = url or config.database_url()
    migrate(url)
    orders.create_tables(url)
    return url


def main() -> int:
    url = run()
    print(f"migrated {url.split('@')[-1]}: celery_agboss's tables and the shop's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
