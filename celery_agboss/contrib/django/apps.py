"""The Django app of celery_agboss: its label is ``agboss``, its migrations the store's."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate

from celery_agboss.contrib.django.fence import transactions_on
from celery_agboss.runtime.django_store import register_users_database


class AgbossConfig(AppConfig):  # type: ignore[misc]  # Django ships no types
    name = "celery_agboss.contrib.django"
    label = "agboss"
    verbose_name = "Payments (celery_agboss)"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        register_users_database(transactions_on)
        post_migrate.connect(_after_migrate, sender=self, dispatch_uid="agboss.retention")


def _after_migrate(using: str, **_: Any) -> None:
    """Every ``manage.py migrate`` records this version's retention-rules generation, as
    ``agboss migrate`` does (design: retention)."""
    # Imported here: Alembic loads when migrate runs, not in every web process.
    from celery_agboss.contrib.django.schema import record_retention_generation_on

    record_retention_generation_on(using)
