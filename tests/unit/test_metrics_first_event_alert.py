"""docs/metrics.md's counter alerts fire on the first event after a worker starts.

Prometheus's ``increase`` only sees the samples inside its window and never takes a
new series for a reset from 0 (prometheus/prometheus#1673): a labelled series born at
1 by its first event is no increase, and in a worker (multiprocess mode) no
``_created`` sample is exported to help. So the counters' series of the names known
at start, and ``other``, are made at 0 with the counters (``known_series``): the
first event is 0 to 1. A name registered later (a call a task registers on its first
use) is still born at 1: the documented alerts add an arm for a new series.

``increase`` below is Prometheus's own rule without extrapolation (last minus first,
plus every counter reset, over the samples the window holds; fewer than two: nothing).
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from celery_agboss.core.log_events import EXECUTION_FENCED, EXECUTION_UNMANAGED, OUTBOUND_CALL_SENT
from celery_agboss.metrics.catalogue import OTHER, KnownNames
from celery_agboss.metrics.exporter import EventCounters

TASK = "shop.charge_order"
CALL = "shop.charge"
LATE_CALL = "shop.refund"  # registered after the counters were made
CALLS = {CALL}
NAMES = KnownNames(
    is_task={TASK}.__contains__,
    is_call=CALLS.__contains__,
    tasks=lambda: [TASK],
    calls=lambda: sorted(CALLS),
)
METRICS_MD = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def sample(text: str, name: str, **labels: str) -> float | None:
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    found = re.search(rf"^{name}\{{{re.escape(wanted)}\}} (\S+)$", text, re.M)
    return None if found is None else float(found[1])


def increase(values: list[float | None]) -> float:
    """PromQL increase() over the samples in a window, without extrapolation."""
    present = [v for v in values if v is not None]
    if len(present) < 2:
        return 0.0
    total = present[-1] - present[0]
    for before, after in itertools.pairwise(present):
        if after < before:  # a counter reset
            total += before
    return total


def new_series(values: list[float | None]) -> bool:
    """The documented second arm, ``(x unless x offset 15m) > 0``: the series is there
    now with a count, and was not at the window's start."""
    return values[0] is None and values[-1] is not None and values[-1] > 0


def scrapes_around_one(event: str, metric: str, **labels: str) -> list[float | None]:
    """The series ``metric{labels}`` in a scrape before ``event`` and three after."""
    registry = CollectorRegistry()
    counters = EventCounters(NAMES, registry=registry)  # what a worker makes at worker_init
    scrapes = [generate_latest(registry).decode()]  # a scrape before the event
    counters.observe(event, {"task": TASK, "call": labels.get("call", CALL)})
    scrapes += [generate_latest(registry).decode() for _ in range(3)]
    return [sample(text, metric, **labels) for text in scrapes]


@pytest.mark.parametrize(
    ("event", "metric"),
    [
        (EXECUTION_UNMANAGED, "agboss_unmanaged_executions_total"),
        (EXECUTION_FENCED, "agboss_fenced_refusals_total"),
    ],
)
def test_the_first_event_of_a_known_task_is_an_increase(event: str, metric: str) -> None:
    values = scrapes_around_one(event, metric, task=TASK)
    assert values[0] == 0.0, "the series is there, at 0, before any event"
    assert increase(values) == 1.0, f"increase({metric}[15m]) > 0 stays false: {values}"


def test_every_known_name_and_other_start_at_zero() -> None:
    registry = CollectorRegistry()
    EventCounters(NAMES, registry=registry)
    text = generate_latest(registry).decode()
    for task in (TASK, OTHER):
        for metric in ("agboss_fenced_refusals_total", "agboss_unmanaged_executions_total"):
            assert sample(text, metric, task=task) == 0.0, (metric, task)
    for call in (CALL, OTHER):
        assert sample(text, "agboss_outbound_calls_total", call=call, outcome="sent") == 0.0


def test_a_call_registered_later_is_caught_by_the_new_series_arm() -> None:
    registry = CollectorRegistry()
    counters = EventCounters(NAMES, registry=registry)
    before = generate_latest(registry).decode()
    CALLS.add(LATE_CALL)  # a task's first use registers its call in a running worker
    try:
        counters.observe(OUTBOUND_CALL_SENT, {"call": LATE_CALL})
    finally:
        CALLS.discard(LATE_CALL)
    after = generate_latest(registry).decode()
    metric, labels = "agboss_outbound_calls_total", {"call": LATE_CALL, "outcome": "sent"}
    values = [sample(before, metric, **labels), sample(after, metric, **labels)]
    assert values == [None, 1.0]
    assert increase(values) == 0.0 and new_series(values)


def documented_alerts() -> list[str]:
    """The ``expr`` of each rule in docs/metrics.md's alert rule file, one line each
    (a folded ``>-`` expression's lines joined, as YAML folds them)."""
    text = METRICS_MD.read_text(encoding="utf-8")
    section = text[text.index("### Alerts worth having") :]
    block = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert block is not None, "the alerts are a rule file"
    exprs: list[str] = []
    folding: int | None = None  # the indent of the ``expr:`` being folded
    for line in block[1].splitlines():
        indent = len(line) - len(line.lstrip())
        if folding is not None and line.strip() and indent > folding:
            exprs[-1] = f"{exprs[-1]} {line.strip()}".strip()
            continue
        folding = None
        if line.strip().startswith("expr:"):
            expr = line.split("expr:", 1)[1].strip()
            folding = indent if expr == ">-" else None
            exprs.append("" if expr == ">-" else expr)
    return exprs


def test_the_documented_counter_alerts_also_fire_on_a_new_series() -> None:
    """Each alert's source is valid PromQL as written (no Markdown escape in it), and
    the counters' alerts have the new-series arm."""
    exprs = documented_alerts()
    assert len(exprs) == 6 and all(exprs), exprs
    assert not any("\\" in expr for expr in exprs), exprs
    for metric in ("agboss_fenced_refusals_total", "agboss_unmanaged_executions_total"):
        [expr] = [e for e in exprs if metric in e]
        assert f"increase({metric}[15m]) > 0" in expr
        assert f"({metric} unless {metric} offset 15m) > 0" in expr
    waiting = next(e for e in exprs if "agboss_executions{" in e)
    assert 'state=~"WAITING_OPERATOR|PARKED|other"' in waiting
