"""The visibility timeout the settings assume is the broker's the app really uses.

A broker countdown must stay below half the shortest redelivery timeout of any worker
(design: trap 1): a retry waiting longer in the broker is handed out again (Redis,
SQS) or closes the channel holding it (RabbitMQ's consumer_timeout). So the settings
must name the broker as Celery and kombu do: from ``CELERY_BROKER_URL`` too, from the
first broker of a failover list, with SQS's own default; and a declared
``agboss_visibility_timeout`` longer than this app's own workers' timeout must not be
believed.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from celery import Celery

from celery_agboss import AGBoss
from celery_agboss.runtime.broker_defaults import confirms_refused_warning
from celery_agboss.runtime.broker_transport import driver_type
from celery_agboss.runtime.known_settings import (
    RABBITMQ_DEFAULT_CONSUMER_TIMEOUT,
    REDIS_DEFAULT_VISIBILITY_TIMEOUT,
    SQS_DEFAULT_VISIBILITY_TIMEOUT,
)
from celery_agboss.runtime.settings import AGBossSettings

URL = "sqlite:////var/lib/shop/agboss.db"
KEY = "a-pseudonym-key-of-enough-bytes"
AMQP = "amqp://guest:guest@127.0.0.1:5672//"
REDIS = "redis://127.0.0.1:6379/0"


def _settings(apps: list[Celery], broker: Any = None, **values: Any) -> AGBossSettings:
    app = Celery(f"visibility-{len(apps)}", broker=broker, set_as_current=False)
    app.conf.update({"agboss_database_url": URL, "agboss_pseudonym_key": KEY, **values})
    apps.append(app)
    return AGBoss(app).settings


def _declared_beside_own_600(apps: list[Celery], declared: int) -> AGBossSettings:
    """A Redis app whose own workers redeliver after 600 s, declaring ``declared``."""
    return _settings(
        apps,
        broker=REDIS,
        agboss_visibility_timeout=declared,
        broker_transport_options={"visibility_timeout": 600},
    )


def _consumes_from(app: Celery) -> str:
    """The transport kind of the connection Celery's worker consumes with."""
    with app.connection_for_read() as connection:
        return str(connection.transport.driver_type)


