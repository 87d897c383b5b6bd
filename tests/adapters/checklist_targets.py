"""What ``celery -A tests.adapters.checklist_targets:app agboss checklist`` is pointed at
in tests: a plain Celery app, and adapters built on the fake named by an environment
variable (as a team's module would read its sandbox credentials)."""

from __future__ import annotations

import os
from typing import Any

from celery import Celery

URL_ENV = "AGBOSS_CHECKLIST_FAKE_URL"

app = Celery("checklist_targets", broker="memory://")


def stripe_on_fake() -> Any:
    from tests.adapters.stripe_support import adapter_for

    return adapter_for(os.environ[URL_ENV])


def adyen_on_fake() -> Any:
    from tests.adapters.adyen_support import adapter_for

    return adapter_for(os.environ[URL_ENV])


not_an_adapter = object()
