"""The ``agboss_*`` settings, read once from ``app.conf`` into a frozen object.

Reading them once (at ``on_after_configure``) means a worker never runs with half
of one configuration and half of another, and a wrong value is refused when the
app starts, with the exact setting to change, instead of in the middle of a payment.
Durations accept seconds or a ``timedelta``; the attributes carry their unit.

A setting the app's conf does not give is read from the environment variable of the
same name in upper case (``AGBOSS_LEASE_TTL=10``), so a container or a process
manager can set it without touching the app's code; the conf wins when both are set.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from celery_agboss.core.durations import to_ms, to_seconds
from celery_agboss.core.keys import pseudonym_key_bytes, validate_tenant
from celery_agboss.core.sealing import KeyRing, key_ring_from
from celery_agboss.errors import ConfigurationError
from celery_agboss.runtime.django_store import DJANGO_APP, django_alias, django_store_url
from celery_agboss.runtime.known_settings import (
    DEFAULT_ATTEMPT_TIMEOUT_SECONDS,
    DEFAULT_LEASE_TTL_SECONDS,
    DEFAULT_MAX_RECOVERY_ATTEMPTS,
    DEFAULT_METRICS_ADDRESS,
    DEFAULT_OUTBOX_GRACE_SECONDS,
    DEFAULT_REQUESTED_GRACE_SECONDS,
    DEFAULT_RETENTION_SECONDS,
    DEFAULT_RETRY_DELAY_SECONDS,
    DEFAULT_SWEEP_INTERVAL_SECONDS,
    DEFAULT_SWEEP_QUEUE,
    DURATION_DEFAULTS,
    PREFIX,
    RABBITMQ_DEFAULT_CONSUMER_TIMEOUT,
    TESTING_ENV,
    conf_value,
    effective_interval,
    is_unknown_agboss_key,
    unknown_settings_message,
    warn_of_misspelt_variables,
)
from celery_agboss.runtime.visibility import visibility_timeout
from celery_agboss.store.databases import checked_url, redact_url

logger = logging.getLogger("celery_agboss")

# Only ever used when AGBOSS_TESTING=1: handles and fingerprints made with it mean nothing.
TESTING_PSEUDONYM_KEY = b"celery-agboss-testing-pseudonym-key-not-a-secret"


@dataclass(frozen=True)
class AGBossSettings:
    """Everything ``AGBoss`` needs, validated; build it with :func:`settings_from_conf`."""

    database_url: str
    pseudonym_key: bytes = field(repr=False)
    # None: the store's deployment id (agboss_meta, minted by the migration); a value
    # set here wins, e.g. to make two stores share keys on purpose (docs/keys.md).
    tenant: str | None = None
    lease_ttl_seconds: float = DEFAULT_LEASE_TTL_SECONDS
    attempt_timeout_seconds: float = DEFAULT_ATTEMPT_TIMEOUT_SECONDS
    sweep_interval_seconds: float = DEFAULT_SWEEP_INTERVAL_SECONDS
    requested_grace_seconds: float = DEFAULT_REQUESTED_GRACE_SECONDS
    outbound_retention_seconds: float = DEFAULT_RETENTION_SECONDS
    fenced_effect_retention_seconds: float = DEFAULT_RETENTION_SECONDS
    max_recovery_attempts: int = DEFAULT_MAX_RECOVERY_ATTEMPTS
    # The shortest broker redelivery timeout of any worker: a broker countdown
    # must stay below half of it (design: trap 1); longer waits go through the store.
    # A conf naming no broker is Celery's amqp://localhost: RabbitMQ's consumer_timeout.
    visibility_timeout_seconds: float = RABBITMQ_DEFAULT_CONSUMER_TIMEOUT
    # The countdown of the retry after an unknown outcome (then reconciled).
    retry_delay_seconds: float = DEFAULT_RETRY_DELAY_SECONDS
    # How long a committed outbox row is left to its own delivery before the sweep
    # publishes it (celery_agboss.outbox; an enqueue's grace= wins).
    outbox_grace_seconds: float = DEFAULT_OUTBOX_GRACE_SECONDS
    sweep_queue: str = DEFAULT_SWEEP_QUEUE
    # None: the longer of the two retentions above (design: retention).
    execution_retention_seconds: float | None = None
    # Task names (``fnmatch`` patterns) recorded at publish as PaymentTasks even in a
    # process that never imported their module (``app.send_task("shop.charge")``).
    payment_tasks: tuple[str, ...] = ()
    # The worker's Prometheus endpoint (celery_agboss.metrics): None is off.
    metrics_port: int | None = None
    metrics_address: str = DEFAULT_METRICS_ADDRESS
    # prometheus_client's multiprocess directory; None: a fresh one per worker.
    metrics_dir: str | None = None
    # False behind a pooler that hands each transaction another server connection
    # (PgBouncer's transaction mode before 1.21): psycopg then prepares no statement.
    prepared_statements: bool = True
    testing_key: bool = False
    # The Django database alias the store is (celery_agboss.contrib.django), or None.
    django_database: str | None = None
    # agboss_encryption_keys: the ring sealing records at rest (core.sealing), or None.
    encryption_keys: KeyRing | None = None

    @property
    def max_broker_countdown_seconds(self) -> float:
        """The longest countdown a retry may carry in a message (design: trap 1)."""
        return self.visibility_timeout_seconds / 2

    @property
    def terminal_execution_retention_seconds(self) -> float:
        """How long a terminal execution's row is kept (its records are kept as long)."""
        if self.execution_retention_seconds is not None:
            return self.execution_retention_seconds
        return max(self.outbound_retention_seconds, self.fenced_effect_retention_seconds)

    def retention_warning(self) -> str | None:
        """A retention below the broker's redelivery timeout, warned of (design: retention)."""
        kept = (self.outbound_retention_seconds, self.fenced_effect_retention_seconds)
        shortest = min(*kept, self.terminal_execution_retention_seconds)
        if shortest >= self.visibility_timeout_seconds:
            return None
        return (
            f"a retention of {shortest:g} s is shorter than the broker's visibility timeout "
            f"({self.visibility_timeout_seconds:g} s): a message redelivered after its "
            "execution's records are gone runs it again, and may charge again"
        )

    # The engine counts in milliseconds and the settings in seconds (as app.conf gives
    # them): these are the one place a duration setting becomes milliseconds.

    @property
    def lease_ttl_ms(self) -> int:
        return to_ms(self.lease_ttl_seconds, what="agboss_lease_ttl")

    @property
    def attempt_timeout_ms(self) -> int:
        return to_ms(self.attempt_timeout_seconds, what="agboss_attempt_timeout")

    @property
    def sweep_interval_ms(self) -> int:
        return to_ms(self.sweep_interval_seconds, what="agboss_sweep_interval")

    @property
    def sweep_period_ms(self) -> int:
        """What the sweep's bounds count in: the interval, or its default where it is 0."""
        return to_ms(effective_interval(self.sweep_interval_seconds), what="agboss_sweep_interval")

    @property
    def requested_grace_ms(self) -> int:
        return to_ms(self.requested_grace_seconds, what="agboss_requested_grace")

    @property
    def outbox_grace_ms(self) -> int:
        return to_ms(self.outbox_grace_seconds, what="agboss_outbox_grace")

    @property
    def outbound_retention_ms(self) -> int:
        return to_ms(self.outbound_retention_seconds, what="agboss_outbound_retention")

    @property
    def fenced_effect_retention_ms(self) -> int:
        return to_ms(self.fenced_effect_retention_seconds, what="agboss_fenced_effect_retention")

    @property
    def terminal_execution_retention_ms(self) -> int:
        return to_ms(self.terminal_execution_retention_seconds, what="agboss_execution_retention")

    def redacted_database_url(self) -> str:
        """The store URL with its password hidden, for logs."""
        return redact_url(self.database_url)


