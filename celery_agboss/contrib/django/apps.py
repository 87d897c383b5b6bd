"""The Django app of celery_agboss: its label is ``agboss``, its migrations the store's."""

from __future__ import annotations

from django.apps import AppConfig

from celery_agboss.contrib.django.fence import transactions_on
from celery_agboss.runtime.django_store import register_users_database


class AgbossConfig(AppConfig):  # type: ignore[misc]  # Django ships no types
    name = "celery_agboss.contrib.django"
    label = "agboss"
    verbose_name = "Payments (celery_agboss)"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        register_users_database(transactions_on)
