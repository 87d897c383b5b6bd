"""The store URL a Django project's ``DATABASES`` entry gives, and the entries refused.

Each refusal names what to change: the fix is always in the user's settings.py.
The whole path (a Celery app configured from Django's settings) is
tests/django/test_django_migrations.py's, in processes of a Django project.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

from celery_agboss.errors import ConfigurationError
from celery_agboss.runtime import django_store
from celery_agboss.runtime.django_store import store_url_from_database
from celery_agboss.runtime.settings import settings_from_conf
from celery_agboss.store.databases import checked_url

POSTGRESQL = "django.db.backends.postgresql"
SQLITE = "django.db.backends.sqlite3"


def test_a_postgresql_alias_is_reached_through_psycopg_3_with_its_libpq_options() -> None:
    url = make_url(
        store_url_from_database(
            {
                "ENGINE": POSTGRESQL,
                "NAME": "shop",
                "USER": "shop",
                "PASSWORD": "p@ss:word",
                "HOST": "db.internal",
                "PORT": "6432",
                "OPTIONS": {
                    "sslmode": "require",
                    "pool": True,
                    "isolation_level": psycopg.IsolationLevel.READ_COMMITTED,
                },
            },
            "default",
        )
    )
    assert url.drivername == "postgresql+psycopg"
    assert (url.username, url.password, url.host, url.port, url.database) == (
        "shop",
        "p@ss:word",
        "db.internal",
        6432,
        "shop",
    )
    assert dict(url.query) == {"sslmode": "require"}  # Django's own options stay Django's


def test_a_postgresql_alias_on_a_unix_socket_has_no_host() -> None:
    url = make_url(store_url_from_database({"ENGINE": POSTGRESQL, "NAME": "shop"}, "default"))
    assert (url.host, url.port, url.database) == (None, None, "shop")


def _connects_with(database: dict[str, Any]) -> dict[str, Any]:
    """What psycopg is given for the store URL of ``database``."""
    url = make_url(store_url_from_database({"ENGINE": POSTGRESQL, **database}, "default"))
    args = create_engine(url).dialect.create_connect_args(url)[1]
    return {name: str(value) for name, value in args.items() if name != "context"}


@pytest.mark.parametrize(
    ("port", "expected"),
    [("5433", {"port": "5433"}), ("", {})],
    ids=["with-port", "default-port"],
)
def test_a_unix_socket_directory_as_host_is_reached_as_django_reaches_it(
    port: str, expected: dict[str, str]
) -> None:
    """Before, the directory became part of the database's name (no host, no port)."""
    database = {"NAME": "shop", "HOST": "/var/run/postgresql", "PORT": port}
    assert _connects_with(database) == {
        "dbname": "shop",
        "host": "/var/run/postgresql",
        **expected,
    }


def test_host_port_and_user_win_over_options_as_in_django() -> None:
    """Django's postgresql backend sets HOST, PORT, USER and PASSWORD over the same
    OPTIONS, and an OPTIONS dbname over NAME; before, the store let OPTIONS win for all."""
    database = {
        "NAME": "shop",
        "USER": "shop",
        "HOST": "primary.db",
        "PORT": "5432",
        "OPTIONS": {"host": "other.db", "port": "6432", "user": "x", "sslmode": "require"},
    }
    assert _connects_with(database) == {
        "dbname": "shop",
        "user": "shop",
        "host": "primary.db",
        "port": "5432",
        "sslmode": "require",
    }
    renamed = {"NAME": "shop", "OPTIONS": {"dbname": "shop_replica"}}
    assert _connects_with(renamed) == {"dbname": "shop_replica"}


@pytest.mark.parametrize("engine", [POSTGRESQL, SQLITE])
def test_an_alias_with_autocommit_off_is_refused(engine: str) -> None:
    """Django's atomic() never commits there: a fenced effect's writes would be lost."""
    database = {
        "ENGINE": engine,
        "NAME": "/srv/db.sqlite3",
        "AUTOCOMMIT": False,
        "OPTIONS": {"transaction_mode": "IMMEDIATE"} if engine == SQLITE else {},
    }
    with pytest.raises(ConfigurationError, match=r'"AUTOCOMMIT": False.*remove AUTOCOMMIT'):
        store_url_from_database(database, "default")


