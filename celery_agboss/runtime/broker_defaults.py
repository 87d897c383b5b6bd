"""Publisher confirms on by default: a message the broker drops is never recorded as sent.

kombu publishes to RabbitMQ without publisher confirms unless
``broker_transport_options["confirm_publish"]`` asks for them: a publish returns once
its bytes are written, and a message the broker drops after that (a queue at its
``x-max-length`` with ``x-overflow: reject-publish``, a memory or disk alarm) is lost
without an error. celery_agboss takes a publish that returned for a message sent: an
outbox row is marked published, a chain's next step is marked dispatched, and nothing
sends them again. So ``AGBoss(app)`` turns the confirms on: each publish waits for the
broker's answer, and a refusal raises (the outbox row stays for the sweep). Every other
transport option is kept; a ``confirm_publish`` the application set itself is kept
too, and a false one is warned of when a worker starts. Transports without confirms
(Redis, SQS, the in-memory one) never read the key.

kombu reads the options when a connection object is made (Celery copies them from
the conf then), so the key is added when the app's conf is loaded, before any
connection of the process, and again when a worker or beat starts, in case the
application replaced the dict after its conf was first read.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from celery import signals as celery_signals

from celery_agboss.core import sabotage
from celery_agboss.core.protections import PUBLISHER_CONFIRMS_LEFT_UNSET
from celery_agboss.runtime.app_runtime import Runtime
from celery_agboss.runtime.broker_transport import AMQP, driver_type

logger = logging.getLogger("celery_agboss")

CONFIRM_PUBLISH = "confirm_publish"
"""The transport option of kombu's amqp transport that turns publisher confirms on."""


def transport_options(app: Any) -> Mapping[str, Any]:
    """The app's ``broker_transport_options`` (an empty mapping when unset or not one)."""
    options = app.conf.broker_transport_options
    return options if isinstance(options, Mapping) else {}


def confirm_publish_by_default(app: Any) -> None:
    """Add ``confirm_publish: True`` to the app's transport options, unless they name it.

    A new dict, never the application's own changed in place (Celery's default ``{}``
    is shared by every app of the process)."""
    if sabotage.active(PUBLISHER_CONFIRMS_LEFT_UNSET):
        return
    options = app.conf.broker_transport_options
    if options is not None and not isinstance(options, Mapping):
        return  # not a mapping: Celery says so at the first connection
    if options is not None and CONFIRM_PUBLISH in options:
        return
    app.conf.broker_transport_options = {**(options or {}), CONFIRM_PUBLISH: True}


def _speaks_amqp(app: Any) -> bool:
    """Whether the app's broker has publisher confirms (kombu's amqp transports); no
    connection is opened to tell. A broker kombu cannot name counts as one: say it
    rather than keep quiet."""
    return driver_type(app.conf, for_write=True) in (AMQP, "")


def confirms_refused_warning(app: Any) -> str | None:
    """What an application's own ``confirm_publish`` false costs on a broker that has
    confirms; None when it is on, or the broker has none."""
    options = transport_options(app)
    if CONFIRM_PUBLISH not in options or options[CONFIRM_PUBLISH] or not _speaks_amqp(app):
        return None
    return (
        f"broker_transport_options[{CONFIRM_PUBLISH!r}] is {options[CONFIRM_PUBLISH]!r}: "
        "without publisher confirms a message the broker drops after accepting it (a full "
        "queue that rejects publishes, a memory or disk alarm) is recorded as sent: its "
        "outbox row is marked published, a chain's next step dispatched, and it never "
        "runs. Remove the key (celery_agboss then sets it to True) unless that is accepted"
    )


def install(runtime: Runtime) -> None:
    """Called by ``AGBoss(app)``: the app publishes with confirms from its first
    connection on, and its workers warn of confirms the application turned off."""
    app = runtime.app

    def on_after_configure(sender: Any = None, **_: Any) -> None:
        if sender is app:
            confirm_publish_by_default(app)

    def on_start(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is app:
            confirm_publish_by_default(app)

    def on_worker_ready(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is app:
            warning = confirms_refused_warning(app)
            if warning is not None:
                logger.warning("celery_agboss: %s", warning)

    runtime.listen(app.on_after_configure, on_after_configure)
    runtime.listen(celery_signals.worker_init, on_start)
    runtime.listen(celery_signals.beat_init, on_start)
    runtime.listen(celery_signals.worker_ready, on_worker_ready)
    if app.configured:
        confirm_publish_by_default(app)


__all__ = ["CONFIRM_PUBLISH", "confirms_refused_warning", "install"]
