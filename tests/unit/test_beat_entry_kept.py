"""A plain ``celery -A proj beat`` always sends the sweep.

``AGBoss(app)`` adds the sweep's entry to ``beat_schedule`` when the app is configured.
Celery's documented way to add periodic tasks, ``app.conf.beat_schedule = {...}``,
written after that replaces the whole dict, and beat never sent the sweep (the workers
only fall back to sweeping themselves after three intervals). So the entry is put back
when beat starts (``beat_init``), in the conf and in the scheduler beat built from it,
and beat says once that it did.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery import signals as celery_signals
from celery.beat import Service

from celery_agboss import AGBoss
from celery_agboss.signals import disconnect
from celery_agboss.sweep.runner import SWEEP_BEAT_ENTRY, SWEEP_TASK_NAME

KEY = "a-pseudonym-key-of-enough-bytes"
REPORT = {"nightly-report": {"task": "shop.report", "schedule": 3600}}


@pytest.fixture
def app(tmp_path: Path) -> Iterator[Celery]:
    """A configured app bound to AGBoss; disconnected and closed afterwards."""
    made = Celery("beat-entry", broker="memory://", set_as_current=False)
    made.conf.update(
        agboss_database_url=f"sqlite:///{tmp_path / 'agboss.db'}", agboss_pseudonym_key=KEY
    )
    made.conf.timezone  # noqa: B018 - anything that reads the conf configures the app
    runtime = AGBoss(made)
    yield made
    disconnect(runtime)
    runtime.close()
    made.close()


def _start_beat(app: Celery, tmp_path: Path) -> Any:
    """What ``celery beat`` does up to ``beat_init``: the scheduler is built (from
    ``beat_schedule``) before the signal is sent, as Service.start does."""
    service = Service(app=app, schedule_filename=str(tmp_path / "beat-schedule"))
    service.scheduler  # noqa: B018 - Service.start reads scheduler.max_interval first
    celery_signals.beat_init.send(sender=service)
    return service


def test_a_beat_schedule_assigned_after_agboss_still_sends_the_sweep(
    app: Celery, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert SWEEP_BEAT_ENTRY in app.conf.beat_schedule
    app.conf.beat_schedule = dict(REPORT)  # replaces the dict holding the sweep's entry
    with caplog.at_level(logging.WARNING, logger="celery_agboss"):
        service = _start_beat(app, tmp_path)
        try:
            entry = service.scheduler.schedule[SWEEP_BEAT_ENTRY]
            assert entry.task == SWEEP_TASK_NAME
            assert entry.options["queue"] == AGBoss(app).settings.sweep_queue
            assert "nightly-report" in service.scheduler.schedule
            assert set(app.conf.beat_schedule) == {"nightly-report", SWEEP_BEAT_ENTRY}
            celery_signals.beat_init.send(sender=service)  # said once, not again
        finally:
            service.scheduler.close()
    said = [r.getMessage() for r in caplog.records if SWEEP_BEAT_ENTRY in r.getMessage()]
    assert len(said) == 1 and "added back" in said[0], said


def test_a_schedule_that_kept_the_entry_is_left_alone_and_nothing_is_said(
    app: Celery, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    app.conf.beat_schedule = {**app.conf.beat_schedule, **REPORT}
    before = dict(app.conf.beat_schedule)
    with caplog.at_level(logging.WARNING, logger="celery_agboss"):
        service = _start_beat(app, tmp_path)
        try:
            assert SWEEP_BEAT_ENTRY in service.scheduler.schedule
        finally:
            service.scheduler.close()
    assert dict(app.conf.beat_schedule) == before
    assert not [r for r in caplog.records if SWEEP_BEAT_ENTRY in r.getMessage()]


def test_an_app_whose_sweep_interval_is_zero_gets_no_entry(tmp_path: Path) -> None:
    """0: no beat entry (``celery agboss sweep --loop`` sweeps instead), at start too."""
    app = Celery("beat-no-entry", broker="memory://", set_as_current=False)
    app.conf.update(
        agboss_database_url=f"sqlite:///{tmp_path / 'agboss.db'}",
        agboss_pseudonym_key=KEY,
        agboss_sweep_interval=0,
    )
    runtime = AGBoss(app)
    try:
        app.conf.beat_schedule = dict(REPORT)
        service = _start_beat(app, tmp_path)
        try:
            assert SWEEP_BEAT_ENTRY not in service.scheduler.schedule
        finally:
            service.scheduler.close()
    finally:
        disconnect(runtime)
        runtime.close()
        app.close()