@dataclass(frozen=True)
class _Source:
    """Where the settings come from: the app's conf, then the environment."""

    conf: Mapping[str, Any]
    environ: Mapping[str, str]

    def get(self, name: str) -> Any:
        """``agboss_<name>`` from the conf (also Django's upper-case namespace form), else
        the environment variable ``AGBOSS_<NAME>`` (a string), else None."""
        value = conf_value(self.conf, name)
        if value is None:
            text = self.environ.get((PREFIX + name).upper())
            value = text if text not in (None, "") else None
        return value

    def where(self, name: str) -> str:
        """How a message names the setting: the conf key, or the variable it came from."""
        key = PREFIX + name
        in_conf = conf_value(self.conf, name) is not None
        if not in_conf and self.environ.get(key.upper()) not in (None, ""):
            return f"the environment variable {key.upper()}"
        return key


def _number(raw: Any) -> Any:
    """A value from the environment is text: a number in it becomes a number."""
    if isinstance(raw, str):
        try:
            return float(raw.strip())
        except ValueError:
            return raw
    return raw


def _duration(source: _Source, name: str, default: float, *, allow_zero: bool) -> float:
    raw = _number(source.get(name))
    if raw is None:
        return default
    where = source.where(name)
    try:
        seconds = to_seconds(raw, what=where)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(str(exc), setting=PREFIX + name) from None
    # The engine counts in whole milliseconds: below half of one is 0 there, so it is
    # refused where 0 is (a 0.0004 s timeout would otherwise pass as "positive").
    if seconds < 0 or (to_ms(seconds, what=where) == 0 and not allow_zero):
        raise ConfigurationError(
            f"{where} must be {'zero or ' if allow_zero else ''}positive "
            f"(seconds or a timedelta{'' if allow_zero else ', at least 1 ms'}), not {raw!r}",
            setting=PREFIX + name,
        )
    return seconds


