"""The store's deployment id: the tenant of every idempotency key, unless ``agboss_tenant``
says otherwise (docs/keys.md).

The migration that creates an empty store mints it (revision 0007, insert-if-absent);
a store upgraded while it held executions keeps ``"default"``, the tenant its keys in
flight were made with. Nothing mints one at run time: a store without the row was not
migrated, and the caller says so (``Runtime.engine_settings``).
"""

from __future__ import annotations

from sqlalchemy import inspect, select

from celery_agboss.errors import StoreError, StoreUnavailableError
from celery_agboss.store.driver_errors import translated
from celery_agboss.store.schema_executions import meta
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore

TENANT_META_KEY = "deployment.tenant"
"""The ``agboss_meta`` row that holds the deployment id (revision 0007 spells it too)."""


def read_store_tenant(store: SQLAlchemyStore) -> str | None:
    """The deployment id the store holds, or None when it holds none (never migrated to
    revision 0007, or no ``agboss_meta`` at all). An unreachable store raises."""
    try:
        with store.read_transaction() as tx:
            row = tx.execute(select(meta.c.value).where(meta.c.key == TENANT_META_KEY)).first()
    except StoreUnavailableError:
        raise
    except StoreError:
        if _has_meta_table(store):
            raise
        return None
    return None if row is None else str(row.value)


def _has_meta_table(store: SQLAlchemyStore) -> bool:
    with translated(), store.engine.connect() as conn:
        return bool(inspect(conn).has_table(meta.name))


__all__ = ["TENANT_META_KEY", "read_store_tenant"]
