"""The project's Celery app: docs/django.md's ``proj/celery.py``, as written there."""

from __future__ import annotations

import os

from celery import Celery

from celery_agboss import AGBoss

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")

app = Celery("proj")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
AGBoss(app)