def _database_url(source: _Source) -> tuple[str, str | None]:
    """The store's URL, and the Django alias it was built from (None: set as a URL)."""
    url = source.get("database_url")
    configured_alias = source.get("django_database")
    if url and configured_alias is not None:
        raise ConfigurationError(
            "agboss_database_url and agboss_django_database are both set: the store is one "
            "database, so set one of them",
            setting="agboss_django_database",
        )
    alias = None if url else django_alias(configured_alias)
    if alias is not None:
        url = django_store_url(alias)
    if not url or not isinstance(url, str):
        raise ConfigurationError(
            "agboss_database_url is not set: set app.conf.agboss_database_url to the store, e.g. "
            "'postgresql+psycopg://user@host/db' or 'sqlite:////absolute/path/agboss.db' (in a "
            f"Django project, add {DJANGO_APP!r} to INSTALLED_APPS instead)",
            setting="agboss_database_url",
        )
    checked_url(url)
    return url, alias


def _pseudonym_key(source: _Source) -> tuple[bytes, bool]:
    key = source.get("pseudonym_key")
    if key is None or key == "" or key == b"":
        if source.environ.get(TESTING_ENV) == "1":
            logger.warning(
                "agboss_pseudonym_key is not set; %s=1, so a fixed test key is used. "
                "Never run payments like this.",
                TESTING_ENV,
            )
            return TESTING_PSEUDONYM_KEY, True
        raise ConfigurationError(
            "agboss_pseudonym_key is not set: set app.conf.agboss_pseudonym_key to a secret of "
            "at least 16 bytes, the same on every worker (e.g. from an environment variable)",
            setting="agboss_pseudonym_key",
        )
    # One rule for every way a key arrives (the conf, the environment, the engine):
    # core.keys decides what is refused, whitespace around it included.
    return pseudonym_key_bytes(key), False


def _visibility_timeout(source: _Source) -> float:
    """The declared shortest timeout (capped by this app's own), else this app's own
    broker's, else its transport's default (``runtime.visibility``)."""
    declared = (
        None
        if source.get("visibility_timeout") is None
        else _duration(source, "visibility_timeout", 0.0, allow_zero=False)
    )
    return visibility_timeout(source.conf, declared, named=source.where("visibility_timeout"))


def _tenant(source: _Source) -> str | None:
    """``agboss_tenant`` checked by the key rules, or None: the store's deployment id."""
    tenant = source.get("tenant")
    if tenant is None or tenant == "":
        return None
    if not isinstance(tenant, str):
        raise ConfigurationError(
            f"{source.where('tenant')} must be a string, not {type(tenant).__name__}",
            setting="agboss_tenant",
        )
    return validate_tenant(tenant)


def _payment_tasks(source: _Source) -> tuple[str, ...]:
    raw = source.get("payment_tasks")
    if raw is None:
        return ()
    if isinstance(raw, str):
        raw = [part.strip() for part in raw.split(",")]
    if not isinstance(raw, (list, tuple, set, frozenset)) or not all(
        isinstance(name, str) for name in raw
    ):
        raise ConfigurationError(
            f"{source.where('payment_tasks')} must be a list of task names (fnmatch "
            f"patterns such as 'shop.charge_*' allowed), not {raw!r}",
            setting="agboss_payment_tasks",
        )
    return tuple(sorted({name for name in raw if name}))


def _positive_int(source: _Source, name: str, default: int) -> int:
    raw = source.get(name)
    if raw is None:
        return default
    if isinstance(raw, str) and raw.strip().isdigit():
        raw = int(raw.strip())
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        raise ConfigurationError(
            f"{source.where(name)} must be a positive integer, not {raw!r}",
            setting=PREFIX + name,
        )
    return raw


def _metrics_port(source: _Source) -> int | None:
    """A TCP port, or None (unset, or 0) for no endpoint."""
    raw = _number(source.get("metrics_port"))
    if raw is None:
        return None
    if isinstance(raw, float) and raw.is_integer():
        raw = int(raw)
    if isinstance(raw, bool) or not isinstance(raw, int) or not 0 <= raw <= 65535:
        raise ConfigurationError(
            f"{source.where('metrics_port')} must be a TCP port (1-65535, or 0 for no "
            f"metrics endpoint), not {raw!r}",
            setting="agboss_metrics_port",
        )
    return raw or None


