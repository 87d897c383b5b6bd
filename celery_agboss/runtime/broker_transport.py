"""Which kind of broker an app talks to, decided as Celery and kombu decide it.

Celery builds a worker's connection from ``conf.broker_read_url`` (a publisher's from
``conf.broker_write_url``): the ``CELERY_BROKER_READ_URL`` / ``CELERY_BROKER_URL``
variables first, then the conf's ``broker_read_url`` / ``broker_url``; and
``conf.broker_transport`` where the URL names none. kombu takes the first broker of a
failover list (or of a ``;``-separated URL), and its scheme names the transport
(``amqp``, ``pyamqp`` and ``librabbitmq`` are RabbitMQ; ``redis``, ``rediss`` and
``sentinel`` are Redis; no URL at all is ``amqp://localhost``). This module asks kombu
the same question, without opening a connection, so every part of celery_agboss that
depends on the broker's kind (the visibility timeout the settings assume, whether
publisher confirms exist) reads it from one rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kombu.connection import Connection

AMQP = "amqp"
REDIS = "redis"
SQS = "sqs"


def broker_url(conf: Mapping[str, Any], *, for_write: bool = False) -> Any:
    """The URL (or failover list) Celery connects with: the read URL a worker consumes
    from, or the write URL a publisher sends to. ``conf`` is an app's ``conf`` (whose
    properties read the ``CELERY_BROKER_*`` variables) or a plain mapping."""
    name = "broker_write_url" if for_write else "broker_read_url"
    try:
        return getattr(conf, name)  # Celery's Settings: the environment, then the conf
    except AttributeError:  # a plain mapping
        return conf.get(name) or conf.get("broker_url")


def driver_type(conf: Mapping[str, Any], *, for_write: bool = False) -> str:
    """kombu's ``driver_type`` of the app's broker transport (``"amqp"``, ``"redis"``,
    ``"sqs"``, ``"memory"`` …), read from the transport's class without connecting. Where
    kombu cannot load that class here (SQS without boto3), the transport's name as the
    URL (or ``broker_transport``) gives it; ``""`` when there is none."""
    url = broker_url(conf, for_write=for_write)
    transport = conf.get("broker_transport")
    try:
        return str(Connection(url, transport=transport).get_transport_cls().driver_type)
    except Exception:
        pass
    if transport:
        return transport if isinstance(transport, str) else ""
    first = url if isinstance(url, str) or not url else next(iter(url), None)
    if not isinstance(first, str) or "://" not in first:
        return ""
    return first.split(";", 1)[0].split("://", 1)[0].split("+", 1)[0].strip().lower()


__all__ = ["AMQP", "REDIS", "SQS", "broker_url", "driver_type"]
