"""A Django project's worker pays from the store in its own ``DATABASES``.

Issue 27, as a Django shop deploys it: ``manage.py migrate`` makes the
tables, ``celery -A proj worker`` runs with the app Celery's Django guide writes (its
settings read with ``namespace="CELERY"``, no ``agboss_database_url``), and a process
of the project publishes the charge. The order is charged once, counted at the
gateway, and its execution completes in the project's database, on SQLite and on
PostgreSQL. Deployment speed-ups (tests/support/django_shop): ``-Q`` the test's queue,
a 5 s lease, a 1 s retry delay, a 1 s sweep loop
(``agboss sweep --loop``, a deployment without beat).
"""

from __future__ import annotations

import pytest

from tests.support.django_harness import DjangoShop

pytestmark = [pytest.mark.worker, pytest.mark.redis, pytest.mark.slow]


def test_the_worker_of_a_django_project_charges_once_from_its_database(
    django_shop: DjangoShop,
) -> None:
    django_shop.start()
    task_id = django_shop.publish("charge_order", "7", 1500)
    django_shop.wait_state(task_id, "COMPLETED")
    assert [c.reference for c in django_shop.gateway.charges_seen] == ["7"]
