"""The Celery signals ``AGBoss(app)`` connects, each bound to that app.

- ``before_task_publish``: every ``PaymentTask`` message is recorded ``REQUESTED``
  (with its ETA, expiry and publish options) before it reaches the broker, so a
  message lost before any worker starts it is still known (design: trap 9). It fires for
  ``send_task`` too (by name: ``agboss_payment_tasks`` lists names a process knows
  without importing them), and for retries and re-publishes (which refresh the
  message). A publish the store cannot record is refused: the caller gets
  ``PublishRefusedError`` and nothing reaches the broker. A recorded message carries
  the header ``agboss_recorded`` (why it was taken for a ``PaymentTask``).
- ``task_prerun``: a recorded message that reaches a task which is not a
  ``PaymentTask`` (a plain task matching ``agboss_payment_tasks``, an old worker of a
  rolling deploy) ends its execution ``UNMANAGED`` before that task runs, logged once
  with the task's name and why it was recorded; the sweep never re-publishes it.
- ``worker_init`` and ``beat_init``: a worker or beat refuses to start on a wrong
  configuration, saying why once; a worker started by a test inherits the protections
  it switched off (``AGBOSS_SABOTAGE``, refused outside tests), and reads the tenant (on
  a store without its deployment id it says to migrate, and its deliveries are retried
  until then); ``worker_ready`` logs the tenant. What a
  worker says about its store at start is ``celery_agboss.worker.store_check``.
- ``worker_process_init``: a forked child drops the connections it inherited.
- ``worker_shutting_down``: logged; running bodies keep their leases until they
  return (a warm shutdown waits for them; a cold one leaves the lease to expire).
- ``task_revoked``: a revoked execution that never started is cancelled (or
  expired); a running one gets a cancel request.
- ``app.control.revoke`` (and so ``AsyncResult.revoke``) records the revoke in the
  store before broadcasting it: a broadcast reaches only the workers running at that
  moment, while a recorded cancel request is honoured by every later delivery and by
  the sweep (design: cancel request).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from celery import signals as celery_signals

from celery_agboss.runtime.app_runtime import Runtime
from celery_agboss.signals import body_publishes, publish, revokes, worker
from celery_agboss.signals.publish import RECORDED_HEADER
from celery_agboss.signals.revokes import install_revoke_recorder
from celery_agboss.signals.worker import (
    refuse_to_start_unless_configured as refuse_to_start_unless_configured,
)

_HANDLERS: dict[Any, Callable[..., None]] = {
    celery_signals.before_task_publish: publish.before_task_publish,
    celery_signals.worker_init: worker.worker_init,
    celery_signals.worker_ready: worker.worker_ready,
    celery_signals.beat_init: worker.beat_init,
    celery_signals.worker_process_init: worker.worker_process_init,
    celery_signals.worker_shutting_down: worker.worker_shutting_down,
    celery_signals.task_revoked: revokes.task_revoked,
    celery_signals.task_prerun: worker.task_prerun,
}
"""Each Celery signal this app listens to, and the handler (its first argument the app)."""


def connect(runtime: Runtime) -> None:
    """Connect this app's handlers (strong references: they live as long as the app)."""
    for signal, handler in _HANDLERS.items():
        runtime.listen(signal, functools.partial(handler, runtime))
    publish.refuse_unrecorded_publishes(runtime)
    install_revoke_recorder(runtime)
    body_publishes.install()


def disconnect(runtime: Runtime) -> None:
    """Disconnect every handler this app connected, its workers' threads' included
    (tests that build many apps in one process)."""
    for signal, handler in getattr(runtime, "_listening", []):
        signal.disconnect(handler)
    runtime._listening = []


__all__ = ["RECORDED_HEADER", "connect", "disconnect"]
