"""Alembic environment for celery_agboss's tables.

Run through ``celery_agboss.store.migrate.migrate`` (which passes an open
connection in ``config.attributes["connection"]``), or by ``alembic`` with
``sqlalchemy.url`` set. Its version table is ``agboss_alembic_version``, so it
never collides with the application's own Alembic history in the same database.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

from celery_agboss.store.metadata import metadata
from celery_agboss.store.schema import metadata as _registered  # noqa: F401 (tables)

VERSION_TABLE = "agboss_alembic_version"


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )


def run_migrations_online() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    from celery_agboss.store.databases import create_store_engine

    url = context.config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("set sqlalchemy.url, or pass a connection in config.attributes")
    engine = create_store_engine(url)
    try:
        with engine.connect() as conn:
            _configure(conn)
            with context.begin_transaction():
                context.run_migrations()
            conn.commit()
    finally:
        engine.dispose()


def run_migrations_offline() -> None:
    context.configure(
        url=context.config.get_main_option("sqlalchemy.url"),
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        literal_binds=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
