"""The store of a Django project: one of its database aliases, so no second URL is kept.

A Django project that lists ``celery_agboss.contrib.django`` in ``INSTALLED_APPS`` (or
sets ``agboss_django_database``) needs no ``agboss_database_url``: the store is the
alias's database (``"default"`` unless told), its URL built here from the alias's
``DATABASES`` entry. Only the two databases the store supports are taken, each as the
fenced transactions on Django's connection will need it (docs/django.md): PostgreSQL
through psycopg 3 (the engine's driver; psycopg2 is refused by name), and a SQLite file
opened with immediate transactions (a deferred one would take its write lock only at
its first write, after the fence was read). Django is imported only when it is in use.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Mapping
from pathlib import PurePath
from typing import Any

from sqlalchemy.engine import URL, Engine

from celery_agboss.errors import ConfigurationError
from celery_agboss.store.borrowed import UsersDatabase
from celery_agboss.store.databases import sqlite_unshared

DJANGO_APP = "celery_agboss.contrib.django"
DEFAULT_ALIAS = "default"
SETTING = "agboss_django_database"

_POSTGRESQL_ENGINES = frozenset({"django.db.backends.postgresql"})
_SQLITE_ENGINES = frozenset({"django.db.backends.sqlite3"})
# OPTIONS Django reads itself; the rest are libpq connection parameters (sslmode, …).
_DJANGO_ONLY_OPTIONS = frozenset(
    {
        "assume_role",
        "context",
        "cursor_factory",
        "isolation_level",
        "pool",
        "prepare_threshold",
        "server_side_binding",
    }
)


def store_url_from_database(database: Mapping[str, Any], alias: str) -> str:
    """The store URL for one entry of Django's ``DATABASES`` (``alias`` names it in errors)."""
    engine = str(database.get("ENGINE") or "")
    if database.get("AUTOCOMMIT", True) is False:
        # Django's outermost atomic() is then a savepoint that never commits: a fenced
        # effect's writes and record would stay in an open transaction, and be lost.
        raise ConfigurationError(
            f'DATABASES[{alias!r}] sets "AUTOCOMMIT": False, so Django never commits a '
            "fenced effect's transaction (its writes and record are lost): remove "
            "AUTOCOMMIT from it, or keep the store on another alias",
            setting=SETTING,
        )
    if engine in _POSTGRESQL_ENGINES:
        return _postgresql_url(database, alias)
    if engine in _SQLITE_ENGINES:
        return _sqlite_url(database, alias)
    raise ConfigurationError(
        f"DATABASES[{alias!r}] uses {engine or 'no ENGINE'}; the celery_agboss store needs "
        "PostgreSQL or SQLite: point agboss_django_database at such an alias, or set "
        "agboss_database_url to a store of its own",
        setting=SETTING,
    )


def _postgresql_url(database: Mapping[str, Any], alias: str) -> str:
    if importlib.util.find_spec("psycopg") is None:
        raise ConfigurationError(
            f"DATABASES[{alias!r}] is PostgreSQL, but psycopg 3 is not installed (psycopg2 "
            "is not supported by the celery_agboss store): pip install 'psycopg[binary]'; "
            "Django uses it too once installed",
            setting=SETTING,
        )
    options = database.get("OPTIONS") or {}
    _require_read_committed(options.get("isolation_level"), alias)
    query = {
        str(name): str(value)
        for name, value in options.items()
        if name not in _DJANGO_ONLY_OPTIONS and isinstance(value, (str, int))
    }
    name = database.get("NAME") or None
    if name is None and "service" not in query and "dbname" not in query:
        raise ConfigurationError(
            f"DATABASES[{alias!r}] names no database (NAME, or a libpq service in OPTIONS)",
            setting=SETTING,
        )
    # As Django connects (its postgresql backend's get_connection_params): a dbname in
    # OPTIONS wins over NAME; USER, PASSWORD, HOST and PORT, when set, over OPTIONS.
    if "dbname" in query:
        name = None
    fields = {
        "user": database.get("USER") or None,
        "password": database.get("PASSWORD") or None,
        "host": database.get("HOST") or None,
        "port": database.get("PORT") or None,
    }
    for parameter, value in fields.items():
        if value is not None:
            query.pop(parameter, None)
    host, port = fields["host"], fields["port"]
    if host is not None and str(host).startswith("/"):
        # A Unix-socket directory cannot be a URL's host: libpq takes it as a parameter.
        query["host"] = str(host)
        if port is not None:
            query["port"] = str(port)
        host = port = None
    url = URL.create(
        "postgresql+psycopg",
        username=fields["user"],
        password=fields["password"],
        host=host,
        port=int(port) if port is not None else None,
        database=name,
        query=query,
    )
    return url.render_as_string(hide_password=False)


