"""A worker's counters start with a series at 0 for each task of its app and each call
it registered, and for ``other`` (docs/metrics.md): the names come from the app itself
(``known_names``), so the first fenced refusal or unmanaged execution is an increase
from 0 for Prometheus, which the documented alerts see. Celery's own ``celery.*`` tasks
get none; no series carries anything but a registered name or a closed word.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from celery_agboss.core.log_events import EXECUTION_FENCED
from celery_agboss.metrics.catalogue import OTHER
from celery_agboss.metrics.exporter import EventCounters, known_names
from celery_agboss.runtime.app_runtime import Runtime
from tests.operations.test_metrics import samples, value
from tests.operations.world import World


def test_the_apps_tasks_and_calls_start_at_zero(world: World) -> None:
    world.app.finalize()  # as a worker does before worker_init, where the counters are made
    registry = CollectorRegistry()
    counters = EventCounters(known_names(Runtime.of(world.app)), registry=registry)
    before = generate_latest(registry).decode("utf-8")
    task, call = world.task.name, world.call.name
    for name in ("agboss_fenced_refusals_total", "agboss_unmanaged_executions_total"):
        for label in (task, OTHER):
            assert f'{name}{{task="{label}"}} 0.0' in before, (name, label)
    assert f'agboss_outbound_calls_total{{call="{call}",outcome="sent"}} 0.0' in before
    assert f'agboss_reconciliations_total{{call="{OTHER}",outcome="found"}} 0.0' in before
    labels = {label for _, found, _ in samples(before) for label in found.values()}
    assert any(label.startswith("celery.") for label in world.app.tasks), "built-ins are there"
    assert not any(label.startswith("celery.") for label in labels), labels

    counters.observe(EXECUTION_FENCED, {"task": task})
    after = generate_latest(registry).decode("utf-8")
    assert value(after, "agboss_fenced_refusals_total", task=task) == 1
