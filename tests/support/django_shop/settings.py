"""The project's settings: what docs/django.md asks for, the database from the test."""

from __future__ import annotations

import json
import os

_TEST = json.loads(os.environ.get("AGBOSS_DJANGO_TEST", "{}"))

SECRET_KEY = "django-shop-tests-only"
USE_TZ = True
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "celery_agboss.contrib.django",
    "tests.support.django_shop.orders",
]
DATABASES = {"default": _TEST.get("database", {})}
if _TEST.get("conn_max_age"):  # persistent connections, kept across tasks: Celery's
    # Django fix-up closes them around every task unless CELERY_DB_REUSE_MAX is set.
    DATABASES["default"]["CONN_MAX_AGE"] = _TEST["conn_max_age"]
    CELERY_DB_REUSE_MAX = 10
if _TEST.get("other_database"):  # a second alias, which fenced effects may only read
    DATABASES["reports"] = _TEST["other_database"]

if _TEST.get("store_url"):  # the store by URL, not by alias (the admin says what to do)
    CELERY_AGBOSS_DATABASE_URL = _TEST["store_url"]
CELERY_BROKER_URL = _TEST.get("broker_url", "memory://")
CELERY_TASK_DEFAULT_QUEUE = _TEST.get("queue", "celery")
CELERY_AGBOSS_PSEUDONYM_KEY = "django-shop-tests-only"
CELERY_AGBOSS_LEASE_TTL = 5
CELERY_AGBOSS_RETRY_DELAY = 1
CELERY_AGBOSS_SWEEP_INTERVAL = 0
CELERY_AGBOSS_OUTBOX_GRACE = 1

# The admin (tests/django/test_django_admin.py): served by the test client and by
# ``runserver`` for the headless browser.
ROOT_URLCONF = "tests.support.django_shop.urls"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
DEBUG = False
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
STATIC_URL = "/static/"
