"""The ``prometheus_client`` side: the counters, the store collector, the exposition.

``prometheus_client`` is optional (``pip install celery_agboss[metrics]``) and imported
only here, only when metrics are asked for: ``require_prometheus`` turns its absence
into a ConfigurationError that says what to install.

Every update of a counter happens under one lock that a fork waits for
(``os.register_at_fork``): a prefork child forked while the worker's main process
counted (its sweep watch, a scrape opening the store) would otherwise inherit
``prometheus_client``'s lock held, and hang on its first count in the middle of a
payment.
"""

from __future__ import annotations

import importlib
import math
import os
import threading
from collections.abc import Iterator, Mapping
from types import ModuleType
from typing import Any

from celery_agboss.errors import ConfigurationError, StoreError
from celery_agboss.metrics.catalogue import (
    COUNTER,
    EVENT_METRICS,
    EXECUTIONS,
    EXECUTIONS_FAILED_AFTER_PAYMENT,
    HISTOGRAM,
    INTENTS_NEEDING_OPERATOR,
    OTHER,
    PENDING_INTENTS,
    SECONDS_SINCE_LAST_SWEEP,
    STORE_METRICS,
    STORE_UP,
    SWEEP_DURATION_BUCKETS,
    KnownNames,
    MetricSpec,
    known_series,
    observations,
)
from celery_agboss.runtime.app_runtime import Runtime

INSTALL_HINT = "pip install celery_agboss[metrics]"


def require_prometheus() -> ModuleType:
    """``prometheus_client``, or a ConfigurationError naming the extra to install."""
    try:
        import prometheus_client
    except ImportError:
        raise ConfigurationError(
            "agboss_metrics_port asks for metrics, but prometheus_client is not installed: "
            f"{INSTALL_HINT}",
            setting="agboss_metrics_port",
        ) from None
    return prometheus_client


def use_multiprocess_values(directory: str) -> None:
    """Make this process (and the children it forks) write its metrics to ``directory``.

    ``prometheus_client`` picks its value class when it is first imported: if something
    imported it before the directory was set, switch it now, so that counters made from
    here on are per-process files a scrape of the main process adds up.
    """
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
    values: Any = importlib.import_module("prometheus_client.values")
    if values.ValueClass is values.MutexValue:
        values.ValueClass = values.MultiProcessValue()


# --- counting, safe across fork -------------------------------------------------------

_count_lock = threading.Lock()
_forks_guarded: list[bool] = []


def _reset_lock_in_child() -> None:
    global _count_lock
    _count_lock = threading.Lock()


def _guard_forks() -> None:
    """Once per process: a fork waits for the count in progress (hooks last forever)."""
    if _forks_guarded:
        return
    _forks_guarded.append(True)
    os.register_at_fork(
        before=lambda: _count_lock.acquire(),
        after_in_parent=lambda: _count_lock.release(),
        after_in_child=_reset_lock_in_child,
    )


def known_names(runtime: Runtime) -> KnownNames:
    """Task names of this app and call names of its registry: the only label values.

    Listed up front: the app's own tasks (Celery's ``celery.*`` built-ins never carry a
    payment) and the calls registered so far (``AGBoss(app).register``); a call a task
    registers on its first use is known from then on."""

    def is_task(name: str) -> bool:
        tasks = getattr(runtime.app, "_tasks", None)
        return tasks is not None and name in tasks

    def tasks() -> list[str]:
        names = list(getattr(runtime.app, "_tasks", None) or ())
        return [name for name in names if not name.startswith("celery.")]

    return KnownNames(
        is_task=is_task,
        is_call=runtime.registry.__contains__,
        tasks=tasks,
        calls=lambda: list(runtime.registry),
    )


