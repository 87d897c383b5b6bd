"""The celery_agboss tables as they are at Alembic revision 0007.

Not atomic: the upgrade runs on a connection of its own (the one schema, written once,
in the Alembic revisions), which on SQLite must not wait behind a write lock that
Django's migration transaction holds.
"""

from __future__ import annotations

from django.db import migrations

from celery_agboss.contrib.django.schema import UpgradeStore


class Migration(migrations.Migration):  # type: ignore[misc]  # Django ships no types
    initial = True
    atomic = False
    dependencies: list[tuple[str, str]] = []
    operations = [UpgradeStore("0007")]
