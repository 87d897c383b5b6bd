"""``AGBoss(app)``: binds celery_agboss to one Celery app.

``AGBoss`` is the app's ``Runtime`` (settings, registry, the per-process store; see
``celery_agboss.runtime``) and the one place that installs the rest on top of it:
the signals (publish records, revoke recording, worker start-up; ``signals``), the
sweep (its task, beat entry and watch; ``sweep``), the worker's metrics endpoint
when ``agboss_metrics_port`` asks for it (``metrics``), the worker's check of its
store at start (``worker.store_check``) and publisher confirms on RabbitMQ unless the
app set ``confirm_publish`` itself (``runtime.broker_defaults``). ``AGBoss(app)`` twice
gives the same object.
"""

from __future__ import annotations

from typing import Any

from celery_agboss import signals, sweep
from celery_agboss.metrics import worker as metrics_worker
from celery_agboss.runtime import broker_defaults
from celery_agboss.runtime.app_runtime import _APP_ATTRIBUTE, Runtime
from celery_agboss.worker import held_messages, store_check


class AGBoss(Runtime):
    """celery_agboss for one Celery app; ``AGBoss(app)`` twice gives the same object."""

    def __new__(cls, app: Any) -> AGBoss:
        if not hasattr(app, "on_after_configure") or not hasattr(app, "conf"):
            raise TypeError(
                f"AGBoss(app) takes the Celery app (celery.Celery) to protect, not {app!r}"
            )
        existing = getattr(app, _APP_ATTRIBUTE, None)
        if isinstance(existing, AGBoss):
            return existing
        self = super().__new__(cls)
        self._init_runtime(app)
        broker_defaults.install(self)  # before any connection of this process is made
        signals.connect(self)
        sweep.install(self)
        metrics_worker.install(self)
        store_check.install(self)
        held_messages.install(self)
        if app.configured:
            self._configured()
        else:
            app.on_after_configure.connect(self._on_after_configure, weak=False)
        return self

    def _on_after_configure(self, sender: Any = None, **_: Any) -> None:
        if sender is self.app:
            self._configured()


__all__ = ["AGBoss"]
