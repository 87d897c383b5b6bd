"""The store's deployment id: the tenant of every idempotency key, unless ``agboss_tenant``
says otherwise (docs/keys.md).

The migration that creates an empty store mints it (revision 0007, insert-if-absent);
a store upgraded while it held executions keeps ``"default"``, the tenant its keys in
flight were made with. Nothing mints one at run time: a store without the row was not
migrated, and the caller says so (``Runtime.engine_settings``).
"""

from __future__ import annotations

from sqlalchemy import inspect, select

from celery_agboss.core.sealing import ENCRYPTION_META_KEY
from celery_agboss.errors import StoreError, StoreUnavailableError
from celery_agboss.store.driver_errors import translated
from celery_agboss.store.schema_executions import meta
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore

TENANT_META_KEY = "deployment.tenant"
"""The ``agboss_meta`` row that holds the deployment id (revision 0007 spells it too)."""


def read_store_tenant(store: SQLAlchemyStore) -> str | None:
    """The deployment id the store holds, or None when it holds none (never migrated to
    revision 0007, or no ``agboss_meta`` at all). An unreachable store raises."""
    return read_store_meta(store)[0]


def read_store_meta(store: SQLAlchemyStore) -> tuple[str | None, bool]:
    """``read_store_tenant``'s answer and, in the same read, whether the store holds
    sealed values (``encryption`` = ``on``): what a process reads once before its first
    lease."""
    wanted = (TENANT_META_KEY, ENCRYPTION_META_KEY)
    try:
        with store.read_transaction() as tx:
            rows = tx.execute(select(meta.c.key, meta.c.value).where(meta.c.key.in_(wanted)))
            found = {str(row.key): str(row.value) for row in rows}
    except StoreUnavailableError:
        raise
    except StoreError:
        if _has_meta_table(store):
            raise
        return None, False
    return found.get(TENANT_META_KEY), found.get(ENCRYPTION_META_KEY) == "on"


def _has_meta_table(store: SQLAlchemyStore) -> bool:
    with translated(), store.engine.connect() as conn:
        return bool(inspect(conn).has_table(meta.name))


__all__ = ["TENANT_META_KEY", "read_store_meta", "read_store_tenant"]
