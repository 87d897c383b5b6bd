"""``python manage.py migrate`` records this version's retention-rules generation, as
``agboss migrate`` does, on both stores (design: retention).

The app's migrations upgrade the store only in a Django migration not applied yet, and a
version that raises ``RETENTION_RULES_GENERATION`` without a store revision ships none:
its deploy recorded nothing, and an older beat's sweep went on deleting by older keep
rules (a cancelled scheduled charge's row deleted; its message then charged the customer
at the ETA, counted at the gateway in
``tests/operations/test_retention_on_a_newer_store.py``). The newer version is
stood for by this code with the generation raised to 3 in the ``manage.py migrate``
process.
"""

from __future__ import annotations

from celery_agboss.store.databases import create_store_engine
from celery_agboss.store.migrate import RETENTION_GENERATION_KEY, newer_than_this_code
from celery_agboss.store.retention import RETENTION_RULES_GENERATION
from tests.django import test_django_migrations
from tests.django.test_django_migrations import DatabaseFactory
from tests.support.django_project import manage, python, store_state

new_database = test_django_migrations.new_database

MIGRATE_AS_A_NEWER_VERSION = """
import django
django.setup()
import celery_agboss.store.migrate as m, celery_agboss.store.retention as r
m.RETENTION_RULES_GENERATION = r.RETENTION_RULES_GENERATION = 3
from django.core.management import call_command
call_command("migrate", verbosity=0)
"""

READ = "SELECT value FROM agboss_meta WHERE key = :key"


def test_a_deploy_of_newer_keep_rules_records_their_generation_and_stops_older_sweeps(
    new_database: DatabaseFactory,
) -> None:
    url, database = new_database()
    first = manage(database, "migrate")
    assert first.returncode == 0, first.stderr[-3000:]
    assert store_state(url, READ, key=RETENTION_GENERATION_KEY) == (
        str(RETENTION_RULES_GENERATION),
    )

    newer = python(database, MIGRATE_AS_A_NEWER_VERSION)  # no Django migration to apply

    assert newer.returncode == 0, newer.stderr[-3000:]
    assert store_state(url, READ, key=RETENTION_GENERATION_KEY) == ("3",)
    engine = create_store_engine(url)
    try:
        assert newer_than_this_code(engine) == {
            "reason": "rules-newer",
            "generation": 3,
            "ours": RETENTION_RULES_GENERATION,
        }
    finally:
        engine.dispose()


def test_an_older_versions_manage_py_migrate_never_lowers_it(
    new_database: DatabaseFactory,
) -> None:
    url, database = new_database()
    newer = python(database, MIGRATE_AS_A_NEWER_VERSION)
    assert newer.returncode == 0, newer.stderr[-3000:]

    older = manage(database, "migrate")

    assert older.returncode == 0, older.stderr[-3000:]
    assert store_state(url, READ, key=RETENTION_GENERATION_KEY) == ("3",)