def test_a_postgresql_alias_at_another_isolation_level_is_refused() -> None:
    database = {
        "ENGINE": POSTGRESQL,
        "NAME": "shop",
        "OPTIONS": {"isolation_level": psycopg.IsolationLevel.SERIALIZABLE},
    }
    with pytest.raises(ConfigurationError, match=r"SERIALIZABLE.*READ COMMITTED"):
        store_url_from_database(database, "default")


def test_psycopg2_alone_is_refused_naming_the_driver_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        django_store.importlib.util,
        "find_spec",
        lambda name, *rest: None if name == "psycopg" else real(name, *rest),
    )
    with pytest.raises(ConfigurationError, match=r"psycopg2 .*pip install 'psycopg\[binary\]'"):
        store_url_from_database({"ENGINE": POSTGRESQL, "NAME": "shop"}, "default")


def test_an_immediate_sqlite_file_is_the_store() -> None:
    database = {
        "ENGINE": SQLITE,
        "NAME": "/srv/shop/db.sqlite3",
        "OPTIONS": {"transaction_mode": "IMMEDIATE"},
    }
    assert store_url_from_database(database, "default") == "sqlite:////srv/shop/db.sqlite3"


@pytest.mark.parametrize(
    ("database", "told"),
    [
        (
            {"NAME": "/srv/db.sqlite3", "OPTIONS": {}},
            '"OPTIONS": {"transaction_mode": "IMMEDIATE"}',
        ),
        (
            {"NAME": "/srv/db.sqlite3", "OPTIONS": {"transaction_mode": "EXCLUSIVE"}},
            "EXCLUSIVE transactions",
        ),
        ({"NAME": "db.sqlite3"}, "relative"),
        ({"NAME": ":memory:"}, "in-memory"),
        ({"NAME": "file:memorydb_default?mode=memory&cache=shared"}, "TEST's NAME"),
    ],
    ids=["deferred", "exclusive", "relative", "memory", "django-test-memory"],
)
def test_a_sqlite_alias_the_workers_cannot_share_safely_is_refused(
    database: dict[str, Any], told: str
) -> None:
    options = database.pop("OPTIONS", {"transaction_mode": "IMMEDIATE"})
    with pytest.raises(ConfigurationError) as caught:
        store_url_from_database({"ENGINE": SQLITE, **database, "OPTIONS": options}, "shop")
    assert told in str(caught.value) and "DATABASES['shop']" in str(caught.value)


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("", "in-memory"),
        (":memory:", "in-memory"),
        ("file:shop?mode=memory&cache=shared", "in-memory"),
        ("/srv/shop?mode=memory", "in-memory"),
        ("shop.sqlite3", "relative"),
        ("/srv/shop.sqlite3", None),
    ],
)
def test_a_store_url_and_an_alias_refuse_the_same_sqlite_paths(path: str, why: str | None) -> None:
    """One rule (``store.databases.sqlite_unshared``): a path one way refuses, the other
    does not take."""
    alias = {"ENGINE": SQLITE, "NAME": path, "OPTIONS": {"transaction_mode": "IMMEDIATE"}}
    refusals = []
    for build in (
        lambda: store_url_from_database(alias, "shop"),
        lambda: checked_url(f"sqlite:///{path}"),
    ):
        try:
            build()
        except ConfigurationError as refused:
            refusals.append(str(refused))
    if why is None:
        assert refusals == []
    else:
        assert len(refusals) == 2, refusals
        told = "in-memory" if why == "in-memory" else "is relative"
        assert told in refusals[0], refusals[0]
        assert ("every worker process opens" if why == "in-memory" else told) in refusals[1]


def test_another_database_is_refused_naming_its_engine() -> None:
    with pytest.raises(ConfigurationError, match=r"django\.db\.backends\.oracle.*PostgreSQL"):
        store_url_from_database({"ENGINE": "django.db.backends.oracle"}, "default")


def test_a_url_and_an_alias_together_are_refused() -> None:
    conf = {
        "agboss_database_url": "sqlite:////tmp/a.db",
        "agboss_django_database": "default",
        "agboss_pseudonym_key": "k" * 32,
    }
    with pytest.raises(ConfigurationError, match="set one of them"):
        settings_from_conf(conf, environ={})


def test_without_a_url_outside_django_the_message_names_both_ways() -> None:
    with pytest.raises(ConfigurationError) as caught:
        settings_from_conf({"agboss_pseudonym_key": "k" * 32}, environ={})
    assert "agboss_database_url is not set" in str(caught.value)
    assert "'celery_agboss.contrib.django' to INSTALLED_APPS" in str(caught.value)
