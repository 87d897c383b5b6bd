"""The ``agboss_*`` settings: read once into a frozen object, refused with what to set."""

from __future__ import annotations

import dataclasses
import logging
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery

from celery_agboss import AGBoss, ConfigurationError
from celery_agboss.core.keys import business_key_handle, fingerprint
from celery_agboss.core.protections import PSEUDONYM_KEY_WHITESPACE_ACCEPTED
from celery_agboss.runtime.known_settings import TESTING_ENV
from celery_agboss.runtime.settings import (
    TESTING_PSEUDONYM_KEY,
    AGBossSettings,
    redact_url,
    settings_from_conf,
)
from celery_agboss.testing import sabotage

URL = "sqlite:////var/lib/shop/agboss.db"
KEY = "a-pseudonym-key-of-enough-bytes"


def conf(**values: Any) -> dict[str, Any]:
    return {"agboss_database_url": URL, "agboss_pseudonym_key": KEY, **values}


def test_the_defaults_are_the_documented_ones() -> None:
    s = settings_from_conf(conf(), environ={})
    assert (s.tenant, s.lease_ttl_seconds, s.attempt_timeout_seconds) == (None, 30, 120)
    assert (s.sweep_interval_seconds, s.requested_grace_seconds) == (30, 300)
    assert s.outbound_retention_seconds == s.fenced_effect_retention_seconds == 604800
    assert s.max_recovery_attempts == 10
    assert s.pseudonym_key == KEY.encode()
    assert s.lease_ttl_ms == 30_000


def test_durations_accept_seconds_or_a_timedelta() -> None:
    s = settings_from_conf(
        conf(agboss_lease_ttl=timedelta(seconds=12), agboss_attempt_timeout=45.5), environ={}
    )
    assert (s.lease_ttl_seconds, s.attempt_timeout_seconds) == (12.0, 45.5)


def test_the_settings_are_frozen_and_never_show_the_key() -> None:
    s = settings_from_conf(conf(), environ={})
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.lease_ttl_seconds = 1  # type: ignore[misc]
    assert KEY not in repr(s)


def test_a_missing_database_url_is_refused_naming_the_setting() -> None:
    with pytest.raises(ConfigurationError, match="agboss_database_url is not set"):
        settings_from_conf({"agboss_pseudonym_key": KEY}, environ={})


def test_a_relative_sqlite_path_is_refused_with_the_absolute_one_to_set() -> None:
    with pytest.raises(ConfigurationError, match="relative") as caught:
        settings_from_conf(conf(agboss_database_url="sqlite:///agboss.db"), environ={})
    assert "absolute path" in str(caught.value)
    assert caught.value.setting == "agboss_database_url"


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:", "mysql://h/db"])
def test_a_store_every_worker_cannot_share_is_refused(url: str) -> None:
    with pytest.raises(ConfigurationError, match="agboss_database_url"):
        settings_from_conf(conf(agboss_database_url=url), environ={})


def test_a_missing_pseudonym_key_is_refused_outside_the_tests() -> None:
    with pytest.raises(ConfigurationError, match="agboss_pseudonym_key is not set"):
        settings_from_conf({"agboss_database_url": URL}, environ={})


def test_under_the_test_kit_a_fixed_key_is_used_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="celery_agboss"):
        s = settings_from_conf({"agboss_database_url": URL}, environ={TESTING_ENV: "1"})
    assert s.pseudonym_key == TESTING_PSEUDONYM_KEY and s.testing_key
    assert "fixed test key" in caplog.text


def test_a_short_pseudonym_key_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="needs at least 16 random bytes"):
        settings_from_conf(conf(agboss_pseudonym_key="short"), environ={})


SECRET_FILE_KEYS = [KEY + "\n", (KEY + "\n").encode(), " " + KEY, KEY + "\r\n", "\t" + KEY]


@pytest.mark.parametrize("value", SECRET_FILE_KEYS)
def test_a_pseudonym_key_with_surrounding_whitespace_in_the_conf_is_refused(value: Any) -> None:
    """A key read from a secrets file keeps its trailing newline: one worker with it
    would compute other fingerprints and handles than the others (design: A8)."""
    with pytest.raises(ConfigurationError, match="whitespace") as caught:
        settings_from_conf(conf(agboss_pseudonym_key=value), environ={})
    assert caught.value.setting == "agboss_pseudonym_key"


def test_a_pseudonym_key_with_a_trailing_newline_in_the_environment_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="whitespace"):
        settings_from_conf(
            {"agboss_database_url": URL}, environ={"AGBOSS_PSEUDONYM_KEY": KEY + "\n"}
        )


