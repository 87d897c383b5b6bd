"""The metrics (docs/metrics.md): a prefork worker's endpoint, and the store's gauges.

A real ``celery worker -P prefork -c 2`` on Redis, with ``AGBOSS_METRICS_PORT`` set
(the setting read from the environment), is scraped over HTTP after a replay (the same
task id published again), a reconcile (a child killed with its charge at the gateway;
the sweep, sent to the worker as beat would, finds it) and a fenced refusal (a child
frozen past its lease, continued after the take-over). The counters come from every
pool child, the killed one included; no label carries the business key.

Deployment speed-ups it relies on: the harness's (``-Q``, a 5 s lease, no beat:
tests/integration/harness.py); the sweep task goes to the test's queue.
"""

from __future__ import annotations

import json
import math
import re
import signal
import sys
import urllib.request
import uuid
from pathlib import Path

import pytest

from celery_agboss.cli import EXIT_CONFIGURATION
from celery_agboss.core.executions import ExecutionState
from celery_agboss.core.log_events import LOG_EVENTS
from celery_agboss.metrics.catalogue import OTHER, SWEEP_ACTIONS, SWEEPERS
from celery_agboss.metrics.exporter import exposition
from tests.integration.conftest import (  # noqa: F401 - the worker fixtures, reused
    gateway,
    shop_factory,
    sqlite_database_url,
)
from tests.integration.gateway_http import wait_for
from tests.integration.harness import Shop, ShopFactory
from tests.integration.test_zombie import freeze_the_child_at_the_gate
from tests.operations.cli import run
from tests.operations.conftest import WorldFactory
from tests.operations.workers.sweeping import agboss_cli
from tests.operations.world import World
from tests.support.throwaway import free_ports

SAMPLE = re.compile(r"^(?P<name>[a-z_]+)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$", re.M)
LABEL = re.compile(r'(\w+)="([^"]*)"')


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode("utf-8"))


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [
        (m["name"], dict(LABEL.findall(m["labels"] or "")), float(m["value"]))
        for m in SAMPLE.finditer(text)
    ]


