"""The metrics without a worker (docs/metrics.md): the log events' observer hook, which
event moves which counter, that no label can carry a business key, the settings, and a
missing ``prometheus_client`` saying which extra to install."""

from __future__ import annotations

import logging
import os
import socket
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry

from celery_agboss.core.log_events import (
    EXECUTION_DEFERRED,
    EXECUTION_FENCED,
    EXECUTION_REPLAYED,
    EXECUTION_UNMANAGED,
    LOG_EVENTS,
    OUTBOUND_CALL_RECONCILED,
    OUTBOUND_CALL_SENT,
    SWEEP_ERROR,
    SWEEP_FINISHED,
    SWEEP_SKIPPED,
    add_event_observer,
    log_event,
    remove_event_observer,
)
from celery_agboss.errors import ConfigurationError
from celery_agboss.metrics import catalogue
from celery_agboss.metrics.catalogue import (
    METRICS,
    OTHER,
    SWEEP_ACTIONS,
    KnownNames,
    observations,
)
from celery_agboss.metrics.exporter import EventCounters, require_prometheus
from celery_agboss.metrics.worker import MULTIPROC_ENV, WorkerMetrics
from celery_agboss.runtime.settings import settings_from_conf

SECRET = "order:4242-secret-7f3a"  # a business key, as a caller would pass it
NAMES = KnownNames(is_task={"shop.charge_order"}.__contains__, is_call={"shop.charge"}.__contains__)
BASE_CONF = {"agboss_database_url": "sqlite:////tmp/agboss-metrics-unit.db"}


def bare() -> WorkerMetrics:
    """A worker's metrics with no app: enough for what runs before one is needed."""
    return WorkerMetrics(runtime=cast(Any, None))


# --- the observer hook ------------------------------------------------------------------


@pytest.fixture
def seen() -> Iterator[list[tuple[str, dict[str, Any]]]]:
    got: list[tuple[str, dict[str, Any]]] = []

    def observer(event: str, fields: Mapping[str, Any]) -> None:
        got.append((event, dict(fields)))

    add_event_observer(observer)
    add_event_observer(observer)  # twice is once
    try:
        yield got
    finally:
        remove_event_observer(observer)


def test_an_observer_hears_every_event_whatever_the_logger_level(
    seen: list[tuple[str, dict[str, Any]]],
) -> None:
    logger = logging.getLogger("celery_agboss")
    before = logger.level
    logger.setLevel(logging.CRITICAL + 1)
    try:
        log_event(OUTBOUND_CALL_SENT, call="shop.charge", request={"amount": 1250}, name="x")
    finally:
        logger.setLevel(before)
    # Once, with the values made safe as logged, under the names the caller gave.
    assert seen == [(OUTBOUND_CALL_SENT, {"call": "shop.charge", "request": "dict", "name": "x"})]


def test_an_observer_that_raises_breaks_neither_the_log_nor_the_next_observer(
    seen: list[tuple[str, dict[str, Any]]], caplog: pytest.LogCaptureFixture
) -> None:
    def broken(event: str, fields: Mapping[str, Any]) -> None:
        raise RuntimeError("a metrics backend is down")

    add_event_observer(broken)
    try:
        caplog.set_level(logging.INFO, logger="celery_agboss")
        log_event(SWEEP_FINISHED, by="beat")
    finally:
        remove_event_observer(broken)
    assert [event for event, _ in seen] == [SWEEP_FINISHED]
    assert "sweep.finished by=beat" in caplog.text


def test_a_removed_observer_hears_nothing_more() -> None:
    got: list[str] = []

    def observer(event: str, fields: Mapping[str, Any]) -> None:
        got.append(event)

    add_event_observer(observer)
    remove_event_observer(observer)
    remove_event_observer(observer)  # never added any more: ignored
    log_event(SWEEP_SKIPPED, by="beat")
    assert got == []


# --- the mapping ------------------------------------------------------------------------


def _by_metric(event: str, fields: Mapping[str, Any]) -> dict[str, list[tuple[str, ...]]]:
    found: dict[str, list[tuple[str, ...]]] = {}
    for change in observations(event, fields, NAMES):
        found.setdefault(change.metric.name, []).append(change.labels)
    return found


