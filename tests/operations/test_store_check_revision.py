"""A worker says so when its store is behind this version's schema, naming the command.

Issue 27 asks the worker to check the schema version at start (a Django project
upgraded the package but did not run ``manage.py migrate``): the worker's store check
(``worker.store_check``) finds the store answering at an older revision and says what
to run (``agboss migrate``, or ``python manage.py migrate`` when the store is a Django
alias), until the store is upgraded.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import text

from celery_agboss import AGBoss
from celery_agboss.store.migrate import head_revision, migrate
from celery_agboss.testing.celery_app import make_test_app
from celery_agboss.worker.store_check import SchemaBehind, _hint, probe


def test_a_store_behind_the_schema_is_named_with_the_command_that_upgrades_it(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    migrate(url, "0006")
    runtime = AGBoss(make_test_app(url))
    try:
        behind = probe(runtime)
        assert isinstance(behind, SchemaBehind), behind
        assert (behind.revision, behind.head) == ("0006", head_revision())
        assert "agboss migrate" in _hint(runtime, behind)
        migrate(url)
        assert probe(runtime) is None
    finally:
        runtime.close()


def test_a_store_a_newer_version_migrated_is_not_told_to_migrate(tmp_path: Path) -> None:
    """Rolled-back code beside a store a newer release upgraded: ``agboss migrate`` would
    fail on a revision it does not know, so the worker says what is wrong instead."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    migrate(url)
    runtime = AGBoss(make_test_app(url))
    try:
        with runtime.store.engine.begin() as conn:
            conn.execute(text("UPDATE agboss_alembic_version SET version_num = '9999'"))
        ahead = probe(runtime)
        assert isinstance(ahead, SchemaBehind) and ahead.ahead, ahead
        assert "newer version of celery_agboss migrated it" in str(ahead)
        assert "agboss migrate" not in _hint(runtime, ahead)
    finally:
        runtime.close()
