"""The project's settings: what docs/django.md asks for, the database from the test."""

from __future__ import annotations

import json
import os

_TEST = json.loads(os.environ.get("AGBOSS_DJANGO_TEST", "{}"))

SECRET_KEY = "django-shop-tests-only"
USE_TZ = True
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "celery_agboss.contrib.django",
    "tests.support.django_shop.orders",
]
DATABASES = {"default": _TEST.get("database", {})}
if _TEST.get("other_database"):  # a second alias, which fenced effects may only read
    DATABASES["reports"] = _TEST["other_database"]

CELERY_BROKER_URL = _TEST.get("broker_url", "memory://")
CELERY_TASK_DEFAULT_QUEUE = _TEST.get("queue", "celery")
CELERY_AGBOSS_PSEUDONYM_KEY = "django-shop-tests-only"
CELERY_AGBOSS_LEASE_TTL = 5
CELERY_AGBOSS_RETRY_DELAY = 1
CELERY_AGBOSS_SWEEP_INTERVAL = 0
CELERY_AGBOSS_OUTBOX_GRACE = 1