def value(text: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels`` (0 if none)."""
    return sum(v for n, found, v in samples(text) if n == name and labels.items() <= found.items())


def scrape_when(url: str, name: str, timeout: float = 20.0, **labels: str) -> str:
    """Scrape until ``name`` with ``labels`` counts something; that scrape's text (a
    child's count reaches its file as it happens, the scrape may come just before)."""

    def counted() -> str | None:
        text = scrape(url)
        return text if value(text, name, **labels) > 0 else None

    found: str = wait_for(counted, timeout, f"{name} {labels} to be counted")
    return found


def allowed_label_values(shop: Shop) -> set[str]:
    """Every value a label may take here: closed sets only."""
    words = {"completed", "failed", "found", "not_sent", "unreconciled", "lookup_failed"}
    words |= {"sent", "unknown", "joined", "finished", "skipped", OTHER}
    steps = {"expire", "reconcile", "cancel", "redrive", "retention", "release", "run"}
    return (
        set(LOG_EVENTS)
        | set(shop.app.tasks)
        | set(shop.agboss.registry)
        | words
        | steps
        | set(SWEEPERS)
        | set(SWEEP_ACTIONS)
        | {state.value for state in ExecutionState}
    )


@pytest.mark.worker
@pytest.mark.redis
@pytest.mark.slow
def test_a_prefork_worker_exposes_a_replay_a_reconcile_and_a_fence_without_business_keys(
    shop_factory: ShopFactory,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (port,) = free_ports(1)
    monkeypatch.setenv("AGBOSS_METRICS_PORT", str(port))  # the worker inherits it
    url = f"http://127.0.0.1:{port}/metrics"
    shop = shop_factory()
    worker = shop.start_worker(pool="prefork", concurrency=2)
    found = wait_for(
        lambda: re.search(r"metrics on (\S+) \(counts in (\S+)\)", worker.output()),
        10,
        "the metrics endpoint to be logged",
    )
    assert found[1] == url
    directory = Path(found[2])
    assert directory.is_dir(), "a multiprocess directory of this worker's own"
    secret = uuid.uuid4().hex[:12]  # in every business key: never in a label

    # A replay: the same task id published again after its execution completed.
    order = f"a-{secret}"
    first = str(shop.app.signature("it.charge_order", args=(order,)).apply_async().id)
    shop.wait_state(first, "COMPLETED")
    shop.app.signature("it.charge_order", args=(order,)).apply_async(task_id=first)
    scrape_when(url, "agboss_execution_replays_total", task="it.charge_order")

    # A fence (a child frozen past its lease) and a reconcile (a child killed while its
    # charge is at the gateway), side by side; the sweep in the worker re-drives both.
    zombie_task, zombie = freeze_the_child_at_the_gate(shop, "it.charge_order", f"c-{secret}")
    try:
        killed_task = shop.kill_the_child_holding_the_answer("it.charge_order", f"b-{secret}")
        with shop.beating():  # the sweep in a pool child, counted there
            shop.wait_state(killed_task, "COMPLETED", timeout=40)
            shop.wait_state(zombie_task, "COMPLETED", timeout=40)
    finally:
        shop.cont(zombie)
    text = scrape_when(url, "agboss_fenced_refusals_total", task="it.charge_order")

    assert value(text, "agboss_reconciliations_total", call="it.charge", outcome="found") >= 1
    assert value(text, "agboss_sweeps_total", by="beat", result="finished") >= 1
    assert value(text, "agboss_sweep_duration_seconds_count", by="beat") >= 1
    assert value(text, "agboss_sweep_rows_total", action="republished") >= 1
    assert value(text, "agboss_outbound_calls_total", call="it.charge", outcome="sent") >= 2
    # Every body start was counted, the killed child's included: its file outlived it.
    starts = len(shop.gateway.notes_of("body-start"))
    counted = value(text, "agboss_events_total", event="execution.started") + value(
        text, "agboss_events_total", event="execution.taken-over"
    )
    assert counted == starts, (counted, starts)
    # The store's gauges, read by the main process at the scrape.
    assert value(text, "agboss_store_up") == 1
    assert value(text, "agboss_pending_intents") == 0
    assert value(text, "agboss_executions", state="RUNNING") == 0
    assert 0 <= value(text, "agboss_seconds_since_last_sweep") < 60
    # Labels: closed sets only; the business keys appear nowhere.
    assert secret not in text
    allowed = allowed_label_values(shop)
    wrong = {
        (name, key, label)
        for name, labels, _ in samples(text)
        for key, label in labels.items()
        if key != "le" and label not in allowed
    }
    assert wrong == set()

    # `celery -A proj agboss metrics --dir` reads the same counts from another process.
    completed = agboss_cli(shop, "metrics", "--dir", str(directory))
    assert completed.returncode == 0, completed.stderr
    assert value(completed.stdout, "agboss_execution_replays_total") >= 1
    assert value(completed.stdout, "agboss_store_up") == 1
    assert secret not in completed.stdout

    # A warm shutdown removes the directory it made.
    worker.signal_leader(signal.SIGTERM)
    worker.wait(30)
    assert not directory.exists()


# --- the store's gauges, without a worker, on each backend ----------------------------


def test_the_store_gauges_follow_what_waits_in_the_store(world_factory: WorldFactory) -> None:
    world = world_factory(lookup="none")

    def read() -> str:
        return exposition(world.app, directory=None).decode("utf-8")

    before = read()
    assert value(before, "agboss_store_up") == 1
    assert value(before, "agboss_pending_intents") == 0
    assert math.isinf(value(before, "agboss_seconds_since_last_sweep")), "no sweep yet"
    assert "agboss_events_total" not in before, "no directory: no counters"

    waiting = world.publish()
    assert value(read(), "agboss_executions", state="REQUESTED") == 1
    world.strand(waiting)
    stranded = read()
    assert value(stranded, "agboss_pending_intents") == 1
    assert value(stranded, "agboss_intents_needing_operator") == 0
    assert value(stranded, "agboss_executions", state="RUNNING") == 1

    world.sweep()  # no lookup at this gateway: an operator must decide
    swept = read()
    assert value(swept, "agboss_pending_intents") == 1
    assert value(swept, "agboss_intents_needing_operator") == 1
    assert value(swept, "agboss_executions", state="REQUESTED") == 0
    assert 0 <= value(swept, "agboss_seconds_since_last_sweep") < 5
    for state in ("PARKED", "WAITING_OPERATOR", "PAUSED", "WAITING"):
        assert f'agboss_executions{{state="{state}"}}' in swept, "zero is a value"


def test_a_store_that_does_not_answer_gives_store_up_zero(
    world_factory: WorldFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = world_factory()
    from celery_agboss.store import counts

    def refuse(store: object) -> object:
        raise OSError("the store is down")

    monkeypatch.setattr(counts, "read_counts", refuse)
    text = exposition(world.app, directory=None).decode("utf-8")
    assert value(text, "agboss_store_up") == 0
    assert "agboss_pending_intents" not in text


# --- `celery -A proj agboss metrics` ----------------------------------------------------


def test_the_metrics_command_prints_the_store_gauges_once(world: World) -> None:
    world.publish()
    result = run(world.app, "metrics")
    assert result.exit_code == 0, result.output
    assert "# TYPE agboss_pending_intents gauge" in result.output
    assert value(result.output, "agboss_executions", state="REQUESTED") == 1
    data = json.loads(run(world.app, "metrics", "--json").output)
    assert data["directory"] is None
    assert {"name": "agboss_store_up", "labels": {}, "value": 1.0} in data["samples"]


def test_the_metrics_command_without_prometheus_client_says_which_extra_to_install(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    result = run(world.app, "metrics")
    assert result.exit_code == EXIT_CONFIGURATION
    assert "pip install celery_agboss[metrics]" in result.output