def test_a_rabbitmq_named_by_celery_broker_url_gets_the_consumer_timeout(
    apps: list[Celery], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Celery reads CELERY_BROKER_URL (conf.broker_url is a property); reading the conf's
    key alone saw no broker and assumed Redis's 3600 s, so a retry countdown of up to
    1800 s rode in a RabbitMQ that closes the channel after 1800 s."""
    monkeypatch.setenv("CELERY_BROKER_URL", AMQP)
    settings = _settings(apps)
    assert _consumes_from(apps[-1]) == "amqp"
    assert settings.visibility_timeout_seconds == RABBITMQ_DEFAULT_CONSUMER_TIMEOUT
    assert settings.max_broker_countdown_seconds == RABBITMQ_DEFAULT_CONSUMER_TIMEOUT / 2


def test_a_rabbitmq_failover_list_gets_the_consumer_timeout(apps: list[Celery]) -> None:
    """Celery(broker=[...]) is a failover list; its text starts with '[' and named no
    known scheme, so Redis's 3600 s was assumed."""
    settings = _settings(apps, broker=[AMQP, "amqp://guest:guest@127.0.0.2:5672//"])
    assert _consumes_from(apps[-1]) == "amqp"
    assert settings.visibility_timeout_seconds == RABBITMQ_DEFAULT_CONSUMER_TIMEOUT


def test_a_semicolon_failover_url_is_named_by_its_first_broker(apps: list[Celery]) -> None:
    settings = _settings(apps, broker=f"{AMQP};{REDIS}")
    assert settings.visibility_timeout_seconds == RABBITMQ_DEFAULT_CONSUMER_TIMEOUT


def test_an_sqs_broker_gets_kombus_sqs_default(apps: list[Celery]) -> None:
    """kombu's SQS channel redelivers after 1800 s by default, not Redis's 3600 s (even
    where boto3 is missing and kombu cannot load the transport, the URL names it)."""
    settings = _settings(apps, broker="sqs://")
    assert SQS_DEFAULT_VISIBILITY_TIMEOUT == 1800
    assert settings.visibility_timeout_seconds == SQS_DEFAULT_VISIBILITY_TIMEOUT


def test_a_redis_broker_keeps_redis_default(apps: list[Celery]) -> None:
    settings = _settings(apps, broker=REDIS)
    assert settings.visibility_timeout_seconds == REDIS_DEFAULT_VISIBILITY_TIMEOUT


def test_a_declared_timeout_longer_than_the_apps_own_transport_option_is_capped(
    apps: list[Celery], caplog: pytest.LogCaptureFixture
) -> None:
    """agboss_visibility_timeout is the SHORTEST timeout of any worker: this app's own
    workers redeliver after 600 s, so 7200 cannot be it. Believed, countdowns of up to
    3600 s rode in a broker that hands them out again after 600 s; the shorter one is
    used, and the contradiction is said with both values."""
    with caplog.at_level(logging.WARNING, logger="celery_agboss"):
        settings = _declared_beside_own_600(apps, 7200)
    assert settings.visibility_timeout_seconds == 600
    assert settings.max_broker_countdown_seconds == 300
    said = [r.getMessage() for r in caplog.records if "agboss_visibility_timeout" in r.message]
    assert said and "7200" in said[0] and "600" in said[0], said


def test_a_declared_timeout_longer_than_redis_default_is_capped(apps: list[Celery]) -> None:
    """Each Redis client restores unacked messages after its own visibility_timeout
    (kombu's default 3600 s here): this app's workers do, whatever is declared."""
    settings = _settings(apps, broker=REDIS, agboss_visibility_timeout=7200)
    assert settings.visibility_timeout_seconds == REDIS_DEFAULT_VISIBILITY_TIMEOUT


def test_a_declared_shorter_timeout_is_used_as_declared(apps: list[Celery]) -> None:
    """Another worker's shorter timeout is what the declaration is for."""
    settings = _declared_beside_own_600(apps, 120)
    assert settings.visibility_timeout_seconds == 120


def test_a_declared_timeout_on_rabbitmq_is_believed(apps: list[Celery]) -> None:
    """RabbitMQ's consumer_timeout is the server's: an operator may have raised it."""
    settings = _settings(apps, broker=AMQP, agboss_visibility_timeout=7200)
    assert settings.visibility_timeout_seconds == 7200


def test_a_visibility_option_on_rabbitmq_never_lengthens_the_consumer_timeout(
    apps: list[Celery],
) -> None:
    """kombu's amqp transport never reads broker_transport_options['visibility_timeout']."""
    long_option = _settings(
        apps, broker=AMQP, broker_transport_options={"visibility_timeout": 7200}
    )
    assert long_option.visibility_timeout_seconds == RABBITMQ_DEFAULT_CONSUMER_TIMEOUT
    short_option = _settings(apps, broker=AMQP, broker_transport_options={"visibility_timeout": 60})
    assert short_option.visibility_timeout_seconds == 60


def test_an_unknown_transport_gets_the_shortest_known_default(apps: list[Celery]) -> None:
    settings = _settings(apps, broker="memory://")
    assert settings.visibility_timeout_seconds == RABBITMQ_DEFAULT_CONSUMER_TIMEOUT


@pytest.mark.parametrize(
    "broker",
    [None, AMQP, [AMQP, REDIS], f"{REDIS};{AMQP}", REDIS, "rediss://h:6380/0", "memory://"],
)
def test_the_one_rule_names_the_transport_celery_connects_with(
    apps: list[Celery], broker: Any
) -> None:
    """The settings, the publisher-confirms warning and Celery's own connection agree."""
    app = Celery(f"driver-{len(apps)}", broker=broker, set_as_current=False)
    apps.append(app)
    assert driver_type(app.conf) == _consumes_from(app)


def test_the_confirms_warning_reads_the_broker_from_the_environment_too(
    apps: list[Celery], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CELERY_BROKER_URL", AMQP)
    app = Celery("confirms-env", broker=REDIS, set_as_current=False)
    app.conf.broker_transport_options = {"confirm_publish": False}
    apps.append(app)
    assert confirms_refused_warning(app) is not None
