"""Store transactions on a connection another framework owns (a Django alias's).

A fenced effect in a Django project runs on Django's own connection, inside Django's
``transaction.atomic``: the ORM writes of its ``fn``, the fence and the effect's
record are one database transaction, begun and committed by Django. The store's code
runs on that connection unchanged, through an engine whose one connection is the
borrowed one, where SQLAlchemy's ``commit``/``rollback``/``close`` of it do nothing:
its owner ends the transaction (the store's checks before the end run as always). The
store's dialect, already initialised, is reused, so nothing is asked of the server; on
SQLite the store's clock function is added to the borrowed connection.
"""

from __future__ import annotations

import threading
from typing import Any

from sqlalchemy.engine import Engine
from sqlalchemy.pool import StaticPool

from celery_agboss.store.commit_guard import guard_engine
from celery_agboss.store.databases import add_sqlite_clock


class _Borrowed:
    """The owner's DBAPI connection, with the ends of its transaction left to the owner."""

    def __init__(self, owned: Any) -> None:
        self._owned = owned

    def __getattr__(self, name: str) -> Any:
        return getattr(self._owned, name)

    def commit(self) -> None:
        """The owner commits (Django's atomic, after the store's checks)."""

    def rollback(self) -> None:
        """The owner rolls back: the error that ends the store's transaction reaches it."""

    def close(self) -> None:
        """The owner closes its connection."""


_cached = threading.local()


def borrowed_engine(store_engine: Engine, owned: Any) -> Engine:
    """An engine over ``owned``, a DBAPI connection of this thread that its owner keeps
    open: one per owned connection (made again when the owner reconnects)."""
    cached: tuple[Any, Engine] | None = getattr(_cached, "engine", None)
    if cached is not None and cached[0] is owned:
        return cached[1]
    dialect = store_engine.dialect
    if dialect.name == "sqlite":
        add_sqlite_clock(owned)
    pool = StaticPool(lambda: _Borrowed(owned), reset_on_return=None, dialect=dialect)
    engine = Engine(pool, dialect, store_engine.url)
    guard_engine(engine)
    _cached.engine = (owned, engine)
    return engine


__all__ = ["borrowed_engine"]
