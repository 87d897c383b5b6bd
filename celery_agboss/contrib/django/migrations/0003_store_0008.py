"""The celery_agboss tables at Alembic revision 0008 (steps undone before 0006 marked
undone; no schema change). Not atomic, for the reason 0001 gives."""

from __future__ import annotations

from django.db import migrations

from celery_agboss.contrib.django.schema import UpgradeStore


class Migration(migrations.Migration):  # type: ignore[misc]  # Django ships no types
    atomic = False
    dependencies = [
        ("agboss", "0002_admin_models"),
    ]
    operations = [UpgradeStore("0008")]
