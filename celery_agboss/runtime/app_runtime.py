"""What every part of the Celery layer leans on for one app: its settings, its registry
of outbound calls, and this process's store, execution verbs and lease renewer.

``AGBoss(app)`` (``celery_agboss.app``) is a ``Runtime`` that also installs the signals
and the sweep; the modules below it (the task, one delivery, the sweep's steps, the
operator's verbs) take a ``Runtime`` and never import ``app.py``, so the layer has no
import circle. The store is opened lazily in each process: a prefork child never uses
its parent's connections. Two apps in one process have two runtimes and never share a
store.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from celery_agboss.core import tracing
from celery_agboss.core.engine_settings import EngineSettings, OutboundRegistry
from celery_agboss.core.executions import ExecutionRecord
from celery_agboss.core.lease import LeaseRenewer
from celery_agboss.core.log_events import EXECUTION_REPUBLISHED, STORE_OPENED, log_event
from celery_agboss.core.outbound import OutboundCall
from celery_agboss.core.sealing import Sealer
from celery_agboss.errors import ConfigurationError, StoreNotMigratedError
from celery_agboss.runtime.django_store import users_database
from celery_agboss.runtime.known_settings import changed_since, written_settings
from celery_agboss.runtime.messages import republish
from celery_agboss.runtime.settings import AGBossSettings, settings_from_conf
from celery_agboss.store.deployment import read_store_meta
from celery_agboss.store.execution_store import SQLAlchemyExecutionStore
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore

logger = logging.getLogger("celery_agboss")

_APP_ATTRIBUTE = "_agboss"

R = TypeVar("R", bound="Runtime")


@dataclass
class _ProcessStore:
    """The store objects of one process: never carried across a fork."""

    pid: int
    store: SQLAlchemyStore
    executions: SQLAlchemyExecutionStore
    renewer: LeaseRenewer


class Runtime:
    """One app's celery_agboss state; ``Runtime.of(app)`` finds the one bound to ``app``."""

    app: Any
    registry: OutboundRegistry
    _listening: list[tuple[Any, Callable[..., None]]]

    def _init_runtime(self, app: Any) -> None:
        self.app = app
        self.registry = OutboundRegistry()
        self._settings: AGBossSettings | None = None
        self._settings_read_from: dict[str, Any] = {}
        self._engine_settings: EngineSettings | None = None
        # Reentrant: reading conf may configure the app, which calls back in. Made anew
        # in a forked child (_after_fork_in_child): a thread of the parent may have held it.
        self._lock = threading.RLock()
        self._process: _ProcessStore | None = None
        self._when_configured: list[Callable[[AGBossSettings], None]] = []
        self._listening = []
        self.clock_offset_source: Any = None  # tests only: ms added to the database clock
        tracing.install()  # spans when opentelemetry-api is installed; nothing otherwise
        setattr(app, _APP_ATTRIBUTE, self)
        _live_runtimes.add(self)

    @classmethod
    def of(cls: type[R], app: Any) -> R:
        """The runtime bound to ``app`` (a Celery app, or already its runtime);
        ConfigurationError when there is none."""
        if isinstance(app, cls):
            return app
        existing = getattr(app, _APP_ATTRIBUTE, None)
        if not isinstance(existing, cls):
            raise ConfigurationError(
                f"celery_agboss is not set up on the Celery app {getattr(app, 'main', app)!r}: "
                "call AGBoss(app) where the app is created"
            )
        return existing

    # --- settings ------------------------------------------------------------------

    def listen(self, signal: Any, handler: Callable[..., None]) -> None:
        """Connect ``handler`` for as long as this app lives (a strong reference: it is a
        closure), and remember it so ``signals.disconnect`` undoes it too."""
        signal.connect(handler, weak=False)
        self._listening.append((signal, handler))

    def when_configured(self, then: Callable[[AGBossSettings], None]) -> None:
        """Run ``then(settings)`` once the app is configured with valid settings (now, if
        it already is); the sweep installs its beat entry this way."""
        self._when_configured.append(then)
        if self._settings is not None:
            then(self._settings)

    def _configured(self) -> None:
        """The app is configured: read the settings, then run what waited for them."""
        try:
            settings = self._resolve_settings()
        except ConfigurationError as exc:
            # Said once, by whoever uses it: a worker or beat refuses to start with it
            # (signals), a publish is refused with it, a command exits with it. Logged
            # here too, every process would print it once more.
            logger.debug("celery_agboss is not configured: %s", exc)
            return
        for then in list(self._when_configured):
            then(settings)

    def _resolve_settings(self) -> AGBossSettings:
        with self._lock:
            if self._settings is None:
                self._settings = settings_from_conf(self.app.conf)
                self._settings_read_from = written_settings(self.app.conf)
            return self._settings

    @property
    def settings(self) -> AGBossSettings:
        """The frozen settings; raises ConfigurationError saying exactly what to set."""
        if self._settings is not None:
            return self._settings
        return self._resolve_settings()

    def settings_written_after_read(self) -> list[str]:
        """The ``agboss_*`` keys changed in the app's conf since the settings were read:
        their new values are not used (a worker or beat refuses to start on them)."""
        if self._settings is None:
            return []
        return changed_since(self._settings_read_from, self.app.conf)

    @property
    def engine_settings(self) -> EngineSettings:
        """What the engine needs, built once from the settings and this app's registry,
        with the tenant: ``agboss_tenant``, else the store's deployment id (one read; a
        store that cannot answer raises ``StoreError`` and is asked again next time)."""
        if self._engine_settings is None:
            s = self.settings
            # Read outside the lock: a thread waiting on a slow store must not hold it
            # (a process forked meanwhile, or the store's own opening, would wait too).
            # Two threads may both read it: the same value, and the first one is kept.
            tenant = s.tenant if s.tenant is not None else self._store_tenant(s)
            with self._lock:
                if self._engine_settings is None:
                    self._engine_settings = EngineSettings(
                        pseudonym_key=s.pseudonym_key,
                        tenant=tenant,
                        lease_ttl_ms=s.lease_ttl_ms,
                        attempt_timeout_ms=s.attempt_timeout_ms,
                        registry=self.registry,
                    )
        return self._engine_settings

    @property
    def tenant(self) -> str:
        """The first part of every idempotency key of this app (docs/keys.md)."""
        return self.engine_settings.tenant

    def _store_tenant(self, settings: AGBossSettings) -> str:
        """The store's deployment id; never minted here (a store without one was not
        migrated, and a guess could change the keys of payments in flight)."""
        found, sealed = read_store_meta(self.store)
        self.store.sealer.learned(sealed)  # the same read: no statement of its own later
        if found is None:
            raise StoreNotMigratedError(
                f"the store at {settings.redacted_database_url()} holds no deployment id "
                "(the tenant every idempotency key starts with): it was not migrated by "
                "this version of celery_agboss. Run `celery -A proj agboss migrate` "
                "(a worker started before waits for it); a store that already holds "
                "payments keeps the tenant 'default', so no key in flight changes",
                setting="agboss_tenant",
            )
        return found

    # --- outbound calls ------------------------------------------------------------

    def register(self, call: OutboundCall) -> OutboundCall:
        """Make ``call`` known to the sweep before any task used it in this process.

        A worker that only sweeps must know every call whose intents it may reconcile;
        register them where the app is created (tasks register theirs on first use).
        """
        return self.registry.register(call)

    # --- the store, per process ----------------------------------------------------

    def _process_store(self) -> _ProcessStore:
        current = self._process
        pid = os.getpid()
        if current is not None and current.pid == pid:
            return current
        with self._lock:
            current = self._process
            if current is not None and current.pid == pid:
                return current
            if current is not None:
                # Inherited across a fork: forget the parent's pool without closing it.
                current.store.dispose_after_fork()
            settings = self._settings or settings_from_conf(self.app.conf)
            store = SQLAlchemyStore(
                settings.database_url,
                engine_options={"prepared_statements": settings.prepared_statements},
            )
            store.clock_offset_source = self.clock_offset_source
            # Sealed at rest with the ring, or plaintext until the store says it is sealed;
            # what the parent learned of agboss_meta holds for a forked child too.
            known = None if current is None else current.store.sealer.store_sealed
            store.sealer = Sealer(settings.encryption_keys, store_sealed=known)
            if settings.django_database is not None:
                store.users_database = users_database(store.engine, settings.django_database)
            current = _ProcessStore(
                pid=pid,
                store=store,
                executions=SQLAlchemyExecutionStore(
                    store,
                    shared_wait_ms=max(settings.lease_ttl_ms, settings.sweep_interval_ms),
                ),
                renewer=LeaseRenewer.for_store(store),
            )
            self._process = current
        log_event(STORE_OPENED, url=settings.redacted_database_url(), pid=pid)
        return current

    @property
    def store(self) -> SQLAlchemyStore:
        """This process's store (opened on first use)."""
        return self._process_store().store

    @property
    def executions(self) -> SQLAlchemyExecutionStore:
        """This process's execution verbs (the same database as ``store``)."""
        return self._process_store().executions

    @property
    def renewer(self) -> LeaseRenewer:
        """The one lease renewer of this process."""
        return self._process_store().renewer

    def after_fork(self) -> None:
        """In a forked child: drop the parent's connections (``dispose(close=False)``)."""
        current = self._process
        if current is not None and current.pid != os.getpid():
            with self._lock:
                current.store.dispose_after_fork()
                self._process = None

    def close(self) -> None:
        """Stop this process's renewer and close its store (tests, CLI)."""
        with self._lock:
            current, self._process = self._process, None
        if current is not None and current.pid == os.getpid():
            current.renewer.stop()
            current.store.close()

    def reconfigure(self) -> None:
        """Close this process's store and forget the settings: the next use reads the
        app's conf again. For the test kit, which binds an application's own app to a
        throwaway store and back (``celery_agboss.testing.celery_app.bound_app``)."""
        self.close()
        with self._lock:
            self._settings = None
            self._engine_settings = None

    # --- publishing ----------------------------------------------------------------

    def republish(
        self, record: ExecutionRecord, *, reason: str = "republish", honour_not_before: bool = True
    ) -> Any:
        """Publish an execution's stored message again: same id, arguments and options.

        The message keeps its own ETA; ``honour_not_before`` also delays it to the
        execution's ``not_before``, so a waiting execution does not run early. For the
        sweep, a woken release and operators.
        """
        not_before = record.not_before_ms if honour_not_before else None
        result = republish(self.app, record, not_before_ms=not_before)
        log_event(
            EXECUTION_REPUBLISHED, execution_id=record.id, task=record.task_name, reason=reason
        )
        return result


_live_runtimes: weakref.WeakSet[Runtime] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """A forked child has only the thread that forked: a lock another thread of the
    parent held at the fork (opening the store, reading the settings) stays held for
    ever in the child, and its ``worker_process_init`` (``Runtime.after_fork``) would
    wait on it. Each runtime gets a fresh one; what it guarded is whole (every field is
    written by one assignment), and ``after_fork`` drops the parent's store."""
    for runtime in list(_live_runtimes):
        runtime._lock = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def app_argument(app: Any) -> str:
    """What this process was told to load the app with (``-A shop``), for the commands
    a hint names: the ``-A``/``--app`` of its command line, else the app's main module,
    else ``proj``."""
    argv = list(sys.argv)
    for index, token in enumerate(argv):
        if token in ("-A", "--app") and index + 1 < len(argv):
            return argv[index + 1]
        if token.startswith("--app="):
            return token.split("=", 1)[1]
        if token.startswith("-A") and len(token) > 2:
            return token[2:]
    main = getattr(app, "main", None)
    return main if isinstance(main, str) and main and main != "__main__" else "proj"


__all__ = ["Runtime", "app_argument"]
