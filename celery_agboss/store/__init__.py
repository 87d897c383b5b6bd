"""The SQLAlchemy store: schema, engine set-up, and the backend of ``core.store_protocol.Store``.

``metadata`` holds every ``agboss_`` table (include it in your Alembic autogenerate,
or exclude its tables); the tables themselves are in ``celery_agboss.store.schema``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from celery_agboss.store.metadata import metadata
from celery_agboss.store.schema import metadata as _schema_metadata  # registers the tables

if TYPE_CHECKING:
    from celery_agboss.store.databases import create_store_engine

assert _schema_metadata is metadata

__all__ = ["create_store_engine", "metadata"]


def __getattr__(name: str) -> object:
    # The engine set-up pulls in the driver modules; import it only when asked for.
    if name == "create_store_engine":
        from celery_agboss.store.databases import create_store_engine

        return create_store_engine
    raise AttributeError(f"module 'celery_agboss.store' has no attribute {name!r}")
