"""Throwaway stores for tests: a SQLite file in a temporary directory, or a PostgreSQL
database copied from a template that was migrated once per process.

    url = sqlite_store_url(tmp_path)            # or: clone_postgres_database(admin_url)
    store = open_store(url, clock_offset_source=clock.offset_ms)
    ...
    store.close(); drop_postgres_database(url)  # (PostgreSQL only)

``throwaway_store_url(backend, …)`` does the same as a context manager. Databases
made here are named ``agboss_t_<pid>_store<n>`` (templates ``agboss_tpl_<pid>_store``),
so a crashed run's leftovers are recognisable and can be dropped by pid.
"""

from __future__ import annotations

import atexit
import itertools
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from psycopg import sql
from sqlalchemy.engine import make_url

from celery_agboss.store.deployment import PLACE_META_KEY
from celery_agboss.store.migrate import migrate
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore

SQLITE_FILE_NAME = "agboss.db"
CLONE_PREFIX = "agboss_t_"
TEMPLATE_PREFIX = "agboss_tpl_"

_counter = itertools.count(1)
_templates: dict[str, str] = {}  # admin URL -> template database name
_templates_lock = threading.Lock()


def sqlite_store_url(directory: str | os.PathLike[str]) -> str:
    """The URL of a SQLite store file in ``directory`` (absolute, as the store requires)."""
    path = Path(directory).resolve() / SQLITE_FILE_NAME
    return f"sqlite:///{path}"


def open_store(
    url: str, *, clock_offset_source: Callable[[], int] | None = None
) -> SQLAlchemyStore:
    """Migrate the database at ``url`` (idempotent) and open a store on it."""
    migrate(url)
    return SQLAlchemyStore(url, clock_offset_source=clock_offset_source)


# --- PostgreSQL ----------------------------------------------------------------------


def _libpq(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _with_database(url: str, name: str) -> str:
    return make_url(url).set(database=name).render_as_string(hide_password=False)


def _admin(admin_url: str) -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(_libpq(admin_url), autocommit=True, connect_timeout=5)


def _forget_the_place(url: str) -> None:
    """Each clone of the template is a test's own store, not a copy of the template: the
    place its deployment id was minted at is forgotten (a clone migrated later records its
    own), so no clone warns that it is a copy (``store.deployment.PlaceCheck``)."""
    with psycopg.connect(_libpq(url), autocommit=True, connect_timeout=5) as conn:
        conn.execute("DELETE FROM agboss_meta WHERE key = %s", (PLACE_META_KEY,))


def _drop(conn: psycopg.Connection[tuple[object, ...]], name: str) -> None:
    exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
    if exists is None:
        return
    conn.execute(sql.SQL("ALTER DATABASE {} IS_TEMPLATE false").format(sql.Identifier(name)))
    conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def migrated_postgres_template(admin_url: str) -> str:
    """The name of a database migrated to head, made once per process and ``admin_url``.

    ``admin_url`` is a SQLAlchemy URL (``postgresql+psycopg://…``) of a role that may
    create databases. The template is dropped when the process exits.
    """
    with _templates_lock:
        name = _templates.get(admin_url)
        if name is not None:
            return name
        name = f"{TEMPLATE_PREFIX}{os.getpid()}_store"
        with _admin(admin_url) as conn:
            _drop(conn, name)
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        try:
            migrate(_with_database(admin_url, name))
            _forget_the_place(_with_database(admin_url, name))
            with _admin(admin_url) as conn:
                conn.execute(
                    sql.SQL(
                        "ALTER DATABASE {} WITH IS_TEMPLATE true ALLOW_CONNECTIONS false"
                    ).format(sql.Identifier(name))
                )
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = %s AND pid <> pg_backend_pid()",
                    (name,),
                )
        except BaseException:
            with _admin(admin_url) as conn:
                _drop(conn, name)
            raise
        _templates[admin_url] = name
        atexit.register(_drop_template_quietly, admin_url, name)
        return name


def _drop_template_quietly(admin_url: str, name: str) -> None:
    try:
        with _admin(admin_url) as conn:
            _drop(conn, name)
    except psycopg.Error:
        pass


def clone_postgres_database(admin_url: str) -> str:
    """A new database copied from the migrated template; returns its SQLAlchemy URL."""
    template = migrated_postgres_template(admin_url)
    name = f"{CLONE_PREFIX}{os.getpid()}_store{next(_counter)}"
    with _admin(admin_url) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template)
            )
        )
    return _with_database(admin_url, name)


def drop_postgres_database(url: str) -> None:
    """Drop the database ``url`` names (ending any session still connected to it)."""
    name = make_url(url).database
    if not name:
        raise ValueError(f"no database in {url!r}")
    with _admin(_with_database(url, "postgres")) as conn:
        _drop(conn, name)


@contextmanager
def throwaway_store_url(
    backend: str, *, directory: str | os.PathLike[str], postgres_admin_url: str | None = None
) -> Iterator[str]:
    """A migrated, empty store database for one test; PostgreSQL ones are dropped after."""
    if backend == "sqlite":
        url = sqlite_store_url(directory)
        migrate(url)
        yield url
        return
    if backend != "postgresql":
        raise ValueError(f"unknown store backend {backend!r}: 'sqlite' or 'postgresql'")
    if postgres_admin_url is None:
        raise ValueError("a PostgreSQL store needs postgres_admin_url")
    url = clone_postgres_database(postgres_admin_url)
    try:
        yield url
    finally:
        drop_postgres_database(url)


__all__ = [
    "open_store",
    "sqlite_store_url",
]
