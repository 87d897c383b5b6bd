"""What a worker says about its store when it starts, and until the store answers.

Celery logs "ready" once its consumer runs, whether or not celery_agboss's store
answers; a worker whose database is down, or whose tables were never made, would start
silently and only fail delivery after delivery. When the worker is ready, a daemon
thread of its main process reads the store once. If that fails it says so (an
``ERROR`` naming what to do: check ``agboss_database_url`` and the database, or run
``agboss migrate``) and tries again, backing off to every 30 s, until the store answers;
then it says that too. Nothing waits for it: deliveries meanwhile stop at their first
store call and are retried (``execution.store-failed``), never run without the store.
A store newer than this code (a rollback, an old worker left running) is said, and
deliveries go on; the sweep skips its retention step on such a store
(``SweepRun.retention``: older keep rules would delete rows the newer version keeps).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery import signals as celery_signals

from celery_agboss.core.log_events import STORE_ANSWERS, STORE_UNREACHABLE, log_event
from celery_agboss.errors import StoreError, StoreUnavailableError
from celery_agboss.runtime.app_runtime import Runtime, app_argument
from celery_agboss.store.audit_trail import LAST_SWEEP_KEY
from celery_agboss.store.migrate import current_revision, head_revision, is_known_revision

logger = logging.getLogger("celery_agboss")

FIRST_RETRY_SECONDS = 1.0
LAST_RETRY_SECONDS = 30.0
REPEAT_EVERY_ATTEMPTS = 10
"""While the store stays down, the error is said again every this many tries."""
JOIN_SECONDS = 5.0


class SchemaBehind(Exception):
    """The store answers, at another revision than this version's schema: an older one,
    or (``ahead``) one a newer version of celery_agboss migrated it to."""

    def __init__(self, revision: str | None, head: str) -> None:
        self.ahead = revision is not None and not is_known_revision(revision)
        newer = " (a newer version of celery_agboss migrated it)" if self.ahead else ""
        super().__init__(f"its tables are at revision {revision}{newer}, this version needs {head}")
        self.revision = revision
        self.head = head


def probe(runtime: Runtime) -> StoreError | SchemaBehind | None:
    """Read one of celery_agboss's own rows and the schema's revision: the store answers,
    and holds the tables this version writes."""
    try:
        runtime.executions.get_meta(LAST_SWEEP_KEY)
        revision = current_revision(runtime.store.engine)
    except StoreError as exc:
        return exc
    head = head_revision()
    return None if revision == head else SchemaBehind(revision, head)


def _hint(runtime: Runtime, error: StoreError | SchemaBehind) -> str:
    command = f"celery -A {app_argument(runtime.app)} agboss migrate"
    if runtime.settings.django_database is not None:
        command = "python manage.py migrate"
    if isinstance(error, SchemaBehind) and error.ahead:
        return (
            "this code is older than its store: deploy the version that migrated it (a "
            "migration is never undone by running older code); meanwhile its deliveries "
            "run and its sweep skips retention"
        )
    if isinstance(error, SchemaBehind):
        return (
            "deliveries would fail on what the upgrade adds: run "
            f"`{command}` (once per deploy), then the worker goes on by itself"
        )
    if isinstance(error, StoreUnavailableError):
        return (
            "no payment can start until it answers (deliveries are retried, publishes "
            "refused); check agboss_database_url and that the database is up"
        )
    return (
        "it answers but cannot read celery_agboss's tables: were they created? Run "
        f"`{command}` (once per deploy), then the worker goes on by itself"
    )


class StoreCheck:
    """The worker's check of its store: once at ready, then until it answers."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="agboss-store-check", daemon=True)

    def _run(self) -> None:
        url = self.runtime.settings.redacted_database_url()
        delay = FIRST_RETRY_SECONDS
        attempts = 0
        while not self.stop.is_set():
            attempts += 1
            error = probe(self.runtime)
            if error is None:
                if attempts > 1:
                    log_event(STORE_ANSWERS, logging.INFO, url=url, attempts=attempts)
                return
            if attempts == 1 or attempts % REPEAT_EVERY_ATTEMPTS == 0:
                log_event(
                    STORE_UNREACHABLE,
                    logging.ERROR,
                    f"the store does not answer as it should ({error}); "
                    f"{_hint(self.runtime, error)}. Trying again every {delay:g} s",
                    url=url,
                    error=type(error).__name__,
                    attempts=attempts,
                )
            if self.stop.wait(delay):
                return
            delay = min(delay * 2, LAST_RETRY_SECONDS)


def install(runtime: Runtime) -> None:
    """Called by ``AGBoss(app)``: this app's workers check their store when ready."""
    app = runtime.app
    checks: list[StoreCheck] = []

    def on_worker_ready(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is not app or checks:
            return
        settings = runtime.settings
        logger.info(
            "celery_agboss store: %s (lease ttl %.0f s, sweep every %.0f s)",
            settings.redacted_database_url(),
            settings.lease_ttl_seconds,
            settings.sweep_interval_seconds,
        )
        check = StoreCheck(runtime)
        checks.append(check)
        check.thread.start()

    def on_worker_shutdown(**_: Any) -> None:
        for check in checks:
            check.stop.set()
            check.thread.join(JOIN_SECONDS)

    runtime.listen(celery_signals.worker_ready, on_worker_ready)
    runtime.listen(celery_signals.worker_shutdown, on_worker_shutdown)


__all__ = ["SchemaBehind", "install", "probe"]