_ADDRESS = "an address to listen on, such as '127.0.0.1' or '0.0.0.0'"
_QUEUE = f"a queue name such as {DEFAULT_SWEEP_QUEUE!r}"


def _text(source: _Source, name: str, default: str, what: str) -> str:
    """A setting that is a name (a queue, an address): a list, a number or bytes given
    for it would become an odd name, so only non-blank text is taken."""
    raw = source.get(name)
    if raw is None:
        return default
    if not isinstance(raw, str) or not raw.strip():
        raise ConfigurationError(
            f"{source.where(name)} must be {what}, not {raw!r}", setting=PREFIX + name
        )
    return raw.strip()


def _metrics_dir(source: _Source) -> str | None:
    raw = source.get("metrics_dir")
    if raw is None:
        return None
    path = os.fspath(raw) if isinstance(raw, os.PathLike) else raw
    if not isinstance(path, str) or not os.path.isabs(path):
        raise ConfigurationError(
            f"{source.where('metrics_dir')} must be an absolute directory path (one per "
            f"worker, never shared), not {raw!r}",
            setting="agboss_metrics_dir",
        )
    return path


_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def _flag(source: _Source, name: str, default: bool) -> bool:
    """A yes/no setting: a bool in ``app.conf``, or its text in the environment."""
    raw = source.get(name)
    if raw is None:
        return default
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.strip().lower() in _TRUE | _FALSE:
        return raw.strip().lower() in _TRUE
    raise ConfigurationError(
        f"{source.where(name)} must be True or False (in the environment: true/false, "
        f"1/0, yes/no or on/off), not {raw!r}",
        setting=f"agboss_{name}",
    )


def settings_from_conf(
    conf: Mapping[str, Any], environ: Mapping[str, str] | None = None
) -> AGBossSettings:
    """Validate and freeze the ``agboss_*`` settings; ConfigurationError names what to set.

    A setting missing from ``conf`` is read from ``environ`` (default ``os.environ``)
    under its upper-case name, ``AGBOSS_LEASE_TTL`` for ``agboss_lease_ttl``.
    """
    env = os.environ if environ is None else environ
    unknown = sorted(key for key in map(str, conf) if is_unknown_agboss_key(key, conf))
    if unknown:
        raise ConfigurationError(unknown_settings_message(unknown), setting=unknown[0])
    warn_of_misspelt_variables(env)
    source = _Source(conf, env)
    database_url, django_database = _database_url(source)
    key, testing_key = _pseudonym_key(source)
    tenant = _tenant(source)
    cap = _positive_int(source, "max_recovery_attempts", DEFAULT_MAX_RECOVERY_ATTEMPTS)
    durations = {
        name: _duration(
            source, name, default, allow_zero=name in ("sweep_interval", "outbox_grace")
        )
        for name, default in DURATION_DEFAULTS.items()
    }
    if durations["lease_ttl"] < 3:
        raise ConfigurationError(
            "agboss_lease_ttl below 3 s leaves no room for renewals every ttl/3 and a 1 s margin",
            setting="agboss_lease_ttl",
        )
    execution_retention = (
        None
        if source.get("execution_retention") is None
        else _duration(source, "execution_retention", 0.0, allow_zero=False)
    )
    visibility = _visibility_timeout(source)
    return AGBossSettings(
        database_url=database_url,
        django_database=django_database,
        pseudonym_key=key,
        tenant=tenant,
        lease_ttl_seconds=durations["lease_ttl"],
        attempt_timeout_seconds=durations["attempt_timeout"],
        sweep_interval_seconds=durations["sweep_interval"],
        requested_grace_seconds=durations["requested_grace"],
        outbound_retention_seconds=durations["outbound_retention"],
        fenced_effect_retention_seconds=durations["fenced_effect_retention"],
        max_recovery_attempts=cap,
        visibility_timeout_seconds=visibility,
        retry_delay_seconds=durations["retry_delay"],
        outbox_grace_seconds=durations["outbox_grace"],
        sweep_queue=_text(source, "sweep_queue", DEFAULT_SWEEP_QUEUE, _QUEUE),
        execution_retention_seconds=execution_retention,
        payment_tasks=_payment_tasks(source),
        metrics_port=_metrics_port(source),
        metrics_address=_text(source, "metrics_address", DEFAULT_METRICS_ADDRESS, _ADDRESS),
        metrics_dir=_metrics_dir(source),
        prepared_statements=_flag(source, "prepared_statements", True),
        testing_key=testing_key,
        encryption_keys=key_ring_from(source.get("encryption_keys"), env),
    )


__all__ = ["AGBossSettings", "redact_url", "settings_from_conf"]
