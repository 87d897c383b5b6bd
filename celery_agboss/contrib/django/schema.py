"""``manage.py migrate`` runs the store's own migrations, so there is one schema.

The tables are made by the Alembic revisions ``agboss migrate`` runs
(``celery_agboss.store.migrate``): a Django migration of this app upgrades the
database it is applied to up to one revision, on a connection of its own built from
that database's settings (under Django's test runner, the test database). The upgrade
is idempotent, so a store ``agboss migrate`` made is simply adopted, and a later
Django migration of this app names the later revision. Irreversible: going back would
drop payment records, which no ``migrate agboss zero`` should do by accident.

Every ``manage.py migrate`` then records this version's retention-rules generation on
the databases the app migrates to (``record_retention_generation_on``, from the app's
``post_migrate``): a version that raises it without a store revision ships no Django
migration, and an older sweep would go on deleting by older keep rules.
"""

from __future__ import annotations

from typing import Any

from django.db import connections, router
from django.db.migrations.operations.base import Operation

from celery_agboss.runtime.django_store import store_url_from_database
from celery_agboss.store.migrate import migrate, record_retention_generation_at


class UpgradeStore(Operation):  # type: ignore[misc]  # Django ships no types
    """Upgrade the celery_agboss tables to Alembic ``revision``."""

    reversible = False
    reduces_to_sql = False  # `sqlmigrate` says so instead of running it

    def __init__(self, revision: str) -> None:
        self.revision = revision

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        return (self.__class__.__qualname__, [self.revision], {})

    def state_forwards(self, app_label: str, state: Any) -> None:
        """No model state: the tables are the store's, not Django models."""

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        connection = schema_editor.connection
        if not router.allow_migrate(connection.alias, app_label):
            return
        migrate(store_url_from_database(connection.settings_dict, connection.alias), self.revision)

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        raise NotImplementedError("the celery_agboss tables are never dropped by a migration")

    def describe(self) -> str:
        return f"Upgrade the celery_agboss tables to store revision {self.revision}"

    @property
    def migration_name_fragment(self) -> str:
        return f"agboss_store_{self.revision}"


def record_retention_generation_on(alias: str) -> None:
    """This version's retention-rules generation on the database at ``alias`` when this app
    migrates to it (the router's answer, as for ``UpgradeStore``) and its store exists."""
    if not router.allow_migrate(alias, "agboss"):
        return
    connection = connections[alias]
    record_retention_generation_at(store_url_from_database(connection.settings_dict, alias))