@pytest.mark.parametrize(
    ("event", "fields", "metric", "labels"),
    [
        (EXECUTION_REPLAYED, {"task": "shop.charge_order"}, "agboss_execution_replays", ()),
        (EXECUTION_FENCED, {"task": "shop.charge_order"}, "agboss_fenced_refusals", ()),
        (EXECUTION_DEFERRED, {"task": "shop.charge_order"}, "agboss_deferred_duplicates", ()),
        (OUTBOUND_CALL_RECONCILED, {"call": "shop.charge"}, "agboss_reconciliations", ("found",)),
        (OUTBOUND_CALL_SENT, {"call": "shop.charge"}, "agboss_outbound_calls", ("sent",)),
        (EXECUTION_UNMANAGED, {"task": "shop.charge_order"}, "agboss_unmanaged_executions", ()),
    ],
)
def test_each_decision_moves_its_counter_and_the_events_counter(
    event: str, fields: dict[str, Any], metric: str, labels: tuple[str, ...]
) -> None:
    found = _by_metric(event, {**fields, "execution_id": "e-1", "attempt": 1})
    name = str(next(iter(fields.values())))
    assert found == {"agboss_events": [(event,)], metric: [(name, *labels)]}


def test_every_event_is_counted_under_its_own_name() -> None:
    for event in LOG_EVENTS:
        assert _by_metric(event, {})["agboss_events"] == [(event,)]
    assert _by_metric("not.an-event", {})["agboss_events"] == [(OTHER,)]


def test_a_finished_sweep_gives_its_run_its_duration_and_its_rows() -> None:
    fields = {"by": "beat", "duration_ms": 250, "reconciled": 2, "republished": 1, "errors": 1}
    changes = observations(SWEEP_FINISHED, fields, NAMES)
    got = {(c.metric.name, c.labels): c.value for c in changes}
    assert got == {
        ("agboss_events", (SWEEP_FINISHED,)): 1.0,
        ("agboss_sweeps", ("beat", "finished")): 1.0,
        ("agboss_sweep_duration_seconds", ("beat",)): 0.25,
        ("agboss_sweep_rows", ("beat", "reconciled")): 2.0,
        ("agboss_sweep_rows", ("beat", "republished")): 1.0,
    }
    assert {"republished", "reconciled", "parked", "expired", "cancelled"} <= set(SWEEP_ACTIONS)
    skipped = _by_metric(SWEEP_SKIPPED, {"by": "loop"})
    assert skipped["agboss_sweeps"] == [("loop", "skipped")]
    assert _by_metric(SWEEP_ERROR, {"step": "reconcile"})["agboss_sweep_errors"] == [("reconcile",)]


def test_no_label_can_carry_a_business_key_whatever_the_fields_hold() -> None:
    """Every event, every field (task, call, by, step…) set to a business key, an
    unregistered name or a non-string: the labels stay in their closed sets."""
    hostile: list[Any] = [SECRET, "shop.charge_order:" + SECRET, 4242, None, ["a", SECRET]]
    fixed = {"completed", "failed", "found", "not_sent", "unreconciled", "lookup_failed"}
    fixed |= {"sent", "unknown", "joined", "finished", "skipped", OTHER}
    allowed = LOG_EVENTS | fixed | set(SWEEP_ACTIONS)
    names = ("task", "call", "by", "step", "execution", "execution_id", "business_key")
    for event in LOG_EVENTS:
        for value in hostile:
            fields = dict.fromkeys(names, value)
            for change in observations(event, {**fields, "duration_ms": 5}, NAMES):
                for label in change.labels:
                    assert label in allowed, (event, value, change)
                    assert "secret" not in label


def test_a_registered_name_is_a_label_and_an_unregistered_one_is_other() -> None:
    assert _by_metric(EXECUTION_FENCED, {"task": "shop.charge_order"})[
        "agboss_fenced_refusals"
    ] == [("shop.charge_order",)]
    assert _by_metric(EXECUTION_FENCED, {"task": "shop.refund"})["agboss_fenced_refusals"] == [
        (OTHER,)
    ]

    def broken(name: str) -> bool:
        raise RuntimeError("registry unavailable")

    names = KnownNames(is_task=broken, is_call=broken)
    got = {c.metric.name: c.labels for c in observations(EXECUTION_FENCED, {"task": "x"}, names)}
    assert got["agboss_fenced_refusals"] == (OTHER,), "a registry that fails names nothing"


def test_every_metric_has_a_unique_prometheus_name() -> None:
    names = [spec.name for spec in METRICS]
    assert len(names) == len(set(names))
    for spec in METRICS:
        assert spec.name.startswith("agboss_") and not spec.name.endswith("_total")
        assert spec.kind in (catalogue.COUNTER, catalogue.HISTOGRAM, catalogue.GAUGE)


