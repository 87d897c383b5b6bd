"""Every default is written once: the settings' fields, the conf reader, the engine's own
settings and the documented defaults all say the same."""

from __future__ import annotations

from pathlib import Path

from celery_agboss.core.engine_settings import (
    DEFAULT_ATTEMPT_TIMEOUT_MS,
    DEFAULT_LEASE_TTL_MS,
    DEFAULT_TENANT,
    EngineSettings,
)
from celery_agboss.runtime.known_settings import (
    DEFAULT_MAX_RECOVERY_ATTEMPTS,
    DEFAULT_METRICS_ADDRESS,
    DEFAULT_RETRY_DELAY_SECONDS,
    DEFAULT_SWEEP_QUEUE,
    DURATION_DEFAULTS,
    KNOWN_SETTINGS,
    PREFIX,
)
from celery_agboss.runtime.settings import AGBossSettings, settings_from_conf

DOCS = Path(__file__).resolve().parents[2] / "docs"
URL = "sqlite:////var/lib/shop/agboss.db"
KEY = "a-pseudonym-key-of-enough-bytes"


def test_a_conf_that_sets_nothing_reads_the_fields_defaults() -> None:
    read = settings_from_conf({"agboss_database_url": URL, "agboss_pseudonym_key": KEY}, {})
    assert read == AGBossSettings(database_url=URL, pseudonym_key=KEY.encode())


def test_the_engine_defaults_are_the_settings_defaults() -> None:
    settings = AGBossSettings(database_url=URL, pseudonym_key=KEY.encode())
    engine = EngineSettings(pseudonym_key=KEY.encode())
    # The app's tenant defaults to its store's deployment id (docs/keys.md); an engine
    # built by hand, as tests build theirs, says "default", the id of a store in use.
    assert settings.tenant is None
    assert engine.tenant == DEFAULT_TENANT
    assert engine.lease_ttl_ms == settings.lease_ttl_ms == DEFAULT_LEASE_TTL_MS
    assert engine.attempt_timeout_ms == round(settings.attempt_timeout_seconds * 1000)
    assert engine.attempt_timeout_ms == DEFAULT_ATTEMPT_TIMEOUT_MS


def test_the_documented_defaults_are_the_constants() -> None:
    api = (DOCS / "api.md").read_text(encoding="utf-8")
    assert f"| `agboss_lease_ttl` | {DEFAULT_LEASE_TTL_MS // 1000} | seconds" in api
    assert f"| `agboss_attempt_timeout` | {DEFAULT_ATTEMPT_TIMEOUT_MS // 1000} | seconds" in api
    assert f"| `agboss_retry_delay` | {DEFAULT_RETRY_DELAY_SECONDS:g} | seconds |" in api
    assert f'| `agboss_sweep_queue` | `"{DEFAULT_SWEEP_QUEUE}"` |' in api
    leases = " ".join((DOCS / "leases.md").read_text(encoding="utf-8").split())
    assert f"(`agboss_lease_ttl`, default {DEFAULT_LEASE_TTL_MS // 1000} s)" in leases
    assert f"`attempt_timeout` (default {DEFAULT_ATTEMPT_TIMEOUT_MS // 1000} s)" in leases


def _settings_table() -> dict[str, tuple[str, str]]:
    """docs/api.md's Settings table: setting -> (default, unit), as written."""
    api = (DOCS / "api.md").read_text(encoding="utf-8")
    section = api.split("\n## Settings\n", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, tuple[str, str]] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`agboss_"):
            rows[cells[0].strip("`")] = (cells[1], cells[2])
    return rows


def test_the_settings_table_lists_every_setting_with_its_default_and_unit() -> None:
    """Users have docs/api.md, not the design: every ``agboss_*`` key the package reads is
    a row, with a default and a unit; no row names a key the package refuses."""
    table = _settings_table()
    known = {PREFIX + name for name in KNOWN_SETTINGS}
    assert set(table) == known, (
        f"missing from docs/api.md: {sorted(known - set(table))}; "
        f"not settings: {sorted(set(table) - known)}"
    )
    for name, (default, unit) in table.items():
        assert default and unit, f"{name} needs a default and a unit"


def test_the_settings_tables_durations_are_the_constants() -> None:
    table = _settings_table()
    for name, seconds in DURATION_DEFAULTS.items():
        default, unit = table[PREFIX + name]
        assert default.split()[0] == f"{seconds:g}", f"{name}: {default} is not {seconds:g}"
        assert unit.startswith("seconds"), f"{name}: {unit}"
    assert table["agboss_max_recovery_attempts"][0] == str(DEFAULT_MAX_RECOVERY_ATTEMPTS)
    assert table["agboss_tenant"][0].startswith("the store's deployment id")
    assert table["agboss_metrics_address"][0] == f'`"{DEFAULT_METRICS_ADDRESS}"`'