class EventCounters:
    """The event-driven metrics; ``observe`` is the log events' observer.

    ``registry`` is None in a worker: its counts are read from the multiprocess
    directory, not from this object (tests pass one to read them back).
    """

    def __init__(self, names: KnownNames, registry: Any = None) -> None:
        prometheus = require_prometheus()
        _guard_forks()
        self.names = names
        self._metrics: dict[str, Any] = {}
        for spec in EVENT_METRICS:
            if spec.kind == HISTOGRAM:
                metric = prometheus.Histogram(
                    spec.name,
                    spec.help,
                    spec.labels,
                    registry=registry,
                    buckets=SWEEP_DURATION_BUCKETS,
                )
            else:
                assert spec.kind == COUNTER
                metric = prometheus.Counter(spec.name, spec.help, spec.labels, registry=registry)
            self._metrics[spec.name] = metric
        with _count_lock:
            for spec, labels in known_series(names):  # at 0: see known_series
                self._metrics[spec.name].labels(*labels)

    def observe(self, event: str, fields: Mapping[str, Any]) -> None:
        changes = observations(event, fields, self.names)
        with _count_lock:
            for change in changes:
                metric = self._metrics[change.metric.name]
                child = metric.labels(*change.labels) if change.labels else metric
                if change.metric.kind == HISTOGRAM:
                    child.observe(change.value)
                else:
                    child.inc(change.value)


# --- the store, read at scrape time ----------------------------------------------------


class StoreCollector:
    """A ``prometheus_client`` collector of the store's gauges, read at each scrape.

    A store that does not answer gives ``agboss_store_up 0`` and no other gauge, never
    a failed scrape: the event counters are still worth having then.
    """

    def __init__(self, app: Any) -> None:
        self.runtime = Runtime.of(app)

    def describe(self) -> Iterator[Any]:
        """The families without samples: registering never reads the store."""
        for spec in STORE_METRICS:
            yield _family(spec)

    def collect(self) -> Iterator[Any]:
        from celery_agboss.store.counts import read_counts
        from celery_agboss.sweep import sweep_freshness

        up = _family(STORE_UP)
        try:
            counts = read_counts(self.runtime.store)
            freshness = sweep_freshness(self.runtime)
        except (Exception, StoreError):
            up.add_metric([], 0.0)
            yield up
            return
        up.add_metric([], 1.0)
        yield up
        pending = _family(PENDING_INTENTS)
        pending.add_metric([], float(counts.pending_intents))
        yield pending
        needing = _family(INTENTS_NEEDING_OPERATOR)
        needing.add_metric([], float(counts.intents_needing_operator))
        yield needing
        executions = _family(EXECUTIONS)
        for state, count in counts.executions.items():
            executions.add_metric([state.value], float(count))
        executions.add_metric([OTHER], float(counts.newer_states))  # zero included
        yield executions
        left = _family(EXECUTIONS_FAILED_AFTER_PAYMENT)
        left.add_metric([], float(counts.failed_after_payment))
        yield left
        age = _family(SECONDS_SINCE_LAST_SWEEP)
        seconds = freshness.last_sweep_age_seconds
        age.add_metric([], math.inf if seconds is None else float(seconds))
        yield age


def _family(spec: MetricSpec) -> Any:
    from prometheus_client.core import GaugeMetricFamily

    return GaugeMetricFamily(spec.name, spec.help, labels=spec.labels or None)


# --- exposition -----------------------------------------------------------------------


def build_registry(app: Any, directory: str | None) -> Any:
    """A registry of the store's gauges and, with ``directory``, every process's counts
    written there (the worker's multiprocess directory)."""
    prometheus = require_prometheus()
    multiprocess: Any = importlib.import_module("prometheus_client.multiprocess")
    registry = prometheus.CollectorRegistry()
    if directory is not None:
        multiprocess.MultiProcessCollector(registry, path=directory)
    registry.register(StoreCollector(app))
    return registry


def exposition(app: Any, *, directory: str | None = None) -> bytes:
    """The Prometheus text exposition, once: the store's gauges, and the counters in
    ``directory`` (default: ``agboss_metrics_dir``, else ``PROMETHEUS_MULTIPROC_DIR``)
    when there is one."""
    prometheus = require_prometheus()
    chosen = directory if directory is not None else configured_directory(app)
    return bytes(prometheus.generate_latest(build_registry(app, chosen)))


def configured_directory(app: Any) -> str | None:
    """Where a worker writes its counts, if a process other than the worker can know:
    ``agboss_metrics_dir``, else ``PROMETHEUS_MULTIPROC_DIR``, when it exists."""
    found = Runtime.of(app).settings.metrics_dir or os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    return found if found and os.path.isdir(found) else None


__all__ = [
    "EventCounters",
    "StoreCollector",
    "build_registry",
    "configured_directory",
    "exposition",
    "known_names",
    "require_prometheus",
    "use_multiprocess_values",
]
