"""Which ``agboss_*`` settings exist, their defaults, and what a name that is none of them is told.

runtime.settings parses the values; this module only knows the names, so that a
misspelt key is refused (and a misspelt variable named) against the one table every
default is read from.
"""

from __future__ import annotations

import copy
import difflib
import logging
from collections.abc import Mapping
from typing import Any

from celery_agboss.core.durations import to_ms
from celery_agboss.core.engine_settings import (
    DEFAULT_ATTEMPT_TIMEOUT_MS,
    DEFAULT_LEASE_TTL_MS,
)

logger = logging.getLogger("celery_agboss")

PREFIX = "agboss_"
TESTING_ENV = "AGBOSS_TESTING"

# kombu's Redis transport redelivers an unacked message after this long (its
# visibility_timeout), and kombu's SQS transport after its own (1800 s); RabbitMQ
# closes a channel whose message is held unacked longer than its consumer_timeout.
REDIS_DEFAULT_VISIBILITY_TIMEOUT = 3600.0
SQS_DEFAULT_VISIBILITY_TIMEOUT = 1800.0
RABBITMQ_DEFAULT_CONSUMER_TIMEOUT = 1800.0

# Each default is written once, here (the engine's two in core.engine_settings): the
# fields of AGBossSettings and settings_from_conf both read these.
DEFAULT_LEASE_TTL_SECONDS = DEFAULT_LEASE_TTL_MS / 1000
DEFAULT_ATTEMPT_TIMEOUT_SECONDS = DEFAULT_ATTEMPT_TIMEOUT_MS / 1000
DEFAULT_SWEEP_INTERVAL_SECONDS = 30.0


def effective_interval(configured: float) -> float:
    """The sweep's period in seconds: ``configured``, or the default where it is 0 (no
    worker sweeps; beat or a loop sweeps at the default pace). The one place this is
    decided: the sweep's bounds and the outbox's claim count in it."""
    return configured if configured > 0 else DEFAULT_SWEEP_INTERVAL_SECONDS


DEFAULT_REQUESTED_GRACE_SECONDS = 300.0
DEFAULT_RETENTION_SECONDS = 604800.0  # 7 days: outbound-call and fenced-effect records
DEFAULT_RETRY_DELAY_SECONDS = 5.0
DEFAULT_OUTBOX_GRACE_SECONDS = 30.0  # before the sweep publishes a committed outbox row
DEFAULT_OUTBOX_GRACE_MS = to_ms(DEFAULT_OUTBOX_GRACE_SECONDS, what="agboss_outbox_grace")
DEFAULT_MAX_RECOVERY_ATTEMPTS = 10
DEFAULT_SWEEP_QUEUE = "agboss.sweep"
DEFAULT_METRICS_ADDRESS = "127.0.0.1"  # loopback: exposing it wider is a choice to make

# The durations read alike (seconds or a timedelta, with a default), by name.
DURATION_DEFAULTS: dict[str, float] = {
    "lease_ttl": DEFAULT_LEASE_TTL_SECONDS,
    "attempt_timeout": DEFAULT_ATTEMPT_TIMEOUT_SECONDS,
    "sweep_interval": DEFAULT_SWEEP_INTERVAL_SECONDS,
    "requested_grace": DEFAULT_REQUESTED_GRACE_SECONDS,
    "outbound_retention": DEFAULT_RETENTION_SECONDS,
    "fenced_effect_retention": DEFAULT_RETENTION_SECONDS,
    "retry_delay": DEFAULT_RETRY_DELAY_SECONDS,
    "outbox_grace": DEFAULT_OUTBOX_GRACE_SECONDS,
}
# Every setting's name without its prefix: a key or variable not here is no setting.
KNOWN_SETTINGS = frozenset(
    {
        *DURATION_DEFAULTS,
        "database_url",
        "django_database",
        "pseudonym_key",
        "tenant",
        "max_recovery_attempts",
        "visibility_timeout",
        "sweep_queue",
        "execution_retention",
        "payment_tasks",
        "metrics_port",
        "metrics_address",
        "metrics_dir",
        "prepared_statements",
        "encryption_keys",
    }
)


def _namespaces(conf: Mapping[str, Any]) -> list[str]:
    """Django's namespace as the conf has it (``CELERY_``), then the usual one."""
    found = getattr(conf, "prefix", None) or ""
    if not found or found.lower() == "celery_":
        return [found or "CELERY_"]
    return [found, "CELERY_"]


def _without_namespace(key: str, conf: Mapping[str, Any]) -> tuple[str, str]:
    """``key`` split into Django's namespace (``CELERY_``, '' when none) and the rest,
    each in its own case."""
    for namespace in _namespaces(conf):
        if key.lower().startswith(namespace.lower()):
            return key[: len(namespace)], key[len(namespace) :]
    return "", key


def _read_spelling(namespace: str, rest: str, conf: Mapping[str, Any]) -> str:
    """The spelling of ``namespace + rest`` the settings read: all lower or all upper
    case, the whole key. Under the conf's namespace, Celery reads the namespace's case
    only (``CELERY_AGBOSS_LEASE_TTL`` under ``namespace="CELERY"``); otherwise the key's
    own case when it is one already, else lower case."""
    key = namespace + rest
    prefix = getattr(conf, "prefix", None) or ""
    if namespace and prefix and namespace.lower() == prefix.lower():
        return key.upper() if prefix.isupper() else key.lower()
    return key if key.isupper() else key.lower()


