"""A worker says so when its store is behind this version's schema, naming the command.

Issue 27 asks the worker to check the schema version at start (a Django project
upgraded the package but did not run ``manage.py migrate``): the worker's store check
(``worker.store_check``) finds the store answering at an older revision and says what
to run (``agboss migrate``, or ``python manage.py migrate`` when the store is a Django
alias), until the store is upgraded.
"""

from __future__ import annotations

from pathlib import Path

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
