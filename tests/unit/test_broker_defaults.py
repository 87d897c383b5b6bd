"""``AGBoss(app)`` turns publisher confirms on (``broker_transport_options
["confirm_publish"]``), keeps every transport option the application set, and keeps its
own ``confirm_publish`` (warning of a false one on RabbitMQ). No broker is reached:
the real publish on RabbitMQ is tests/integration/test_publisher_confirms.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from celery import Celery
from celery import signals as celery_signals

from celery_agboss import AGBoss
from celery_agboss.core.protections import PUBLISHER_CONFIRMS_LEFT_UNSET
from celery_agboss.runtime.broker_defaults import CONFIRM_PUBLISH, confirms_refused_warning
from celery_agboss.testing.switches import sabotage

AMQP = "amqp://guest:guest@127.0.0.1:5672//"


class _Worker:
    """What ``worker_init`` is sent with: an object with the worker's app."""

    def __init__(self, app: Celery) -> None:
        self.app = app


def _app(tmp_path: Path, broker: str = "memory://", **conf: Any) -> Celery:
    app = Celery("confirms", broker=broker, set_as_current=False)
    app.conf.agboss_database_url = f"sqlite:///{tmp_path / 'agboss.db'}"
    app.conf.agboss_pseudonym_key = "k" * 32
    app.conf.update(conf)
    AGBoss(app)
    return app


def test_confirms_are_on_and_every_other_option_is_kept(tmp_path: Path) -> None:
    app = _app(tmp_path, broker_transport_options={"visibility_timeout": 40})
    assert app.conf.broker_transport_options == {"visibility_timeout": 40, CONFIRM_PUBLISH: True}
    assert app.connection_for_write().transport_options[CONFIRM_PUBLISH] is True
    assert Celery("other", set_as_current=False).conf.broker_transport_options == {}, (
        "Celery's default dict, shared by every app, is left alone"
    )


def test_an_explicit_confirm_publish_is_kept_and_a_false_one_warned_of_on_rabbitmq(
    tmp_path: Path,
) -> None:
    off = _app(tmp_path, broker=AMQP, broker_transport_options={CONFIRM_PUBLISH: False})
    assert off.conf.broker_transport_options == {CONFIRM_PUBLISH: False}
    warning = confirms_refused_warning(off)
    assert warning is not None and "is recorded as sent" in warning
    assert confirms_refused_warning(_app(tmp_path, broker=AMQP)) is None
    redis_off = _app(
        tmp_path, broker="redis://127.0.0.1:6379/0", broker_transport_options={"confirm_publish": 0}
    )
    assert redis_off.conf.broker_transport_options == {CONFIRM_PUBLISH: 0}
    assert confirms_refused_warning(redis_off) is None, "Redis has no confirms to lose"


def test_an_app_configured_before_agboss_gets_them_too(tmp_path: Path) -> None:
    app = Celery("early", broker="memory://", set_as_current=False)
    app.conf.agboss_database_url = f"sqlite:///{tmp_path / 'agboss.db'}"
    assert app.conf.broker_transport_options == {}  # the conf is loaded here
    AGBoss(app)
    assert app.conf.broker_transport_options == {CONFIRM_PUBLISH: True}


def test_options_replaced_after_the_conf_was_read_get_them_back_when_a_worker_starts(
    tmp_path: Path,
) -> None:
    app = _app(tmp_path)
    assert app.conf.broker_transport_options[CONFIRM_PUBLISH] is True
    app.conf.broker_transport_options = {"max_retries": 3}
    celery_signals.worker_init.send(sender=_Worker(app))
    assert app.conf.broker_transport_options == {"max_retries": 3, CONFIRM_PUBLISH: True}


def test_a_conf_loaded_again_gets_them_again(tmp_path: Path) -> None:
    app = _app(tmp_path)
    assert app.conf.broker_transport_options[CONFIRM_PUBLISH] is True
    app.config_from_object({"broker_transport_options": {"visibility_timeout": 9}})
    assert app.conf.broker_transport_options == {"visibility_timeout": 9, CONFIRM_PUBLISH: True}


def test_without_the_default_the_option_stays_unset(tmp_path: Path) -> None:
    with sabotage(PUBLISHER_CONFIRMS_LEFT_UNSET):
        app = _app(tmp_path)
        assert app.conf.broker_transport_options == {}