def _require_read_committed(level: Any, alias: str) -> None:
    """The fence re-reads rows it waited for: at REPEATABLE READ or SERIALIZABLE a fenced
    effect on Django's connection would see the snapshot from before its lock wait."""
    import psycopg

    if level is not None and psycopg.IsolationLevel(level) != psycopg.IsolationLevel.READ_COMMITTED:
        raise ConfigurationError(
            f"DATABASES[{alias!r}] runs at {psycopg.IsolationLevel(level).name}; celery_agboss's "
            "fenced transactions need READ COMMITTED (PostgreSQL's default): remove "
            "isolation_level from its OPTIONS, or keep the store on another alias",
            setting=SETTING,
        )


def _sqlite_url(database: Mapping[str, Any], alias: str) -> str:
    name = database.get("NAME")
    path = str(name) if isinstance(name, (str, PurePath)) else ""
    unshared = sqlite_unshared(path)
    if unshared == "in-memory":
        raise ConfigurationError(
            f"DATABASES[{alias!r}] is an in-memory SQLite database; the store must be a file "
            "every worker process opens: set NAME (and TEST's NAME for Django's test runner) "
            "to an absolute path",
            setting=SETTING,
        )
    if unshared == "relative":
        raise ConfigurationError(
            f"DATABASES[{alias!r}]: the SQLite path {path!r} is relative, so each worker "
            "would open the file under its own working directory; make NAME absolute "
            "(BASE_DIR / 'db.sqlite3')",
            setting=SETTING,
        )
    mode = str((database.get("OPTIONS") or {}).get("transaction_mode") or "DEFERRED")
    if mode.upper() != "IMMEDIATE":
        raise ConfigurationError(
            f"DATABASES[{alias!r}] is SQLite with {mode} transactions; celery_agboss needs "
            'immediate ones: add "OPTIONS": {"transaction_mode": "IMMEDIATE"} to it '
            "(Django 5.1 or later)",
            setting=SETTING,
        )
    return URL.create("sqlite", database=path).render_as_string(hide_password=False)


def django_alias(configured: Any) -> str | None:
    """The alias the store is, or None when this process is no Django project using
    celery_agboss (``configured``: the ``agboss_django_database`` setting's value)."""
    if configured is not None:
        if not isinstance(configured, str) or not configured:
            raise ConfigurationError(
                f"{SETTING} must be the name of a database alias, not {configured!r}",
                setting=SETTING,
            )
        _require_django()
        return configured
    if not os.environ.get("DJANGO_SETTINGS_MODULE") or importlib.util.find_spec("django") is None:
        return None
    from django.conf import settings

    installed = getattr(settings, "INSTALLED_APPS", ())
    return DEFAULT_ALIAS if DJANGO_APP in installed else None


def django_store_url(alias: str) -> str:
    """The store URL of ``alias`` in the project's ``DATABASES``."""
    _require_django()
    from django.conf import settings

    databases = getattr(settings, "DATABASES", {})
    if alias not in databases:
        raise ConfigurationError(
            f"{SETTING} is {alias!r}, which is not in DATABASES "
            f"(its aliases: {', '.join(sorted(databases)) or 'none'})",
            setting=SETTING,
        )
    return store_url_from_database(databases[alias], alias)


UsersDatabaseFactory = Callable[[Engine, str], UsersDatabase]
"""``factory(store_engine, alias)``: the project's transactions on the alias (None: the
store is no alias of the project's, so fenced effects may write to none of them)."""
_users_database: list[UsersDatabaseFactory] = []


def register_users_database(factory: UsersDatabaseFactory) -> None:
    """Called by the Django app when Django loads it."""
    _users_database[:] = [factory]


def users_database(store_engine: Engine, alias: str) -> UsersDatabase:
    """Django's transactions on ``alias``: where this process's fenced effects run, and
    what a publish inside the caller's ``atomic`` joins. Django is set up here if nothing
    did yet (Celery's Django fixup does it in a worker), which loads the app; without the
    app, the fence could not reach the ORM's writes, so nothing starts."""
    if not _users_database:
        _require_django()
        import django
        from django.apps import apps

        if not apps.ready:
            django.setup()
    if not _users_database:
        raise ConfigurationError(
            f"the store is the Django database {alias!r} but {DJANGO_APP!r} is not in "
            "INSTALLED_APPS: add it, so that fenced effects run in Django's transaction",
            setting=SETTING,
        )
    return _users_database[0](store_engine, alias)


def _require_django() -> None:
    if importlib.util.find_spec("django") is None:
        raise ConfigurationError(
            f"{SETTING} is set but Django is not installed: pip install 'celery-agboss[django]'",
            setting=SETTING,
        )


__all__ = [
    "DJANGO_APP",
    "django_alias",
    "django_store_url",
    "register_users_database",
    "store_url_from_database",
    "users_database",
]
