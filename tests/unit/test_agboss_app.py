"""AGBoss(app) binds lazily: settings are read when the app is configured, not before; a
setting written after they were read refuses the worker and beat."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery

from celery_agboss import AGBoss
from celery_agboss.signals import disconnect, refuse_to_start_unless_configured


def test_settings_set_after_agboss_are_the_ones_read(tmp_path: Path) -> None:
    app = Celery("late-conf", broker="memory://", set_as_current=False)
    boss = AGBoss(app)
    assert not app.configured
    app.conf.agboss_database_url = f"sqlite:///{tmp_path / 'agboss.db'}"
    app.conf.agboss_pseudonym_key = "k" * 32
    app.conf.agboss_lease_ttl = 12
    assert boss.settings.lease_ttl_seconds == 12.0
    assert AGBoss(app) is boss


def test_the_sweep_task_is_registered_once_the_app_is_finalized(tmp_path: Path) -> None:
    app = Celery("sweep-registered", broker="memory://", set_as_current=False)
    app.conf.agboss_database_url = f"sqlite:///{tmp_path / 'agboss.db'}"
    app.conf.agboss_pseudonym_key = "k" * 32
    AGBoss(app)
    app.finalize()
    assert "celery_agboss.sweep" in app.tasks


def _app(name: str, tmp_path: Path, **conf: object) -> Celery:
    app = Celery(name, broker="memory://", set_as_current=False)
    app.conf.agboss_database_url = f"sqlite:///{tmp_path / 'agboss.db'}"
    app.conf.agboss_pseudonym_key = "k" * 32
    app.conf.update(conf)
    AGBoss(app)
    return app


def test_the_sweep_sends_no_task_events_so_it_does_not_bury_the_payments_in_flower(
    tmp_path: Path,
) -> None:
    """A run every 30 s would fill Flower's tasks page; its counts are in its log line
    and the metrics. Celery's own task_annotations bring the events back."""
    assert _app("sweep-quiet", tmp_path).tasks["celery_agboss.sweep"].send_events is False
    shown = _app(
        "sweep-shown",
        tmp_path,
        task_annotations={"celery_agboss.sweep": {"send_events": True}},
    )
    assert shown.tasks["celery_agboss.sweep"].send_events is True


@pytest.fixture
def read_app(tmp_path: Path) -> Iterator[Celery]:
    """An app whose settings were read; its signal handlers disconnected after the test
    (its payment-task pattern must not reach another test's publishes)."""
    app = _app("late-write", tmp_path, agboss_payment_tasks=["late_write.*"])
    boss = AGBoss(app)
    boss.settings  # noqa: B018 - read, as at the first publish
    yield app
    disconnect(boss)
    boss.close()


def test_a_setting_written_after_the_settings_were_read_refuses_the_worker_and_beat(
    read_app: Celery,
) -> None:
    """Read once and frozen: a later write would be ignored, silently. The worker and beat
    refuse to start naming it; so does a list changed in place."""
    boss = AGBoss(read_app)
    assert boss.settings.lease_ttl_seconds == 30.0
    refuse_to_start_unless_configured(boss, "worker")  # nothing written since: starts
    read_app.conf.agboss_lease_ttl = 90
    read_app.conf.agboss_payment_tasks.append("billing.*")
    assert boss.settings.lease_ttl_seconds == 30.0, "frozen"
    assert boss.settings_written_after_read() == ["agboss_lease_ttl", "agboss_payment_tasks"]
    for what in ("worker", "beat"):
        with pytest.raises(SystemExit) as refused:
            refuse_to_start_unless_configured(boss, what)
        message = str(refused.value)
        assert message.startswith(f"celery_agboss refuses to start this {what}: agboss_lease")
        assert "after celery_agboss had read its settings" in message
    read_app.conf.agboss_lease_ttl = None  # back as it was read (unset): nothing changed
    read_app.conf.agboss_payment_tasks = ["late_write.*"]
    assert boss.settings_written_after_read() == []


def test_a_late_write_in_django_s_namespace_form_is_seen_too(read_app: Celery) -> None:
    read_app.conf["AGBOSS_RETRY_DELAY"] = 9
    assert AGBoss(read_app).settings_written_after_read() == ["agboss_retry_delay"]
