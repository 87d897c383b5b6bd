"""The celery_agboss tables at Alembic revision 0009 (the sweep's index of completed
executions whose links may never have gone out). Not atomic, for the reason 0001 gives."""

from __future__ import annotations

from django.db import migrations

from celery_agboss.contrib.django.schema import UpgradeStore


class Migration(migrations.Migration):  # type: ignore[misc]  # Django ships no types
    atomic = False
    dependencies = [
        ("agboss", "0003_store_0008"),
    ]
    operations = [UpgradeStore("0009")]