def test_a_random_binary_key_may_begin_or_end_with_any_byte() -> None:
    """Whitespace is refused around a key that is text; random bytes are not text."""
    binary = b"\n\xff\xfe" + bytes(range(128, 160)) + b" "
    assert settings_from_conf(conf(agboss_pseudonym_key=binary), environ={}).pseudonym_key == (
        binary
    )


def test_without_the_whitespace_check_a_worker_with_a_newline_computes_other_digests() -> None:
    """The twin: accepted, the key with its newline gives the same request another
    fingerprint and the same order another handle, so a replay on that worker would be
    refused as a conflict and a record shared by business key would not be found."""
    with sabotage(PSEUDONYM_KEY_WHITESPACE_ACCEPTED):
        from_file = settings_from_conf(conf(agboss_pseudonym_key=KEY + "\n"), environ={})
    clean = settings_from_conf(conf(), environ={})
    request = {"amount": 1000, "order": "42"}
    assert fingerprint(from_file.pseudonym_key, request) != fingerprint(
        clean.pseudonym_key, request
    )
    assert business_key_handle(from_file.pseudonym_key, "order:42") != business_key_handle(
        clean.pseudonym_key, "order:42"
    )


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("agboss_lease_ttl", -1),
        ("agboss_lease_ttl", 0),
        ("agboss_attempt_timeout", "soon"),
        # NaN passes every comparison (< 0, == 0, < 3) and infinity overflows to_ms: a
        # worker with either started, then crashed inside every delivery that waited.
        ("agboss_lease_ttl", float("nan")),
        ("agboss_retry_delay", float("nan")),
        ("agboss_attempt_timeout", float("inf")),
        ("agboss_outbound_retention", "inf"),
    ],
)
def test_a_wrong_duration_is_refused_naming_the_setting(name: str, value: Any) -> None:
    with pytest.raises(ConfigurationError) as caught:
        settings_from_conf(conf(**{name: value}), environ={})
    assert caught.value.setting == name


def test_a_duration_from_the_environment_that_is_not_finite_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="finite") as caught:
        settings_from_conf(conf(), environ={"AGBOSS_LEASE_TTL": "nan"})
    assert caught.value.setting == "agboss_lease_ttl"


@pytest.mark.parametrize("value", [0, -5, float("nan"), "soon"])
def test_a_broker_visibility_timeout_that_is_no_duration_is_refused(value: Any) -> None:
    with pytest.raises(ConfigurationError, match="visibility_timeout") as caught:
        settings_from_conf(conf(broker_transport_options={"visibility_timeout": value}), environ={})
    assert caught.value.setting == "broker_transport_options"


def test_a_sweep_interval_of_zero_means_no_beat_entry_and_is_allowed() -> None:
    assert settings_from_conf(conf(agboss_sweep_interval=0), environ={}).sweep_interval_seconds == 0


def test_a_misspelt_setting_is_refused_not_ignored() -> None:
    with pytest.raises(ConfigurationError, match="agboss_lease_tll"):
        settings_from_conf(conf(agboss_lease_tll=5), environ={})


