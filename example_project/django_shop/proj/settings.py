"""The example Django shop's settings: what docs/django.md asks for, with demo defaults.

Everything a process must agree on comes from the environment, so ``manage.py``, the
Celery worker and ``runserver`` (which ``manage.py rundemo`` starts) read the same values:

- ``DJANGO_SHOP_DATABASE``: the SQLite file (default ``db.sqlite3`` next to
  ``manage.py``). It holds the shop's tables and celery_agboss's store, one database.
- ``CELERY_BROKER_URL``: the broker (default Redis on 127.0.0.1, database 0).
- ``STRIPE_API_KEY``, ``STRIPE_API_BASE``: the gateway. The defaults are the fake Stripe
  ``manage.py rundemo`` runs on 127.0.0.1:12111; a test-mode key and
  ``https://api.stripe.com`` would be Stripe's sandbox. Stripe is named only to identify
  its public API; no affiliation or endorsement.

The defaults of the secrets are demo values, not secrets: set ``DJANGO_SECRET_KEY`` and
``AGBOSS_PSEUDONYM_KEY`` anywhere but on your own machine.
"""

from __future__ import annotations

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "django-shop-demo-key-not-a-secret")
DEBUG = os.environ.get("DJANGO_DEBUG") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "celery_agboss.contrib.django",
    "shop",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "proj.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# One SQLite file, at an absolute path, with immediate transactions: the store's fence
# needs SQLite's write lock taken at BEGIN (docs/django.md refuses it otherwise).
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": Path(os.environ.get("DJANGO_SHOP_DATABASE") or BASE_DIR / "db.sqlite3").resolve(),
        "OPTIONS": {"transaction_mode": "IMMEDIATE"},
        "TEST": {"NAME": BASE_DIR / "test.sqlite3"},
    }
}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "static/"

# Celery and celery_agboss, read through the app's namespace="CELERY".
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0")
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_AGBOSS_PSEUDONYM_KEY = os.environ.get(
    "AGBOSS_PSEUDONYM_KEY", "django-shop-demo-pseudonym-key-not-a-secret"
)

STRIPE_API_KEY = os.environ.get("STRIPE_API_KEY", "sk_test_agboss_fake_gateway")
STRIPE_API_BASE = os.environ.get("STRIPE_API_BASE", "http://127.0.0.1:12111")