def test_the_counters_count_what_the_mapping_says() -> None:
    registry = CollectorRegistry()
    counters = EventCounters(NAMES, registry=registry)
    counters.observe(EXECUTION_REPLAYED, {"task": "shop.charge_order"})
    counters.observe(EXECUTION_REPLAYED, {"task": SECRET})
    counters.observe(SWEEP_FINISHED, {"by": "beat", "duration_ms": 1500, "parked": 3})
    sample = registry.get_sample_value
    assert sample("agboss_execution_replays_total", {"task": "shop.charge_order"}) == 1
    assert sample("agboss_execution_replays_total", {"task": OTHER}) == 1
    assert sample("agboss_events_total", {"event": EXECUTION_REPLAYED}) == 2
    assert sample("agboss_sweep_rows_total", {"by": "beat", "action": "parked"}) == 3
    assert sample("agboss_sweep_duration_seconds_sum", {"by": "beat"}) == 1.5
    assert sample("agboss_sweep_duration_seconds_bucket", {"by": "beat", "le": "2.5"}) == 1


# --- settings ---------------------------------------------------------------------------


def test_the_metrics_settings_default_to_off_on_loopback() -> None:
    settings = settings_from_conf(BASE_CONF, environ={"AGBOSS_TESTING": "1"})
    assert (settings.metrics_port, settings.metrics_address, settings.metrics_dir) == (
        None,
        "127.0.0.1",
        None,
    )


def test_the_metrics_settings_come_from_the_conf_or_the_environment() -> None:
    env = {"AGBOSS_TESTING": "1", "AGBOSS_METRICS_PORT": "9808", "AGBOSS_METRICS_DIR": "/m"}
    settings = settings_from_conf({**BASE_CONF, "agboss_metrics_address": "0.0.0.0"}, env)
    assert (settings.metrics_port, settings.metrics_address, settings.metrics_dir) == (
        9808,
        "0.0.0.0",
        "/m",
    )
    off = settings_from_conf({**BASE_CONF, "agboss_metrics_port": 0}, {"AGBOSS_TESTING": "1"})
    assert off.metrics_port is None


@pytest.mark.parametrize(
    ("conf", "setting"),
    [
        ({"agboss_metrics_port": 70000}, "agboss_metrics_port"),
        ({"agboss_metrics_port": True}, "agboss_metrics_port"),
        ({"agboss_metrics_port": "ninety"}, "agboss_metrics_port"),
        ({"agboss_metrics_address": ""}, "agboss_metrics_address"),
        ({"agboss_metrics_dir": "relative/dir"}, "agboss_metrics_dir"),
    ],
)
def test_a_wrong_metrics_setting_is_refused_by_name(conf: dict[str, Any], setting: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        settings_from_conf({**BASE_CONF, **conf}, environ={"AGBOSS_TESTING": "1"})
    assert refused.value.fields["setting"] == setting
    assert setting in str(refused.value)


# --- without prometheus_client, and the worker's directory ---------------------------------


def test_without_prometheus_client_metrics_say_which_extra_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(ConfigurationError, match=r"pip install celery_agboss\[metrics\]"):
        require_prometheus()
    settings = settings_from_conf(
        {**BASE_CONF, "agboss_metrics_port": 9808}, {"AGBOSS_TESTING": "1"}
    )
    with pytest.raises(ConfigurationError, match=r"celery_agboss\[metrics\]"):
        bare().start(settings)


def test_a_port_already_taken_is_refused_before_anything_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(MULTIPROC_ENV, raising=False)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        settings = settings_from_conf(
            {**BASE_CONF, "agboss_metrics_port": port}, {"AGBOSS_TESTING": "1"}
        )
        metrics = bare()
        with pytest.raises(ConfigurationError, match="agboss_metrics_port: cannot listen"):
            metrics.start(settings)
    assert MULTIPROC_ENV not in os.environ and metrics.directory is None


def test_the_worker_directory_is_its_own_emptied_one_the_deployment_s_or_a_fresh_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "counter_123.db").write_bytes(b"stale")
    (mine / "keep.txt").write_text("not ours")
    metrics = bare()
    conf = {**BASE_CONF, "agboss_metrics_dir": str(mine)}
    monkeypatch.delenv(MULTIPROC_ENV, raising=False)
    assert metrics._directory(settings_from_conf(conf, {"AGBOSS_TESTING": "1"})) == str(mine)
    assert sorted(p.name for p in mine.iterdir()) == ["keep.txt"]
    plain = settings_from_conf(BASE_CONF, {"AGBOSS_TESTING": "1"})
    monkeypatch.setenv(MULTIPROC_ENV, str(tmp_path / "theirs"))
    assert bare()._directory(plain) == str(tmp_path / "theirs")
    monkeypatch.delenv(MULTIPROC_ENV)
    fresh = bare()
    made = fresh._directory(plain)
    try:
        assert fresh.made_directory and Path(made).is_dir()
    finally:
        fresh.directory = made
        fresh.stop()
    assert not Path(made).exists()
