"""The runtime floor: what the Celery layer leans on for one app.

``settings`` (the frozen ``agboss_*`` settings), ``messages`` (an execution's
message) and ``app_runtime`` (``Runtime``: the registry, this process's store,
execution verbs and lease renewer). ``Runtime``, ``runtime_of`` and ``app_argument``
are public under ``celery_agboss.runtime`` (docs/api.md), so they are named here.
"""

from __future__ import annotations

from celery_agboss.runtime.app_runtime import Runtime, app_argument, runtime_of

__all__ = ["Runtime", "app_argument", "runtime_of"]