@pytest.mark.parametrize(
    ("key", "meant"),
    [
        ("agboss_lease_tll", "agboss_lease_ttl"),
        ("agboss_sweep_intervall", "agboss_sweep_interval"),
        ("agboss_pseudonymkey", "agboss_pseudonym_key"),
        ("CELERY_AGBOSS_RETRY_DELAI", "CELERY_AGBOSS_RETRY_DELAY"),
    ],
)
def test_a_misspelt_setting_is_told_which_setting_it_probably_meant(key: str, meant: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        settings_from_conf(conf(**{key: 5}), environ={})
    assert f"{key!r} (did you mean {meant!r}?)" in str(caught.value)


def test_a_setting_like_no_other_gets_no_guess() -> None:
    with pytest.raises(ConfigurationError) as caught:
        settings_from_conf(conf(agboss_colour="blue"), environ={})
    assert "did you mean" not in str(caught.value) and "agboss_lease_ttl" in str(caught.value)


def test_a_misspelt_environment_variable_is_named_with_the_one_it_probably_meant(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Warned, not refused: the environment holds other programs' AGBOSS_ variables."""
    environ = {"AGBOSS_LEASE_TLL": "10", "AGBOSS_TEST_REDIS_URL": "redis://", "AGBOSS_X": "1"}
    with caplog.at_level(logging.WARNING, logger="celery_agboss"):
        s = settings_from_conf(conf(), environ=environ)
    assert s.lease_ttl_seconds == 30
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "did you mean AGBOSS_LEASE_TTL?" in warnings[0], warnings


def test_the_broker_countdown_stays_below_half_the_visibility_timeout() -> None:
    s = settings_from_conf(conf(broker_transport_options={"visibility_timeout": 40}), environ={})
    assert s.visibility_timeout_seconds == 40 and s.max_broker_countdown_seconds == 20
    declared = settings_from_conf(conf(agboss_visibility_timeout=10), environ={})
    assert declared.max_broker_countdown_seconds == 5


def test_the_logged_store_url_hides_its_password() -> None:
    s = settings_from_conf(
        conf(agboss_database_url="postgresql+psycopg://shop:secret@db/shop"), environ={}
    )
    assert "secret" not in s.redacted_database_url()
    assert "shop" in s.redacted_database_url()


@pytest.mark.parametrize("key", ["password", "sslpassword", "PASSWORD"])
def test_the_logged_store_url_hides_a_password_given_in_its_query(key: str) -> None:
    """libpq takes ``?password=``: the store URL logged at start must not show it."""
    url = f"postgresql+psycopg://shop@db.internal/shop?sslmode=require&{key}=s3cret-pw"
    shown = redact_url(url)
    assert "s3cret-pw" not in shown
    assert "db.internal/shop" in shown and "sslmode=require" in shown


# --- AGBoss(app) reads them -------------------------------------------------------------


def new_app(apps: list[Celery], **values: Any) -> Celery:
    app = Celery(f"settings-{len(apps)}", broker="memory://", set_as_current=False)
    app.conf.update(values)
    apps.append(app)
    return app


def test_agboss_twice_on_one_app_is_the_same_object(apps: list[Celery]) -> None:
    app = new_app(apps, **conf())
    assert AGBoss(app) is AGBoss(app)
    assert AGBoss.of(app) is AGBoss(app)


def test_agboss_reads_the_settings_from_a_pending_configuration(apps: list[Celery]) -> None:
    """Django's way: ``config_from_object`` is lazy; AGBoss reads once it is loaded."""
    app = new_app(apps)
    app.config_from_object(
        {
            "CELERY_AGBOSS_DATABASE_URL": URL,
            "CELERY_AGBOSS_PSEUDONYM_KEY": KEY,
            "CELERY_AGBOSS_LEASE_TTL": 7,
        },
        namespace="CELERY",
    )
    agboss = AGBoss(app)
    assert app.conf.broker_url  # configured (by now at the latest)
    assert isinstance(agboss.settings, AGBossSettings)
    assert agboss.settings.lease_ttl_seconds == 7


def test_agboss_on_an_already_configured_app_reads_them_at_once(apps: list[Celery]) -> None:
    app = new_app(apps, **conf(agboss_lease_ttl=9))
    assert app.conf.agboss_lease_ttl == 9
    assert AGBoss(app).settings.lease_ttl_seconds == 9


def test_agboss_refuses_a_missing_database_url_when_it_is_first_needed(
    apps: list[Celery],
) -> None:
    app = new_app(apps, agboss_pseudonym_key=KEY)
    with pytest.raises(ConfigurationError, match="agboss_database_url"):
        AGBoss(app).settings  # noqa: B018


def test_a_worker_of_a_misconfigured_app_refuses_to_start(apps: list[Celery]) -> None:
    from celery import signals

    app = new_app(apps, agboss_pseudonym_key=KEY)
    AGBoss(app)

    class FakeWorker:
        pass

    worker = FakeWorker()
    worker.app = app  # type: ignore[attr-defined]
    with pytest.raises(SystemExit, match="agboss_database_url"):
        signals.worker_init.send(sender=worker)


def test_the_sweep_gets_a_beat_entry_on_its_own_queue_with_an_expiry(apps: list[Celery]) -> None:
    app = new_app(apps, **conf(agboss_sweep_interval=timedelta(seconds=20)))
    AGBoss(app)
    entry = app.conf.beat_schedule["celery_agboss.sweep"]
    assert entry["task"] == "celery_agboss.sweep"
    assert entry["schedule"] == 20
    assert entry["options"] == {"queue": "agboss.sweep", "expires": 20}
    assert "celery_agboss.sweep" in app.tasks


def test_no_beat_entry_when_the_sweep_interval_is_zero(apps: list[Celery]) -> None:
    app = new_app(apps, **conf(agboss_sweep_interval=0))
    AGBoss(app)
    assert "celery_agboss.sweep" not in (app.conf.beat_schedule or {})


# --- from the environment ----------------------------------------------------------------


def test_a_setting_the_conf_lacks_is_read_from_its_environment_variable() -> None:
    s = settings_from_conf(
        {"agboss_pseudonym_key": KEY},
        environ={
            "AGBOSS_DATABASE_URL": URL,
            "AGBOSS_LEASE_TTL": "10",
            "AGBOSS_SWEEP_INTERVAL": "0",
            "AGBOSS_MAX_RECOVERY_ATTEMPTS": "4",
            "AGBOSS_PAYMENT_TASKS": "shop.charge_*, shop.refund",
        },
    )
    assert s.database_url == URL and s.lease_ttl_seconds == 10.0
    assert s.sweep_interval_seconds == 0 and s.max_recovery_attempts == 4
    assert s.payment_tasks == ("shop.charge_*", "shop.refund")


def test_the_conf_wins_over_the_environment() -> None:
    s = settings_from_conf(conf(agboss_lease_ttl=20), environ={"AGBOSS_LEASE_TTL": "10"})
    assert s.lease_ttl_seconds == 20.0


def test_a_wrong_value_in_the_environment_is_refused_naming_the_variable() -> None:
    with pytest.raises(ConfigurationError, match="the environment variable AGBOSS_LEASE_TTL"):
        settings_from_conf(conf(), environ={"AGBOSS_LEASE_TTL": "ten seconds"})
    with pytest.raises(ConfigurationError, match="AGBOSS_MAX_RECOVERY_ATTEMPTS"):
        settings_from_conf(conf(), environ={"AGBOSS_MAX_RECOVERY_ATTEMPTS": "-1"})


def test_an_empty_environment_variable_is_unset() -> None:
    s = settings_from_conf(conf(), environ={"AGBOSS_LEASE_TTL": ""})
    assert s.lease_ttl_seconds == 30.0


def test_other_agboss_environment_variables_are_not_settings() -> None:
    s = settings_from_conf(conf(), environ={"AGBOSS_TEST_POSTGRES_URL": "x", "AGBOSS_TESTING": "0"})
    assert s.tenant is None


def test_terminal_executions_are_kept_as_long_as_the_longer_retention_unless_set() -> None:
    s = settings_from_conf(
        conf(agboss_outbound_retention=100, agboss_fenced_effect_retention=50), environ={}
    )
    assert s.terminal_execution_retention_seconds == 100
    s = settings_from_conf(conf(agboss_execution_retention=timedelta(days=1)), environ={})
    assert s.terminal_execution_retention_seconds == 86400


def test_payment_tasks_must_be_a_list_of_names() -> None:
    with pytest.raises(ConfigurationError, match="agboss_payment_tasks must be a list"):
        settings_from_conf(conf(agboss_payment_tasks=[1, 2]), environ={})


def test_agboss_tenant_is_checked_by_the_key_rules_when_the_app_is_configured() -> None:
    with pytest.raises(ConfigurationError) as caught:
        settings_from_conf(conf(agboss_tenant="shop\u200b"), environ={})
    assert caught.value.fields["setting"] == "agboss_tenant"
    assert settings_from_conf(conf(), environ={"AGBOSS_TENANT": "shop-eu"}).tenant == "shop-eu"
    assert settings_from_conf(conf(agboss_tenant=""), environ={}).tenant is None


def test_prepared_statements_are_on_unless_switched_off_in_conf_or_the_environment() -> None:
    assert settings_from_conf(conf(), environ={}).prepared_statements is True
    off = settings_from_conf(conf(agboss_prepared_statements=False), environ={})
    assert off.prepared_statements is False
    for text, expected in (("false", False), ("0", False), ("Off", False), ("yes", True)):
        read = settings_from_conf(conf(), environ={"AGBOSS_PREPARED_STATEMENTS": text})
        assert read.prepared_statements is expected, text


@pytest.mark.parametrize("value", ["maybe", 2, None.__class__])
def test_a_prepared_statements_value_that_is_no_yes_or_no_is_refused(value: Any) -> None:
    with pytest.raises(
        ConfigurationError, match="agboss_prepared_statements must be True or False"
    ):
        settings_from_conf(conf(agboss_prepared_statements=value), environ={})


def test_a_retention_shorter_than_the_visibility_timeout_is_warned_of() -> None:
    """A Redis redelivery after the execution's records went would run it afresh."""
    assert settings_from_conf(conf(), environ={}).retention_warning() is None
    short = conf(agboss_execution_retention=600, agboss_visibility_timeout=3600)
    warning = settings_from_conf(short, environ={}).retention_warning() or ""
    assert "600 s is shorter than the broker's visibility timeout (3600 s)" in warning
