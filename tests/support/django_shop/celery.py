"""The project's Celery app, as Celery's Django guide writes it, with ``AGBoss`` on it."""

from __future__ import annotations

import os

from celery import Celery

from celery_agboss import AGBoss
from celery_agboss.core import sabotage

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.support.django_shop.settings")

app = Celery("django_shop")
app.config_from_object("django.conf:settings", namespace="CELERY")
AGBoss(app)
sabotage.activate_from_environment()  # a twin's worker only (AGBOSS_SABOTAGE)

from tests.support.django_shop import tasks  # noqa: E402,F401 (registers the tasks)
