"""``agboss_*`` values that looked accepted but were not what the app ran with: a key in
mixed case (never read), a duration below half a millisecond (0 ms to the engine) and a
sweep queue that is no queue name. Each is refused when the settings are read."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from celery import Celery

from celery_agboss import ConfigurationError
from celery_agboss.runtime.settings import settings_from_conf

URL = "sqlite:////var/lib/shop/agboss.db"
KEY = "a-pseudonym-key-of-enough-bytes"


def conf(**values: Any) -> dict[str, Any]:
    return {"agboss_database_url": URL, "agboss_pseudonym_key": KEY, **values}


@pytest.mark.parametrize("key", ["Agboss_Lease_TTL", "agboss_LEASE_TTL", "AGBOSS_lease_ttl"])
def test_a_known_key_in_mixed_case_is_refused_naming_the_spelling_read(key: str) -> None:
    """Only ``agboss_lease_ttl`` and ``AGBOSS_LEASE_TTL`` are read: any other case kept the
    default (30 s) silently."""
    with pytest.raises(ConfigurationError, match="did you mean 'agboss_lease_ttl'") as caught:
        settings_from_conf(conf(**{key: 12}), environ={})
    assert caught.value.setting == key


@pytest.mark.parametrize("key", ["agboss_lease_ttl", "AGBOSS_LEASE_TTL"])
def test_the_two_spellings_read_still_work(key: str) -> None:
    assert settings_from_conf(conf(**{key: 12}), environ={}).lease_ttl_seconds == 12


@pytest.mark.parametrize(
    "name, value",
    [
        ("agboss_attempt_timeout", 0.0004),
        ("agboss_outbound_retention", 0.0004),
        ("agboss_execution_retention", timedelta(microseconds=1)),
        ("agboss_visibility_timeout", 0.0001),
    ],
)
def test_a_duration_of_zero_milliseconds_is_refused_like_zero(name: str, value: Any) -> None:
    with pytest.raises(ConfigurationError, match="at least 1 ms") as caught:
        settings_from_conf(conf(**{name: value}), environ={})
    assert caught.value.setting == name


def test_one_millisecond_is_accepted_and_zero_stays_allowed_where_it_was() -> None:
    s = settings_from_conf(
        conf(agboss_attempt_timeout=0.001, agboss_sweep_interval=0.0004, agboss_outbox_grace=0),
        environ={},
    )
    assert (s.attempt_timeout_ms, s.sweep_interval_ms, s.outbox_grace_ms) == (1, 0, 0)


@pytest.mark.parametrize("value", [["agboss.sweep"], 5, b"agboss.sweep", "   ", ""])
def test_a_sweep_queue_that_is_no_queue_name_is_refused(value: Any) -> None:
    with pytest.raises(ConfigurationError, match="agboss_sweep_queue must be a queue name"):
        settings_from_conf(conf(agboss_sweep_queue=value), environ={})


def test_a_sweep_queue_name_is_kept_and_unset_is_the_default() -> None:
    assert settings_from_conf(conf(agboss_sweep_queue="q.s"), environ={}).sweep_queue == "q.s"
    assert settings_from_conf(conf(), environ={}).sweep_queue == "agboss.sweep"


def _namespaced_app(namespace: str, **values: Any) -> Celery:
    """An app configured as Django does, every setting under ``namespace``."""
    base = {
        f"{namespace}_AGBOSS_DATABASE_URL": URL,
        f"{namespace}_AGBOSS_PSEUDONYM_KEY": KEY,
    }
    config = type(
        "Config", (), {k if namespace.isupper() else k.lower(): v for k, v in base.items()}
    )
    for key, value in values.items():
        setattr(config, key, value)
    app = Celery("namespaced", set_as_current=False)
    app.config_from_object(config, namespace=namespace)
    return app


@pytest.mark.parametrize(
    "key", ["CELERY_agboss_lease_ttl", "celery_agboss_lease_ttl", "Celery_Agboss_Lease_Ttl"]
)
def test_a_key_under_the_namespace_in_a_case_not_read_is_refused(key: str) -> None:
    """Under ``namespace="CELERY"`` only ``CELERY_AGBOSS_LEASE_TTL`` (and the plain
    ``agboss_lease_ttl`` / ``AGBOSS_LEASE_TTL``) is read: these kept the default (30 s)
    and were not refused either (the case was checked after the namespace only)."""
    app = _namespaced_app("CELERY", **{key: 12})
    with pytest.raises(
        ConfigurationError, match="did you mean 'CELERY_AGBOSS_LEASE_TTL'"
    ) as caught:
        settings_from_conf(app.conf, environ={})
    assert caught.value.setting == key


def test_under_a_lower_case_namespace_the_upper_case_key_is_refused_naming_the_lower() -> None:
    app = _namespaced_app("celery", CELERY_AGBOSS_LEASE_TTL=12)
    with pytest.raises(ConfigurationError, match="did you mean 'celery_agboss_lease_ttl'"):
        settings_from_conf(app.conf, environ={})
    read = _namespaced_app("celery", celery_agboss_lease_ttl=12)
    assert settings_from_conf(read.conf, environ={}).lease_ttl_seconds == 12


@pytest.mark.parametrize("key", ["CELERY_AGBOSS_LEASE_TTL", "agboss_lease_ttl", "AGBOSS_LEASE_TTL"])
def test_the_spellings_read_under_the_namespace_still_work(key: str) -> None:
    app = _namespaced_app("CELERY", **{key: 12})
    assert settings_from_conf(app.conf, environ={}).lease_ttl_seconds == 12
