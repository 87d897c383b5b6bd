"""Throwaway PostgreSQL databases, copied from a template built once per session.

A template is prepared once (for example: migrated to the latest schema), closed
to connections, and then each test gets its own copy through
``CREATE DATABASE … TEMPLATE …``, which takes milliseconds. Every database made
here is named ``agboss_t_<pid>_<n>`` or ``agboss_tpl_<pid>_<name>`` and dropped
with ``DROP DATABASE … WITH (FORCE)``; ones left by a crashed run (whose pid no
longer runs) are dropped by :func:`drop_stale_databases`.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Callable
from dataclasses import dataclass

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow
from sqlalchemy.engine import make_url

from tests.support.services import libpq_url

CLONE_PREFIX = "agboss_t_"
TEMPLATE_PREFIX = "agboss_tpl_"
_MAX_IDENTIFIER = 63
_counter = itertools.count(1)


@dataclass(frozen=True)
class TemplateDatabase:
    """A prepared database that clones are copied from."""

    admin_url: str
    name: str

    @property
    def url(self) -> str:
        return database_url(self.admin_url, self.name)


def database_url(admin_url: str, name: str) -> str:
    """``admin_url`` (a SQLAlchemy URL) pointing at database ``name`` instead."""
    return make_url(admin_url).set(database=name).render_as_string(hide_password=False)


def database_name(url: str) -> str:
    """The database part of a SQLAlchemy URL."""
    name = make_url(url).database
    if not name:
        raise ValueError(f"no database in {url!r}")
    return name


def admin_connection(admin_url: str) -> psycopg.Connection[TupleRow]:
    return psycopg.connect(libpq_url(admin_url), autocommit=True, connect_timeout=5)


def create_template(admin_url: str, name: str, prepare: Callable[[str], None]) -> TemplateDatabase:
    """Create an empty database, run ``prepare(url)`` on it, then freeze it as a template.

    Connections that ``prepare`` left open are terminated, and the template then
    accepts none, so that copying it never finds it busy.
    """
    slug = re.sub(r"[^a-z0-9_]+", "_", name.lower()).strip("_") or "template"
    db_name = f"{TEMPLATE_PREFIX}{os.getpid()}_{slug}"[:_MAX_IDENTIFIER]
    template = TemplateDatabase(admin_url=admin_url, name=db_name)
    with admin_connection(admin_url) as conn:
        _drop(conn, db_name)
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db_name)))
    try:
        prepare(template.url)
        _forget_the_place(template.url)
        with admin_connection(admin_url) as conn:
            conn.execute(
                sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS false IS_TEMPLATE true").format(
                    sql.Identifier(db_name)
                )
            )
            _terminate_connections(conn, db_name)
    except BaseException:
        drop_database(admin_url, db_name)
        raise
    return template


def _forget_the_place(url: str) -> None:
    """Each clone is a test's own store, not a copy of the template: the place a migrated
    template's deployment id was minted at is forgotten, so no clone warns that it is a
    copy (``celery_agboss.store.deployment.PlaceCheck``)."""
    with psycopg.connect(libpq_url(url), autocommit=True, connect_timeout=5) as conn:
        conn.execute(
            "DO $$ BEGIN IF to_regclass('agboss_meta') IS NOT NULL THEN "
            "DELETE FROM agboss_meta WHERE key = 'deployment.place'; END IF; END $$"
        )


def clone_database(template: TemplateDatabase) -> str:
    """A new database copied from ``template``; returns its URL (same form as the admin URL)."""
    name = f"{CLONE_PREFIX}{os.getpid()}_{next(_counter)}"
    with admin_connection(template.admin_url) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template.name)
            )
        )
    return database_url(template.admin_url, name)


def drop_database(admin_url: str, name: str) -> None:
    """Drop database ``name`` (and whatever is connected to it), if it exists."""
    with admin_connection(admin_url) as conn:
        _drop(conn, name)


def drop_template(template: TemplateDatabase) -> None:
    drop_database(template.admin_url, template.name)


def drop_stale_databases(admin_url: str) -> list[str]:
    """Drop the databases this module made in runs whose process is gone."""
    with admin_connection(admin_url) as conn:
        rows = conn.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE 'agboss\\_t%'"
        ).fetchall()
        stale = [str(name) for (name,) in rows if _owner_is_gone(str(name))]
        for name in stale:
            _drop(conn, name)
    return stale


def _owner_is_gone(name: str) -> bool:
    match = re.match(rf"^(?:{CLONE_PREFIX}|{TEMPLATE_PREFIX})(\d+)_", name)
    if match is None:
        return False
    pid = int(match.group(1))
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, owned by someone else
        return False
    return False


def _drop(conn: psycopg.Connection[TupleRow], name: str) -> None:
    exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
    if exists is None:
        return
    # A template cannot be dropped; FORCE ends the sessions still connected.
    conn.execute(sql.SQL("ALTER DATABASE {} IS_TEMPLATE false").format(sql.Identifier(name)))
    conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def _terminate_connections(conn: psycopg.Connection[TupleRow], name: str) -> None:
    conn.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE datname = %s AND pid <> pg_backend_pid()",
        (name,),
    )