def is_unknown_agboss_key(key: str, conf: Mapping[str, Any]) -> bool:
    """A misspelt ``agboss_*`` key (also under Django's namespace) is refused, not ignored;
    so is a known one in a case the settings never read (``agboss_LEASE_TTL``,
    ``CELERY_agboss_lease_ttl``): the whole key must be the spelling read
    (``_read_spelling``)."""
    namespace, rest = _without_namespace(key, conf)
    lowered = rest.lower()
    if not lowered.startswith(PREFIX):
        return False
    if lowered[len(PREFIX) :] not in KNOWN_SETTINGS:
        return True
    return key != _read_spelling(namespace, rest, conf)


def conf_value(conf: Mapping[str, Any], name: str) -> Any:
    """``agboss_<name>`` as the conf holds it (also Django's upper-case namespace form), or
    None: the one rule the settings are read by, and compared by at a worker's start."""
    key = PREFIX + name
    value = conf.get(key)
    return conf.get(key.upper()) if value is None else value


def written_settings(conf: Mapping[str, Any]) -> dict[str, Any]:
    """Every known setting's value in ``conf`` now (copies, so that a list changed in
    place later is seen as changed)."""
    return {name: _copied(conf_value(conf, name)) for name in sorted(KNOWN_SETTINGS)}


def _copied(value: Any) -> Any:
    try:
        return copy.deepcopy(value)
    except (TypeError, copy.Error):  # an object that cannot be copied is compared as it is
        return value


def changed_since(read: Mapping[str, Any], conf: Mapping[str, Any]) -> list[str]:
    """The settings whose value in ``conf`` is no longer the one read (``written_settings``
    then), by their key."""
    now = written_settings(conf)
    return [PREFIX + name for name in sorted(now) if now[name] != read.get(name)]


def closest_setting(name: str) -> str | None:
    """The known setting ``name`` was probably meant to be (``lease_tll`` → ``lease_ttl``)."""
    found = difflib.get_close_matches(name.lower(), sorted(KNOWN_SETTINGS), n=1, cutoff=0.75)
    return found[0] if found else None


def unknown_settings_message(unknown: list[str]) -> str:
    """The refusal of misspelt conf keys: each with the setting it was probably meant to be,
    in the spelling that is read (the whole key in one case: the namespace's)."""
    guesses = []
    for key in unknown:
        start = key.lower().index(PREFIX) + len(PREFIX)  # after Django's CELERY_ too
        close = closest_setting(key[start:])
        meant = None if close is None else _meant(key[: start - len(PREFIX)], key, close)
        guesses.append(f"{key!r}" + (f" (did you mean {meant!r}?)" if meant else ""))
    return (
        f"unknown celery_agboss setting{'s' if len(unknown) > 1 else ''} "
        f"{', '.join(guesses)}: refused rather than ignored, so that no setting silently "
        "keeps its default. "
        f"Known: {', '.join(sorted(PREFIX + name for name in KNOWN_SETTINGS))} "
        "(docs/api.md, Settings, has each one's default and unit)"
    )


def _meant(namespace: str, key: str, close: str) -> str:
    """``namespace + agboss_<close>`` as it is read. A key in one case that is refused
    anyway is under a namespace read in the other case (``celery_agboss_lease_ttl`` under
    ``CELERY``); another key under a namespace is named in upper case (Django reads
    upper-case settings only), and a key without one keeps its case when it has one."""
    meant = namespace + PREFIX + close
    one_case = key.isupper() or key.islower()
    if namespace and one_case and close == key[len(namespace) + len(PREFIX) :].lower():
        return meant.lower() if key.isupper() else meant.upper()
    if namespace:
        return meant.upper()
    return meant.upper() if key.isupper() else meant.lower()


_ENV_NOT_SETTINGS = (
    "AGBOSS_TEST",
    "AGBOSS_SABOTAGE",
    "AGBOSS_ALLOW_SABOTAGE",
    "AGBOSS_ENCRYPTION_KEY_",  # a key's bytes (core.sealing.key_variable)
    TESTING_ENV,
)


def warn_of_misspelt_variables(environ: Mapping[str, str]) -> None:
    """An ``AGBOSS_*`` variable that is no setting but close to one is named (the
    environment holds other programs' variables too, so it is not refused)."""
    upper = PREFIX.upper()
    for variable in sorted(environ):
        if not variable.startswith(upper) or variable.startswith(_ENV_NOT_SETTINGS):
            continue
        name = variable[len(upper) :].lower()
        if name in KNOWN_SETTINGS:
            continue
        close = closest_setting(name)
        if close is not None:
            logger.warning(
                "celery_agboss: the environment variable %s is not a setting and is ignored; "
                "did you mean %s?",
                variable,
                (PREFIX + close).upper(),
            )


__all__ = [
    "DEFAULT_ATTEMPT_TIMEOUT_SECONDS",
    "DEFAULT_LEASE_TTL_SECONDS",
    "DEFAULT_MAX_RECOVERY_ATTEMPTS",
    "DEFAULT_METRICS_ADDRESS",
    "DEFAULT_OUTBOX_GRACE_MS",
    "DEFAULT_OUTBOX_GRACE_SECONDS",
    "DEFAULT_REQUESTED_GRACE_SECONDS",
    "DEFAULT_RETENTION_SECONDS",
    "DEFAULT_RETRY_DELAY_SECONDS",
    "DEFAULT_SWEEP_INTERVAL_SECONDS",
    "DEFAULT_SWEEP_QUEUE",
    "DURATION_DEFAULTS",
    "KNOWN_SETTINGS",
    "PREFIX",
    "RABBITMQ_DEFAULT_CONSUMER_TIMEOUT",
    "REDIS_DEFAULT_VISIBILITY_TIMEOUT",
    "SQS_DEFAULT_VISIBILITY_TIMEOUT",
    "TESTING_ENV",
    "changed_since",
    "conf_value",
    "effective_interval",
    "is_unknown_agboss_key",
    "unknown_settings_message",
    "warn_of_misspelt_variables",
    "written_settings",
]
