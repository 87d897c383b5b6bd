"""How long a message may stay unacknowledged before the broker hands it out again.

``agboss_visibility_timeout`` is the shortest redelivery timeout of any worker on the
broker: a broker countdown stays below half of it, and longer waits go through the
store (design: trap 1). Unset, it is this app's own broker's, as kombu resolves the
broker (``runtime.broker_transport``): ``broker_transport_options['visibility_timeout']``
where the app sets it, else the transport's default (Redis 3600 s; SQS 1800 s;
RabbitMQ's ``consumer_timeout``, 1800 s; any other transport the shortest of these).

A declared value longer than this app's own workers' timeout (their transport option,
or kombu's Redis default, which each Redis client applies itself) cannot be the
shortest: the shorter one is used, and the contradiction is logged.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from celery_agboss.core.durations import to_seconds
from celery_agboss.errors import ConfigurationError
from celery_agboss.runtime.broker_transport import AMQP, REDIS, SQS, driver_type
from celery_agboss.runtime.known_settings import (
    RABBITMQ_DEFAULT_CONSUMER_TIMEOUT,
    REDIS_DEFAULT_VISIBILITY_TIMEOUT,
    SQS_DEFAULT_VISIBILITY_TIMEOUT,
)

logger = logging.getLogger("celery_agboss")

OPTION = "broker_transport_options['visibility_timeout']"

DEFAULT_BY_DRIVER: dict[str, float] = {
    REDIS: REDIS_DEFAULT_VISIBILITY_TIMEOUT,
    SQS: SQS_DEFAULT_VISIBILITY_TIMEOUT,
    AMQP: RABBITMQ_DEFAULT_CONSUMER_TIMEOUT,
}
# A transport whose default is not known here gets the shortest known one: a shorter
# timeout only sends more long waits through the store.
UNKNOWN_DRIVER_DEFAULT = min(DEFAULT_BY_DRIVER.values())


def _option(conf: Mapping[str, Any]) -> float | None:
    """The app's ``broker_transport_options['visibility_timeout']`` in seconds, or None."""
    options = conf.get("broker_transport_options") or {}
    if not isinstance(options, Mapping) or "visibility_timeout" not in options:
        return None
    raw = options["visibility_timeout"]
    if isinstance(raw, str):
        with contextlib.suppress(ValueError):  # a number written as text
            raw = float(raw.strip())
    try:
        seconds = to_seconds(raw, what=OPTION)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(str(exc), setting="broker_transport_options") from None
    if seconds <= 0:
        raise ConfigurationError(
            f"{OPTION} must be positive seconds, not {raw!r}", setting="broker_transport_options"
        )
    return seconds


def _own(conf: Mapping[str, Any], driver: str, default: float) -> tuple[float, str] | None:
    """This app's own workers' timeout and where it comes from, where it is a fact of
    this app: its transport option, or the Redis default each Redis client applies."""
    option = _option(conf)
    if option is None:
        return (default, "kombu's Redis default") if driver == REDIS else None
    if driver == AMQP and option > default:
        # kombu's amqp transport never reads the option: RabbitMQ's consumer_timeout rules.
        return default, f"RabbitMQ's default consumer_timeout ({OPTION} is not read by amqp)"
    return option, OPTION


def visibility_timeout(conf: Mapping[str, Any], declared: float | None, *, named: str) -> float:
    """The visibility timeout the settings use: ``declared`` (``agboss_visibility_timeout``,
    in seconds, or None), capped by this app's own; unset, the app's own broker's."""
    driver = driver_type(conf)
    default = DEFAULT_BY_DRIVER.get(driver, UNKNOWN_DRIVER_DEFAULT)
    own = _own(conf, driver, default)
    if declared is None:
        return default if own is None else own[0]
    if own is None or own[0] >= declared:
        return declared
    seconds, source = own
    logger.warning(
        "celery_agboss: %s is %g s, but this app's own workers redeliver an unacknowledged "
        "message after %g s (%s): %g s is used, so a broker countdown stays below %g s. "
        "Set %s to at most %g s (it is the shortest timeout of any worker)",
        named,
        declared,
        seconds,
        source,
        seconds,
        seconds / 2,
        named,
        seconds,
    )
    return seconds


__all__ = ["DEFAULT_BY_DRIVER", "UNKNOWN_DRIVER_DEFAULT", "visibility_timeout"]
