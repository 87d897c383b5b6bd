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

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy.engine import Engine
from sqlalchemy.pool import StaticPool

from celery_agboss.store.commit_guard import guard_engine
from celery_agboss.store.databases import add_sqlite_clock


@dataclass(frozen=True)
class OpenTransaction:
    """A framework's transaction open on this thread on the store's database: the engine
    over its connection (``borrowed_engine``), and how to run something once it commits."""

    engine: Engine
    on_commit: Callable[[Callable[[], None]], None]


class UsersDatabase(Protocol):
    """A framework's own transactions on the store's database (Django's, on the store's
    alias: ``celery_agboss.contrib.django``)."""

    def fenced_transaction(self) -> contextlib.AbstractContextManager[Engine | None]:
        """Entered around a fenced transaction that runs the user's writes: a transaction
        of the framework's own, yielding the engine over its connection (or None: the
        store's own), committed when the store's checks passed, else rolled back."""

    def open_transaction(self) -> OpenTransaction | None:
        """The framework's transaction the caller is inside, or None."""


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


__all__ = ["OpenTransaction", "UsersDatabase", "borrowed_engine"]
