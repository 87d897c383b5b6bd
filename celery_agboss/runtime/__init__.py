"""The runtime floor: what the Celery layer leans on for one app.

``settings`` (the frozen ``agboss_*`` settings), ``messages`` (an execution's
message) and ``app_runtime`` (``Runtime``: the registry, this process's store,
execution verbs and lease renewer). ``Runtime`` (``Runtime.of(app)``: an app's runtime)
is named here for the layers above.
"""

from __future__ import annotations

from celery_agboss.runtime.app_runtime import Runtime

__all__ = ["Runtime"]
