"""``signals.disconnect`` undoes every handler ``AGBoss(app)`` connected, those of the
workers' threads (sweep watch, store check, held messages, metrics, broker defaults)
included: a test process that builds hundreds of apps keeps none of them alive."""

from __future__ import annotations

from pathlib import Path

from celery import Celery
from celery import signals as celery_signals

from celery_agboss import AGBoss
from celery_agboss.signals import disconnect

_WATCHED = (
    celery_signals.celeryd_init,
    celery_signals.worker_init,
    celery_signals.worker_ready,
    celery_signals.worker_shutdown,
    celery_signals.worker_process_shutdown,
    celery_signals.beat_init,
    celery_signals.before_task_publish,
    celery_signals.task_revoked,
)


def _receivers() -> dict[str, int]:
    return {signal.name: len(signal.receivers) for signal in _WATCHED}


def test_disconnect_leaves_no_handler_of_the_app(tmp_path: Path) -> None:
    before = _receivers()
    app = Celery("disconnected", broker="memory://", set_as_current=False)
    app.conf.agboss_database_url = f"sqlite:///{tmp_path / 'agboss.db'}"
    app.conf.agboss_pseudonym_key = "k" * 32
    runtime = AGBoss(app)
    connected = _receivers()
    assert all(connected[name] > before[name] for name in ("worker_ready", "worker_shutdown"))
    disconnect(runtime)
    assert _receivers() == before
    app.close()
