"""Where the shop's database, broker and gateway are: environment variables, with demo defaults.

Every value comes from the environment, so the worker, beat, the web entry point and the
scenario runner (which starts them) agree without a settings file:

- ``CELERY_BROKER_URL``: the broker. Unset, the embedded default: kombu's filesystem
  transport in ``$EXAMPLE_DATA_DIR/broker`` (``example_project.broker``, each message
  written whole) — real worker processes share it through files, with nothing to
  install. kombu's SQLAlchemy transport would do too, but on an SQLite file its
  consumers' read-then-update is not serialised, and on the store's own file it would
  contend with the store for the one write lock.
- ``AGBOSS_DATABASE_URL``: the store, read by celery_agboss itself; the shop's own tables
  live in the same database. Unset: ``sqlite:////$EXAMPLE_DATA_DIR/shop.db``.
- ``STRIPE_API_KEY``, ``STRIPE_API_BASE`` (a fake gateway, for the demo), ``STRIPE_WEBHOOK_SECRET``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

DATA_DIR_ENV = "EXAMPLE_DATA_DIR"
DEMO_STRIPE_KEY = "sk_test_agboss_fake_gateway"
DEMO_WEBHOOK_SECRET = "whsec_agboss_example_shop_demo"
DEMO_PSEUDONYM_KEY = "example-shop-demo-pseudonym-key-not-a-secret"
FILESYSTEM_BROKER = "filesystem://"


def data_dir() -> Path:
    """The embedded default's directory (absolute, created on first use)."""
    raw = os.environ.get(DATA_DIR_ENV) or str(Path.cwd() / ".example-data")
    path = Path(raw).resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


def database_url() -> str:
    return os.environ.get("AGBOSS_DATABASE_URL") or f"sqlite:///{data_dir() / 'shop.db'}"


def broker_url() -> str:
    return os.environ.get("CELERY_BROKER_URL") or FILESYSTEM_BROKER


def broker_transport(url: str) -> str | None:
    """The embedded default's transport class (``example_project.broker``), else the URL's."""
    return "example_project.broker:Transport" if url.startswith("filesystem") else None


def broker_transport_options(url: str) -> dict[str, Any]:
    """The filesystem transport's folders (one for every process) and a short poll."""
    if not url.startswith("filesystem"):
        return {}
    folder = data_dir() / "broker"
    for name in ("queue", "control"):
        (folder / name).mkdir(parents=True, exist_ok=True)
    queue = str(folder / "queue")
    return {
        "data_folder_in": queue,
        "data_folder_out": queue,
        "control_folder": str(folder / "control"),
        "polling_interval": 0.1,
    }


def stripe_api_key() -> str:
    return os.environ.get("STRIPE_API_KEY") or DEMO_STRIPE_KEY


def stripe_api_base() -> str | None:
    """None: the SDK's own api.stripe.com (the API key says test or live mode)."""
    return os.environ.get("STRIPE_API_BASE") or None


def stripe_webhook_secret() -> str:
    return os.environ.get("STRIPE_WEBHOOK_SECRET") or DEMO_WEBHOOK_SECRET


def pseudonym_key() -> str:
    return os.environ.get("AGBOSS_PSEUDONYM_KEY") or DEMO_PSEUDONYM_KEY
