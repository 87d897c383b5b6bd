"""AGBoss(app) binds lazily: settings are read when the app is configured, not before."""

from __future__ import annotations

from pathlib import Path

from celery import Celery

from celery_agboss import AGBoss


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
