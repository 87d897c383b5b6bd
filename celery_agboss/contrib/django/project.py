"""The project's Celery app and the alias its store is, as the admin and ``manage.py
agboss`` find them: the current Celery app once Django loaded the project (Celery's
Django guide imports it in the project package's ``__init__``), carrying ``AGBoss``."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured

from celery_agboss.errors import ConfigurationError

NO_AGBOSS = (
    "import your Celery app in your project's __init__.py (`from .celery import app as "
    "celery_app`), as Celery's Django guide does, and call AGBoss(app) on it"
)


def project_app() -> Any:
    """The project's Celery app; ``ImproperlyConfigured`` when it has no ``AGBoss``."""
    from celery import current_app

    from celery_agboss.runtime.app_runtime import Runtime

    app = current_app._get_current_object()
    try:
        Runtime.of(app)
    except ConfigurationError:
        raise ImproperlyConfigured(
            f"the current Celery app ({app.main or 'the default app'}) has no AGBoss: " + NO_AGBOSS
        ) from None
    return app


def store_alias() -> str:
    """The ``DATABASES`` alias the store is: what the admin's models are read from."""
    from celery_agboss.runtime.app_runtime import Runtime

    alias = Runtime.of(project_app()).settings.django_database
    if alias is None:
        raise ImproperlyConfigured(
            "the celery_agboss admin reads the store through Django, but the store is "
            "agboss_database_url: remove that setting so the store is a DATABASES alias "
            "(agboss_django_database, default 'default'), or operate it with "
            "`python manage.py agboss …`"
        )
    return alias
